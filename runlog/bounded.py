"""Reads bounded in time: each log is checked in a child process before it is read here, so a corrupted file cannot
hang or crash the caller.

HDF5's C library can loop forever on corrupted metadata (e.g. random bytes in an object header, or a bad checksum an
SWMR reader retries) inside a call that no signal interrupts; a child process with a timeout per file can always be
killed. :func:`check_logs` reads every file completely (attributes and their digest, every dataset: Fletcher-32
checksums are verified on the way) in one child, file by file; a file that takes longer than ``timeout_s`` is
reported as hanging and the child is restarted for the rest. :func:`read_run` and :func:`read_log_id` check, then
read; a caller that checked many files at once with :func:`check_logs` passes ``timeout_s=None``.
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

from .format import RunLogError
from .reader import Run, read_log_id_unchecked, read_unchecked

__all__ = ["check_logs", "read_run", "read_log_id", "TIMEOUT_S"]

#: seconds one file may take to read completely before it counts as hanging
TIMEOUT_S = 5.0
_START_S = 30.0  # the child's start-up (numpy, h5py) on a loaded machine
_CHILD = "import sys; sys.path.insert(0, sys.argv.pop(1)); from runlog.bounded import _child; _child()"
_ROOT = str(Path(__file__).resolve().parent.parent)  # the folder holding the runlog package


def read_run(path: str | os.PathLike, *, timeout_s: float | None = TIMEOUT_S, swmr: bool = True) -> Run:
    """Read a run log, also while its writer is still appending (SWMR read): the complete records only (every
    field truncated to ``len(step)``).

    The file is first read completely in a child process that is killed after ``timeout_s`` seconds (about 0.2 s
    more per call); ``timeout_s=None`` reads in this process only, for a file :func:`check_logs` has just passed.

    Raises:
        FileNotFoundError: `path` does not exist.
        RunLogError: not an HDF5 file, corrupt (a chunk or the attributes fail their checksum) or truncated, not a
            run log, or its reading did not finish within ``timeout_s``.
    """
    _check(path, timeout_s)
    return read_unchecked(path, swmr=swmr)


def read_log_id(path: str | os.PathLike, *, timeout_s: float | None = TIMEOUT_S) -> str | None:
    """The ``log_id`` of the run log at ``path`` (None for a log from before ids), checked as :func:`read_run`.

    Raises:
        FileNotFoundError: `path` does not exist.
        RunLogError: as :func:`read_run`.
    """
    _check(path, timeout_s)
    return read_log_id_unchecked(path)


def _check(path: str | os.PathLike, timeout_s: float | None) -> None:
    if timeout_s is None:
        return
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such run log: {os.fspath(path)}")
    if why := check_logs([path], timeout_s)[os.fspath(path)]:
        raise RunLogError(why if why.startswith(os.fspath(path)) else f"{os.fspath(path)}: {why}")


def check_logs(paths: Sequence[str | os.PathLike], timeout_s: float = TIMEOUT_S) -> dict[str, str | None]:
    """``{path: None}`` for run logs that read completely, ``{path: why}`` for the others (corrupt, truncated,
    not a run log, or hanging for more than ``timeout_s`` seconds)."""
    todo = [os.fspath(p) for p in paths]
    result: dict[str, str | None] = {}
    while todo:
        child = subprocess.Popen([sys.executable, "-c", _CHILD, _ROOT, *todo],
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
    print(json.dumps({"ready": True}), flush=True)
    for path in sys.argv[1:]:
        error = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                read_unchecked(path)
        except (RunLogError, OSError, RuntimeError, ValueError, KeyError, TypeError, AttributeError,
                IndexError) as err:
            error = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(json.dumps({"path": path, "error": error}), flush=True)
