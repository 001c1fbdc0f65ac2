"""One writer per run folder: a lock that a second process sees and refuses, and that dies with its holder.

``RUN_DIR/.lock`` is locked with ``flock`` for as long as a run writes into the folder (the kernel releases it when
the process dies, even by SIGKILL, so a dead holder never blocks a re-run) and holds the holder's host, pid, boot
id, start time and a heartbeat refreshed every :data:`HEARTBEAT_S` seconds. A second process on the same folder
gets :class:`RunFolderBusy` naming the holder.

Shared file systems: NFS may not pass ``flock`` between hosts. The heartbeat covers that case: a lock file written
by another host whose heartbeat is younger than :data:`STALE_S` is refused as held even when ``flock`` succeeds.
HDF5's own file locking and SWMR need POSIX semantics too; on NFS keep one run folder per process (the grid
runner does) and read live logs on the writer's host.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from .errors import RunFolderBusy, RunWriteError

__all__ = ["RunFolderBusy", "run_lock", "HEARTBEAT_S", "STALE_S", "LOCK_NAME"]

LOCK_NAME = ".lock"
HEARTBEAT_S = 30.0
STALE_S = 120.0


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _describe(info: dict) -> str:
    age = time.time() - float(info.get("heartbeat", 0))
    return (f"pid {info.get('pid')} on {info.get('host')} (started {info.get('started', '?')}, last heartbeat "
            f"{age:.0f} s ago)")


#: the lock file's JSON is padded with spaces to at least this many bytes, so that a rewrite (the heartbeat) replaces
#: it in one write of one page and a reader never sees it empty or cut (truncating first left it empty meanwhile)
LOCK_BYTES = 1024


def _write(fd: int, info: dict) -> None:
    data = json.dumps(info).encode().ljust(LOCK_BYTES)
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))  # (only a longer earlier record leaves bytes to cut: the file is never empty)


@contextlib.contextmanager
def run_lock(folder: str | os.PathLike) -> Iterator[None]:
    """Hold ``folder``'s run lock for the ``with`` block; :class:`RunFolderBusy` if another process holds it."""
    path = Path(folder) / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderBusy(f"run folder {folder} is in use by {_describe_holder(fd)}; wait for that run or "
                                "stop it (its lock goes with it)") from None
        held = _read(fd)
        host = socket.gethostname()
        if held.get("host") not in (None, host) and not held.get("released") \
                and time.time() - float(held.get("heartbeat", 0)) < STALE_S:
            raise RunFolderBusy(f"run folder {folder} is in use by {_describe(held)} (another host on a shared file "
                                f"system; its lock counts as stale after {STALE_S:.0f} s without a heartbeat)")
        info = {"host": host, "pid": os.getpid(), "boot_id": _boot_id(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "heartbeat": time.time()}
        try:
            _write(fd, info)
        except OSError as err:
            raise RunWriteError(f"{path}: cannot write the run lock ({err.strerror or err}); the disk may be full or "
                                "failing") from None
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(HEARTBEAT_S):
                with contextlib.suppress(OSError):
                    _write(fd, {**info, "heartbeat": time.time()})

        thread = threading.Thread(target=beat, daemon=True, name="run-lock-heartbeat")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            with contextlib.suppress(OSError):
                _write(fd, {**info, "heartbeat": time.time(), "released": True})
    finally:
        os.close(fd)  # releases the flock


#: how long a refused process waits for the holder's record: a holder that has just taken the lock writes it next
HOLDER_WAIT_S = 2.0


def _describe_holder(fd: int) -> str:
    """The lock holder, once it has written its record (an empty or released record is the moment between)."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while True:
        info = _read(fd)
        if info.get("pid") is not None and not info.get("released"):
            return _describe(info)
        if time.monotonic() > deadline:
            return "another process (it has not written its pid yet)"
        time.sleep(0.02)


def _read(fd: int) -> dict:
    try:
        data = os.pread(fd, 4096, 0)
        info = json.loads(data) if data else {}
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}
