"""Write a run log record by record; used by tests/test_runlog.py in a subprocess.

Usage: python tests/_runlog_writer.py PATH N_RECORDS SLEEP_S

``left_open_with_a_bad_header(path)`` makes the log HDF5 retries longest: left open by a killed writer (only SWMR
mode opens it), with a bad root object header checksum.

Appends records at steps 0..N_RECORDS-1 (probe "weights": field "matrix" (32, 32) filled
with the step, field "loss" = step / 2; scalar "reward" = step) and prints the step to
stdout after each record is flushed, sleeping SLEEP_S seconds between records.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runlog import Field, RunLog  # noqa: E402

PROBES = {"weights": {"matrix": Field((32, 32)), "loss": Field(())}}


def main(path: str, n_records: int, sleep_s: float) -> None:
    with RunLog(path, config={"writer": "subprocess"}, seed=7, probes=PROBES,
                scalars=["reward"]) as log:
        for step in range(n_records):
            log.append("weights", step, matrix=np.full((32, 32), step), loss=step / 2)
            log.scalar("reward", step, float(step))
            print(step, flush=True)
            time.sleep(sleep_s)


def left_open_with_a_bad_header(path: str | os.PathLike) -> None:
    """A new run log at ``path`` (replacing any file there) whose writer died with it open (its superblock marks it
    open for write), with one byte of the root group's object header flipped (its checksum fails: HDF5's SWMR
    reader retries for minutes)."""
    code = ("import os, sys; from runlog import RunLog; "
            "log = RunLog(sys.argv[1], config={}, seed=0, probes={}, overwrite=True); os._exit(0)")
    subprocess.run([sys.executable, "-c", code, os.fspath(path)], check=True,
                   cwd=Path(__file__).resolve().parents[1])
    data = bytearray(Path(path).read_bytes())
    offsets = data[9]  # superblock v2/3: signature, version, size of offsets, size of lengths, flags, 4 addresses
    root = int.from_bytes(data[12 + 3 * offsets: 12 + 4 * offsets], "little")
    assert data[root:root + 4] == b"OHDR", "the root group's object header is not where the superblock says"
    data[root + 8] ^= 0xFF
    Path(path).write_bytes(bytes(data))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
