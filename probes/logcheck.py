"""Check run logs in a child process before reading them here: a corrupted file cannot hang or crash the caller.

HDF5's C library can loop forever on corrupted metadata (e.g. random bytes in an object header) inside a call that
no signal interrupts; a child process with a timeout per file can always be killed. :func:`check_logs` reads every
file completely (attributes, every dataset: Fletcher-32 checksums are verified on the way) in one child, file by
file; a file that takes longer than ``timeout_s`` is reported as hanging and the child is restarted for the rest.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

__all__ = ["check_logs", "TIMEOUT_S"]

#: seconds one file may take to read completely before it counts as hanging
TIMEOUT_S = 5.0
_START_S = 30.0  # the child's start-up (numpy, h5py) on a loaded machine
# the child imports probes.runlog without running probes/__init__ (which imports torch: seconds per restart)
_CHILD = ("import sys, types; pkg = types.ModuleType('probes'); pkg.__path__ = [sys.argv.pop(1)]; "
          "sys.modules['probes'] = pkg; from probes.logcheck import _child; _child()")
_PACKAGE = str(Path(__file__).resolve().parent)


def check_logs(paths: Sequence[str | os.PathLike], timeout_s: float = TIMEOUT_S) -> dict[str, str | None]:
    """``{path: None}`` for run logs that read completely, ``{path: why}`` for the others (corrupt, truncated,
    not a run log, or hanging for more than ``timeout_s`` seconds)."""
    todo = [os.fspath(p) for p in paths]
    result: dict[str, str | None] = {}
    while todo:
        child = subprocess.Popen([sys.executable, "-c", _CHILD, _PACKAGE, *todo],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        try:
            done = _collect(child, todo, timeout_s)
        finally:
            child.kill()
            child.wait()
        result.update(done)
        todo = todo[len(done):]
        if todo:  # the next file hung (or killed the child): refuse it and go on with the rest
            result[todo[0]] = (f"reading it did not finish within {timeout_s:g} s (corrupt HDF5 metadata can make "
                               "the HDF5 library loop)" if child.returncode in (-9, None) else
                               f"reading it crashed the reader (exit status {child.returncode})")
            todo = todo[1:]
    return result


def _collect(child: subprocess.Popen, expected: Sequence[str], each_s: float) -> dict[str, str | None]:
    """The child's results in order, until one takes longer than ``each_s`` or the child stops (its start-up, up
    to its ``ready`` line, may take :data:`_START_S`). Lines are read from the raw pipe with a buffer of our own,
    so that a result already received is never mistaken for a file still being read."""
    out: dict[str, str | None] = {}
    fd = child.stdout.fileno()
    buffer = b""
    limit = _START_S
    while len(out) < len(expected):
        deadline = time.monotonic() + limit
        while b"\n" not in buffer:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(fd, 65536) if ready else b""
            if not chunk:
                return out
            buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        item = json.loads(line)
        limit = each_s
        if "path" in item:
            out[item["path"]] = item["error"]
    return out


def _child() -> None:
    """Read each file named on the command line; print ``{"path", "error"}`` per file as one JSON line (``read_run``
    verifies checksums with a plain read, SWMR mode only for a file a writer has or left open)."""
    from .runlog import RunLogError, read_run

    print(json.dumps({"ready": True}), flush=True)
    for path in sys.argv[1:]:
        error = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                read_run(path)
        except (RunLogError, OSError, RuntimeError, ValueError, KeyError, TypeError, AttributeError,
                IndexError) as err:
            error = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(json.dumps({"path": path, "error": error}), flush=True)
