"""Opening a run log to append to it: repairing the file a killed writer left, trimming partial records,
keeping a checkpoint's records on a resume. POSIX only (``flock``)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Mapping

import h5py
import numpy as np

from .bounded import check_logs
from .format import LIBVER, OPEN_FOR_WRITE, UNWRITTEN_STEP, RunLogBusy, RunLogError, read_group
from .reader import open_read


def open_for_append(path: str) -> h5py.File:
    """Open an existing run log read-write, repairing it if its writer was killed. A log a writer has or left open
    is checked first in a child process (:func:`runlog.check_logs`): HDF5's SWMR reader, the only one that opens it,
    retries a bad metadata checksum for minutes."""
    try:
        open_read(path, swmr=False).close()
    except RunLogError as err:
        if isinstance(err.__cause__, BlockingIOError) or not any(text in str(err) for text in OPEN_FOR_WRITE):
            raise  # (a live writer outside SWMR mode holds it: said as such)
        if why := check_logs([path])[path]:
            raise RunLogError(f"{path}: left open by its writer and unreadable: {why}") from None
    try:
        return h5py.File(path, "r+", libver=LIBVER)
    except BlockingIOError as err:  # HDF5 could not lock the file
        raise RunLogBusy(f"{path}: in use by another process (a live writer or reader); "
                          f"cannot append to it: {err}") from err
    except OSError as err:
        # HDF5 marks files open for writing in the superblock; a killed writer leaves the mark.
        if "already open for write" not in str(err):
            raise RunLogError(f"{path}: cannot open for appending: {err}") from err
    repair(path)
    try:
        return h5py.File(path, "r+", libver=LIBVER)
    except OSError as err:
        raise RunLogError(f"{path}: cannot open for appending after repair: {err}") from err


def repair(path: str) -> None:
    """Replace the file of a dead writer by a clean copy (HDF5 keeps refusing write access
    to it otherwise). Refused while any other process has the file open."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if not try_flock(fd, fcntl.LOCK_EX):
            raise RunLogBusy(f"{path}: in use by another process (a live writer or reader); "
                              "cannot append to it")
        tmp = f"{path}.repair.tmp"
        try:
            # locking=False: HDF5 would otherwise fail to take a shared lock next to ours.
            with h5py.File(path, "r", libver="latest", swmr=True, locking=False) as src, \
                    h5py.File(tmp, "w", libver=LIBVER) as dst:
                dst.attrs.update(src.attrs)
                for name in src:
                    src.copy(src[name], dst, name)
            os.replace(tmp, path)
        except OSError as err:
            raise RunLogError(f"{path}: cannot repair the file left by a killed writer: {err}") from err
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    finally:
        os.close(fd)


def try_flock(fd: int, operation: int) -> bool:
    """Non-blocking flock; False if another open file holds a conflicting lock, True if
    locked or if the file system does not support locking."""
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        pass
    return True


def trim_partial_records(f: h5py.File) -> dict[tuple[str, str], int]:
    """Shrink every dataset to its group's ``len(step)``; return those record counts."""
    counts = {}
    for kind in ("probes", "scalars"):
        for name, group in f[kind].items():
            n = written(group["step"])
            truncate(group, n)
            counts[kind, name] = n
    return counts


def written(step: h5py.Dataset) -> int:
    """Complete records of a group: ``len(step)``, or for a pre-allocated one, the rows before the first unwritten."""
    if step.maxshape[0] is None:
        return len(step)
    unwritten = np.flatnonzero(step[()] == UNWRITTEN_STEP)
    return int(unwritten[0]) if len(unwritten) else len(step)


def truncate(group: h5py.Group, n: int) -> None:
    """Keep the first ``n`` records of every dataset of ``group`` (pre-allocated rows are reset to unwritten)."""
    for name, dataset in group.items():
        if dataset.maxshape[0] is None:
            if len(dataset) > n:
                dataset.resize(n, axis=0)
        elif n < len(dataset):
            dataset[n:] = UNWRITTEN_STEP if name == "step" else np.nan


def keep_records(f: h5py.File, path: str, counts: Mapping[tuple[str, str], int],
                  keep: Mapping[str, int]) -> dict[tuple[str, str], int]:
    """Shrink every group to its ``keep`` count (0 if not named); RunLogError if the file holds fewer complete
    records than a checkpoint says were written (records lost: the log and the checkpoint do not belong
    together)."""
    if unknown := sorted(set(keep) - {f"{kind}/{name}" for kind, name in counts}):
        raise RunLogError(f"{path}: the checkpoint names record groups the log does not have: {unknown}")
    kept = {}
    for (kind, name), n in counts.items():
        want = int(keep.get(f"{kind}/{name}", 0))
        group = f[kind][name]
        written = len(read_group(group, path)["step"]) if n else 0
        if written < want:
            raise RunLogError(f"{path}: {group.name} holds {written} complete records but the checkpoint was taken "
                              f"after {want}: the log lost records (or belongs to another run); cannot resume")
        truncate(group, want)
        kept[kind, name] = want
    return kept
