"""Write a run log record by record; used by tests/test_runlog.py in a subprocess.

Usage: python tests/_runlog_writer.py PATH N_RECORDS SLEEP_S

Appends records at steps 0..N_RECORDS-1 (probe "weights": field "matrix" (32, 32) filled
with the step, field "loss" = step / 2; scalar "reward" = step) and prints the step to
stdout after each record is flushed, sleeping SLEEP_S seconds between records.
"""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from probes.runlog import Field, RunLog  # noqa: E402

PROBES = {"weights": {"matrix": Field((32, 32)), "loss": Field(())}}


def main(path: str, n_records: int, sleep_s: float) -> None:
    with RunLog(path, config={"writer": "subprocess"}, seed=7, probes=PROBES,
                scalars=["reward"]) as log:
        for step in range(n_records):
            log.append("weights", step, matrix=np.full((32, 32), step), loss=step / 2)
            log.scalar("reward", step, float(step))
            print(step, flush=True)
            time.sleep(sleep_s)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
