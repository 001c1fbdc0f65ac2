"""Reading run logs in this process (no time bound: :mod:`runlog.bounded` checks a file in a child process
first)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import h5py
import numpy as np

from .format import OPEN_FOR_WRITE, RunLogError, attr_str, check_format, checked_attrs, read_group


@dataclass
class Run:
    """Content of one run log.

    Attributes:
        path: the file.
        config: the run's configuration, as given to :class:`RunLog`.
        seed: the run's seed, as given to :class:`RunLog`.
        attrs: all root attributes, JSON ones decoded (``provenance``, ``probe_settings``, ...).
        probes: ``{probe: {"step": int64 (n,), field: (n, *field.shape)}}``.
        scalars: ``{name: (steps int64 (n,), values float64 (n,))}``.
    """

    path: str
    config: dict
    seed: int
    attrs: dict
    probes: dict[str, dict[str, np.ndarray]]
    scalars: dict[str, tuple[np.ndarray, np.ndarray]]


def read_unchecked(path: str | os.PathLike, *, swmr: bool = True) -> Run:
    """Read a run log in this process, also while its writer is still appending (SWMR read); no time bound
    (:func:`runlog.read_run` checks the file in a child process first).

    Returns the complete records only: every field is truncated to ``len(step)``. A read that fails while the file
    changes (a live writer mid-write: a chunk being rewritten fails its checksum) is tried again, as an open is
    (:func:`open_read`).

    Raises:
        FileNotFoundError: `path` does not exist.
        RunLogError: not an HDF5 file, corrupt or truncated, or not a run log.
    """
    path = os.fspath(path)
    return _settled(path, lambda: _read_once(path, swmr))


def _read_once(path: str, swmr: bool) -> Run:
    with _open_read_once(path, swmr) as f:
        try:
            attrs = checked_attrs(f, path)
            probes = {}
            for name, group in f["probes"].items():
                probes[name] = read_group(group, path)
            scalars = {}
            for name, group in f["scalars"].items():
                columns = read_group(group, path)
                scalars[name] = (columns["step"], columns["value"])
            return Run(path=path, config=attrs["config"], seed=attrs["seed"], attrs=attrs,
                       probes=probes, scalars=scalars)
        except (OSError, KeyError, json.JSONDecodeError, TypeError, AttributeError, ValueError) as err:
            raise RunLogError(f"{path}: corrupt run log: {err!r}") from err


def read_log_id_unchecked(path: str | os.PathLike) -> str | None:
    """The ``log_id`` of the run log at ``path`` (None for a log from before ids), read without its records.

    Raises:
        FileNotFoundError: `path` does not exist.
        RunLogError: not an HDF5 file, corrupt or truncated, or not a run log.
    """
    path = os.fspath(path)
    with open_read(path) as f:
        return attr_str(checked_attrs(f, path).get("log_id"))


def find_runs(path_or_dir: str | os.PathLike) -> list[str]:
    """``[path]`` for a file, or all ``*.h5`` files under a directory (recursive, sorted)."""
    path = Path(path_or_dir)
    if path.is_dir():
        return sorted(str(p) for p in path.rglob("*.h5") if p.is_file())
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: {path}")
    return [str(path)]


#: a live writer can leave a log briefly unreadable (its superblock already names the end of data still being
#: written; a new log before its switch to SWMR mode): an open that fails while the file is changing is tried again
#: after this many seconds, up to _SETTLE_TRIES times; a file that fails and does not change is refused at once
_SETTLE_S = 0.05
_SETTLE_TRIES = 40


def open_read(path: str, swmr: bool = True) -> h5py.File:
    """Open a run log read-only; RunLogError unless it is one. A plain read first (it verifies checksums at once);
    with ``swmr``, a file an SWMR writer has open or left open (killed) is then opened in SWMR mode. A failure
    while the file changes (a live writer mid-write) is retried for up to two seconds."""
    return _settled(path, lambda: _open_read_once(path, swmr))


T = TypeVar("T")


def _settled(path: str, attempt: Callable[[], T]) -> T:
    """``attempt()``, tried again while it fails with RunLogError and the file at ``path`` changes meanwhile (a live
    writer), up to :data:`_SETTLE_TRIES` times; a failure on a file that does not change is raised at once."""
    for _ in range(_SETTLE_TRIES - 1):
        before = _state(path)
        try:
            return attempt()
        except RunLogError:
            time.sleep(_SETTLE_S)
            if _state(path) == before:
                raise
    return attempt()


def _state(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _open_read_once(path: str, swmr: bool) -> h5py.File:
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such run log: {path}")
    if not h5py.is_hdf5(path):
        raise RunLogError(f"{path}: not an HDF5 file (no HDF5 signature)")
    check_not_truncated(path)
    try:
        try:
            f = h5py.File(path, "r", libver="latest")
        except OSError as err:
            if not swmr or not any(text in str(err) for text in OPEN_FOR_WRITE):
                raise
            f = h5py.File(path, "r", libver="latest", swmr=True)
    except BlockingIOError as err:
        raise RunLogError(f"{path}: locked by another process writing it outside SWMR mode "
                          f"(e.g. a RunLog still creating it): {err}") from err
    except (OSError, RuntimeError) as err:  # (h5py raises RuntimeError for some corrupt superblocks)
        raise RunLogError(f"{path}: corrupt or truncated HDF5 file, cannot open it: {err}") from err
    try:
        check_format(f, path)
    except BaseException:
        f.close()
        raise
    return f


def check_not_truncated(path: str) -> None:
    """RunLogError if the file is shorter than the end-of-file address in its superblock.

    HDF5 skips this check for SWMR readers (the file may grow) and then reads missing
    bytes as zeros or retries for a long time, so it is done here. Only superblock
    versions 2 and 3 at offset 0 (the ones `RunLog` writes) are checked; the layout is
    signature (8 bytes), version, size of offsets O, size of lengths, flags, then the base,
    superblock-extension and end-of-file addresses (O bytes each, little-endian).
    """
    with open(path, "rb") as f:
        head = f.read(48)
        size = os.fstat(f.fileno()).st_size
    if head[:8] != b"\x89HDF\r\n\x1a\n" or len(head) < 12 or head[8] not in (2, 3):
        return
    offset_size = head[9]
    stored_eof = int.from_bytes(head[12 + 2 * offset_size: 12 + 3 * offset_size], "little")
    if size < stored_eof:
        raise RunLogError(f"{path}: corrupt or truncated HDF5 file: it has {size} bytes, "
                          f"its superblock says {stored_eof}")
