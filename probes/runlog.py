"""Crash-safe HDF5 run log: one file per training run, one writer, any number of readers.

This module is the only place that knows the file layout::

    /                       attrs: format='interference-runlog', format_version=2 (1 still read),
                                   config (JSON), seed, provenance (JSON), device,
                                   probe_settings (JSON), json_attrs (JSON list of the attrs
                                   stored as JSON), resumes (JSON, after a resume), log_id (a
                                   random hex id given at creation, kept by resumes; logs written
                                   before 2026-11-24 get one when first resumed), extra attrs
    /probes/<probe>/step    int64, shape (n,)            training step of each record
    /probes/<probe>/<field> field.dtype, shape (n, *field.shape)
    /scalars/<name>/step    int64, shape (n,)
    /scalars/<name>/value   float64, shape (n,)
    /scalars/run_end        optional, one record at the last step: how the run ended, ``RUN_END[int(value)]``;
                            pre-allocated (one row, step -1 until written), so a run stopped by a full disk can
                            still say so

Crash safety and live reading rely on HDF5 SWMR (single writer, multiple readers):
every dataset is created up front (SWMR forbids creating objects or attributes later),
then the file is switched to SWMR mode and each record is written and flushed. The value
datasets of a record are written and flushed before its ``step`` entry, and readers take
``n = len(step)``, so a record is visible only once complete. A writer killed at any point
(SIGKILL, OOM, preemption) leaves a file that `read_run` opens, holding every record but
at most the one being written. Re-opening the same path with `RunLog` appends (after
repairing a file left by a killed writer). POSIX only (uses ``flock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import uuid
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .failpoints import kill_point
from .provenance import provenance

FORMAT = "interference-runlog"
FORMAT_VERSION = 2
#: versions this code reads: 1 (no checksums or fill values), 2 (Fletcher-32 checksums per chunk; unwritten steps
#: read as -1, unwritten float values as NaN)
READABLE_VERSIONS = (1, 2)

#: File format bounds: SWMR needs at least the HDF5 1.10 format; files stay readable by
#: HDF5 >= 1.10 (h5py >= 2.7) as long as no newer feature is used.
LIBVER = ("v110", "latest")

#: How a run ended, coded by position in the optional ``run_end`` scalar (a NaN loss stops a run as ``"nan"``; a
#: failed write of the log or a checkpoint as ``"write_error"``).
RUN_END = ("finished", "interrupted", "nan", "write_error")
#: the scalar series holding :data:`RUN_END`; its one record is allocated on disk when the log is created
END = "run_end"

_RESERVED_ATTRS = frozenset(
    {"format", "format_version", "config", "seed", "provenance", "device", "probe_settings",
     "json_attrs", "resumes", "log_id"}
)
#: what HDF5 says when a plain (non-SWMR) read meets a file an SWMR writer has open or did not close (killed): only
#: such files are opened in SWMR mode, as an SWMR reader retries failed checksums for minutes (a corrupt file would
#: hang it) where a plain read fails at once
OPEN_FOR_WRITE = ("already open for write", "h5clear", "consistency flags", "unable to lock file")
_CHUNK_BYTES = 64 * 1024
UNWRITTEN_STEP = -1  # what a step entry reads as when its chunk never reached the disk
_MAX_CHUNK_ROWS = 1024


#: the HDF5 objects of logs whose writes failed, kept alive on purpose (see :meth:`RunLog.close`)
_FAILED_FILES: list = []


class RunLogWriteError(OSError):
    """Writing the run log failed (full disk, I/O error, file size limit): the run cannot go on."""


class RunLogError(ValueError):
    """A file is not a readable run log, or does not match what the writer declares."""


@dataclass(frozen=True)
class Field:
    """One dataset of a probe, holding one value per record.

    Attributes:
        shape: per-record shape, ``()`` for a scalar, e.g. ``(32, 32)`` for a matrix; every
            dimension >= 1.
        dtype: numpy dtype name of a bool or numeric type; normalised, e.g. ``"f4"`` -> ``"float32"``.
    """

    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        shape = tuple(int(d) for d in self.shape)
        if any(d < 1 for d in shape):
            raise ValueError(f"Field shape must have dimensions >= 1, got {self.shape}")
        dtype = np.dtype(self.dtype)
        if dtype.kind not in "biufc":
            raise ValueError(f"Field dtype must be bool or numeric, got {self.dtype!r}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype.name)


class RunLog:
    """Single writer of a run log (layout in the module docstring).

    Args:
        path: the ``.h5`` file; missing parent directories are created.
        config: run configuration, stored as JSON (numpy values become lists/numbers,
            other non-JSON values their ``str``).
        seed: random seed of the run.
        probes: ``{probe: {field: Field}}``; each `append` to a probe gives every field.
            The name ``step`` is reserved for the step dataset.
        scalars: names of scalar series written with `scalar`.
        device: device the run used, e.g. ``"cuda:0"``.
        probe_settings: settings of the probes (intervals, batch sizes, ...), stored as JSON.
        extra_attrs: further root attributes; str/bool/int/float/numpy values are stored as
            is, anything else as JSON.
        overwrite: replace an existing file instead of appending to it.
        keep: when appending, resume at a checkpoint: ``{"probes/<probe>" or "scalars/<name>": n}`` (what
            :meth:`counts` returned when the checkpoint was taken) keeps the first ``n`` records of each group
            and drops the later ones (written after the checkpoint, they are written again); groups not named
            keep none.

    If `path` exists and `overwrite` is false, the run is resumed: the file must be a run
    log whose probes declared here have exactly the same fields (shape and dtype); new
    probes and scalars are added, probes and scalars only in the file stay writable. The
    stored attributes are kept; the resume is recorded in the ``resumes`` attribute (a
    list of ``{"time", "provenance", "changed"}``, ``changed`` holding the given
    attributes that differ from the stored ones). A file left by a killed writer is first
    repaired (copied without its partial record); it is refused while another process
    (writer or reader) has it open.

    Raises:
        RunLogError: the existing file is not a run log, is corrupt, is in use, or its
            schema conflicts with `probes`.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        config: Mapping[str, Any],
        seed: int,
        probes: Mapping[str, Mapping[str, Field]],
        scalars: Sequence[str] = (),
        device: str = "cpu",
        probe_settings: Mapping[str, Any] | None = None,
        extra_attrs: Mapping[str, Any] | None = None,
        overwrite: bool = False,
        keep: Mapping[str, int] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        _check_schema(probes, scalars)
        extra = dict(extra_attrs or {})
        if reserved := sorted(_RESERVED_ATTRS.intersection(extra)):
            raise ValueError(f"extra_attrs uses reserved attribute names {reserved}")
        attrs = {
            "config": dict(config),
            "seed": int(seed),
            "device": str(device),
            "probe_settings": dict(probe_settings or {}),
            **extra,
        }
        if os.path.exists(self.path) and not overwrite:
            f = _open_for_append(self.path)
        else:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            try:
                f = h5py.File(self.path, "w", libver=LIBVER)
            except BlockingIOError as err:
                raise RunLogError(f"{self.path}: in use by another process; cannot overwrite it: "
                                  f"{err}") from err
            except OSError as err:
                raise RunLogWriteError(f"{self.path}: cannot create the run log ({_os_cause(err)})") from err
        try:
            if "format" in f.attrs:
                _record_resume(f, attrs, keep)
                if "log_id" not in f.attrs:  # a log from before ids gets one when resumed
                    f.attrs["log_id"] = uuid.uuid4().hex
            else:
                f.require_group("probes")
                f.require_group("scalars")
                _write_attrs(f, {"format": FORMAT, "format_version": FORMAT_VERSION,
                                 "provenance": provenance(), "log_id": uuid.uuid4().hex, **attrs})
            _declare(f, self.path, probes, scalars)
            self._fields = _file_schema(f, self.path)
            #: this log's id: a fresh run's log gets a new one, a resumed run keeps it (a log from before ids gets one
            #: then), so it tells whether a folder's log is still the one a checkpoint continues
            self.log_id: str = _attr_str(f.attrs["log_id"])
            self._counts = _trim_partial_records(f)
            if keep is not None:
                self._counts = _keep_records(f, self.path, self._counts, keep)
            f.swmr_mode = True
            if keep is not None:
                kill_point("resume.after_truncate")
        except (OSError, RuntimeError) as err:  # HDF5 could not write the file's layout: a full or failing disk
            with contextlib.suppress(OSError, RuntimeError):
                f.close()
            raise RunLogWriteError(f"{self.path}: cannot write the run log ({_os_cause(err)}): the disk may be full "
                                   "or failing") from err
        except BaseException:
            f.close()
            raise
        self._file = f
        # one handle per dataset for the whole run: HDF5 writes an object's metadata when its handle is freed, and
        # a failure there (a full disk) is only printed by h5py, never raised; with handles kept, it surfaces in the
        # flush after each record (and re-opening every dataset per record cost time on the hot path)
        self._columns = {key: {name: f[key[0]][key[1]][name] for name in f[key[0]][key[1]]} for key in self._counts}
        self._write_error: str | None = None
        # HDF5 drops its own lock in SWMR mode; a shared lock tells a later RunLog on the
        # same path that this writer is alive (readers take shared locks too).
        self._lock_fd = os.open(self.path, os.O_RDONLY)
        _try_flock(self._lock_fd, fcntl.LOCK_SH)

    def counts(self) -> dict[str, int]:
        """``{"probes/<probe>" or "scalars/<name>": records written}``: what ``keep`` takes on a resume."""
        return {f"{kind}/{name}": n for (kind, name), n in self._counts.items()}

    def append(self, probe: str, step: int, **values: Any) -> None:
        """Write one record of `probe` at training `step`, then flush it to disk.

        `values` gives every declared field, each array-like (numpy, torch tensors on any
        device, Python numbers) of exactly the field's shape and castable to its dtype
        (same kind, e.g. float64 -> float32).

        Raises:
            ValueError: unknown probe, missing/unexpected field, wrong shape or dtype.
        """
        fields = self._fields.get(probe)
        if fields is None:
            raise ValueError(f"unknown probe {probe!r}; declared probes: {sorted(self._fields)}")
        if missing := sorted(set(fields) - set(values)):
            raise ValueError(f"probe {probe!r}: missing fields {missing}")
        if unexpected := sorted(set(values) - set(fields)):
            raise ValueError(f"probe {probe!r}: unexpected fields {unexpected}; "
                             f"declared fields: {sorted(fields)}")
        arrays = {name: _as_field_array(probe, name, fields[name], v) for name, v in values.items()}
        self._write_record(("probes", probe), _as_step(step), arrays)

    def scalar(self, name: str, step: int, value: float) -> None:
        """Write one value (float64) of scalar series `name` at training `step`, then flush."""
        if ("scalars", name) not in self._counts:
            scalars = sorted(k for kind, k in self._counts if kind == "scalars")
            raise ValueError(f"unknown scalar {name!r}; declared scalars: {scalars}")
        self._write_record(("scalars", name), _as_step(step), {"value": np.float64(value)})

    def end(self, step: int, status: str) -> None:
        """Write the ``run_end`` record: how the run ended, one of :data:`RUN_END`. Also after a failed write (its
        row is pre-allocated, so a full disk still takes it); raises :class:`RunLogWriteError` if even that fails."""
        if status not in RUN_END:
            raise ValueError(f"unknown run end {status!r}; expected one of {RUN_END}")
        failed, self._write_error = self._write_error, None
        try:
            self.scalar(END, step, RUN_END.index(status))
        finally:
            self._write_error = failed or self._write_error

    def _write_record(self, key: tuple[str, str], step: np.int64, values: Mapping[str, Any]) -> None:
        """Write row n (n = number of complete records) of the group ``/<kind>/<name>``:
        the values first, then ``step``, which makes the record visible to readers. A partial
        row left by a failed write is overwritten. A failed write (full disk, I/O error, file size limit) raises
        :class:`RunLogWriteError` and every later write does too: the run must stop."""
        if self._write_error is not None:
            raise RunLogWriteError(f"{self.path}: cannot write the run log (an earlier write failed: "
                                   f"{self._write_error}); records written before stay readable")
        try:
            columns = self._columns[key]
            n = self._counts[key]
            for name, value in values.items():
                _write_row(columns[name], n, value)
            self._file.flush()
            kill_point("runlog.mid_record")
            _write_row(columns["step"], n, step)
            self._file.flush()
        except (OSError, RuntimeError) as err:
            cause = _os_cause(err)
            self._write_error = cause
            raise RunLogWriteError(f"{self.path}: cannot write the run log ({cause}): the disk may be full or failing; "
                                   "records written so far stay readable") from err
        self._counts[key] = n + 1

    def close(self) -> None:
        """Close the file (idempotent). After a write error the file's HDF5 objects are kept, never freed: HDF5
        tears down the objects of a file whose writes failed badly (a segmentation fault, seen on a full disk), so
        they stay in :data:`_FAILED_FILES` until the process ends (the CLIs then leave with ``os._exit``)."""
        if self._lock_fd is None:
            return
        try:
            if self._write_error is not None:
                _FAILED_FILES.append((self._file, self._columns))
            else:
                self._columns = {}
                self._file.close()
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


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


def read_run(path: str | os.PathLike, *, swmr: bool = True) -> Run:
    """Read a run log, also while its writer is still appending (SWMR read).

    Returns the complete records only: every field is truncated to ``len(step)``.

    Raises:
        FileNotFoundError: `path` does not exist.
        RunLogError: not an HDF5 file, corrupt or truncated, or not a run log.
    """
    path = os.fspath(path)
    with _open_read(path, swmr) as f:
        try:
            attrs = _decode_attrs(f.attrs)
            probes = {}
            for name, group in f["probes"].items():
                probes[name] = _read_group(group, path)
            scalars = {}
            for name, group in f["scalars"].items():
                columns = _read_group(group, path)
                scalars[name] = (columns["step"], columns["value"])
            return Run(path=path, config=attrs["config"], seed=attrs["seed"], attrs=attrs,
                       probes=probes, scalars=scalars)
        except (OSError, KeyError, json.JSONDecodeError, TypeError, AttributeError, ValueError) as err:
            raise RunLogError(f"{path}: corrupt run log: {err!r}") from err


def read_log_id(path: str | os.PathLike) -> str | None:
    """The ``log_id`` of the run log at ``path`` (None for a log from before ids), read without its records.

    Raises:
        FileNotFoundError: `path` does not exist.
        RunLogError: not an HDF5 file, corrupt or truncated, or not a run log.
    """
    path = os.fspath(path)
    with _open_read(path) as f:
        return _attr_str(f.attrs.get("log_id"))


def _attr_str(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else None if value is None else str(value)


def find_runs(path_or_dir: str | os.PathLike) -> list[str]:
    """``[path]`` for a file, or all ``*.h5`` files under a directory (recursive, sorted)."""
    path = Path(path_or_dir)
    if path.is_dir():
        return sorted(str(p) for p in path.rglob("*.h5") if p.is_file())
    if not path.exists():
        raise FileNotFoundError(f"no such file or directory: {path}")
    return [str(path)]


# --- file access --------------------------------------------------------------------


def _open_read(path: str, swmr: bool = True) -> h5py.File:
    """Open a run log read-only; RunLogError unless it is one. A plain read first (it verifies checksums at once);
    with ``swmr``, a file an SWMR writer has open or left open (killed) is then opened in SWMR mode."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such run log: {path}")
    if not h5py.is_hdf5(path):
        raise RunLogError(f"{path}: not an HDF5 file (no HDF5 signature)")
    _check_not_truncated(path)
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
        _check_format(f, path)
    except BaseException:
        f.close()
        raise
    return f


def _check_not_truncated(path: str) -> None:
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


def _check_format(f: h5py.File, path: str) -> None:
    fmt = f.attrs.get("format")
    if fmt != FORMAT:
        found = "missing" if fmt is None else f"{fmt!r}"
        raise RunLogError(f"{path}: not an interference run log "
                          f"(root attribute 'format' is {found}, expected {FORMAT!r})")
    version = f.attrs.get("format_version")
    if version not in READABLE_VERSIONS:
        raise RunLogError(f"{path}: run log format_version {version} is not supported "
                          f"(this code reads versions {', '.join(map(str, READABLE_VERSIONS))})")
    if "probes" not in f or "scalars" not in f:
        raise RunLogError(f"{path}: corrupt run log: missing /probes or /scalars group")


def _open_for_append(path: str) -> h5py.File:
    """Open an existing run log read-write, repairing it if its writer was killed. A log a writer has or left open
    is checked first in a child process (:mod:`probes.logcheck`): HDF5's SWMR reader, the only one that opens it,
    retries a bad metadata checksum for minutes."""
    try:
        _open_read(path, swmr=False).close()
    except RunLogError as err:
        if isinstance(err.__cause__, BlockingIOError) or not any(text in str(err) for text in OPEN_FOR_WRITE):
            raise  # (a live writer outside SWMR mode holds it: said as such)
        from .logcheck import check_logs  # (a child process: only for logs left open, as by a killed writer)

        if why := check_logs([path])[path]:
            raise RunLogError(f"{path}: left open by its writer and unreadable: {why}") from None
    try:
        return h5py.File(path, "r+", libver=LIBVER)
    except BlockingIOError as err:  # HDF5 could not lock the file
        raise RunLogError(f"{path}: in use by another process (a live writer or reader); "
                          f"cannot append to it: {err}") from err
    except OSError as err:
        # HDF5 marks files open for writing in the superblock; a killed writer leaves the mark.
        if "already open for write" not in str(err):
            raise RunLogError(f"{path}: cannot open for appending: {err}") from err
    _repair(path)
    try:
        return h5py.File(path, "r+", libver=LIBVER)
    except OSError as err:
        raise RunLogError(f"{path}: cannot open for appending after repair: {err}") from err


def _repair(path: str) -> None:
    """Replace the file of a dead writer by a clean copy (HDF5 keeps refusing write access
    to it otherwise). Refused while any other process has the file open."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if not _try_flock(fd, fcntl.LOCK_EX):
            raise RunLogError(f"{path}: in use by another process (a live writer or reader); "
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


def _try_flock(fd: int, operation: int) -> bool:
    """Non-blocking flock; False if another open file holds a conflicting lock, True if
    locked or if the file system does not support locking."""
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        pass
    return True


# --- schema -------------------------------------------------------------------------


def _check_name(kind: str, name: object) -> None:
    if not isinstance(name, str) or not name or "/" in name or name == ".":
        raise ValueError(f"invalid {kind} name {name!r}: must be a non-empty string without '/'")


def _check_schema(probes: Mapping[str, Mapping[str, Field]], scalars: Sequence[str]) -> None:
    for probe, fields in probes.items():
        _check_name("probe", probe)
        if "step" in fields:
            raise ValueError(f"probe {probe!r}: field name 'step' is reserved")
        for name, field in fields.items():
            _check_name("field", name)
            if not isinstance(field, Field):
                raise TypeError(f"probe {probe!r} field {name!r}: expected a Field, got {field!r}")
    for name in scalars:
        _check_name("scalar", name)


def _create_column(group: h5py.Group, name: str, shape: tuple[int, ...], dtype: str) -> None:
    """Create an empty resizable dataset of records of `shape`, chunked to ~64 KiB, with a Fletcher-32 checksum
    per chunk (a corrupted chunk raises on read instead of returning garbage) and fill values that mark what was
    never written: -1 for steps (never a real step), NaN for floating-point values."""
    record_bytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    rows = min(_MAX_CHUNK_ROWS, max(1, _CHUNK_BYTES // record_bytes))
    kind = np.dtype(dtype).kind
    fill = UNWRITTEN_STEP if name == "step" else (np.nan if kind in "fc" else None)
    group.create_dataset(name, shape=(0, *shape), maxshape=(None, *shape), chunks=(rows, *shape), dtype=dtype,
                         fletcher32=True, fillvalue=fill)


def _create_end_column(group: h5py.Group, name: str, dtype: str, fill: Any) -> None:
    """One row, allocated on disk now (not when first written): writing it later overwrites bytes in place, which a
    full disk still allows. Contiguous, so without a checksum (Fletcher-32 needs chunks); 8 bytes."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    group.create_dataset(name, shape=(1,), dtype=dtype, fillvalue=fill, dcpl=dcpl)


def _declare(f: h5py.File, path: str, probes: Mapping[str, Mapping[str, Field]],
             scalars: Sequence[str]) -> None:
    """Create the datasets of new probes and scalars; check declared probes already in the file."""
    existing = _file_schema(f, path)
    for probe, fields in probes.items():
        if probe in existing:
            if dict(fields) != existing[probe]:
                raise RunLogError(f"{path}: probe {probe!r} is declared with fields "
                                  f"{_describe(fields)} but the file has {_describe(existing[probe])}")
            continue
        group = f["probes"].create_group(probe)
        _create_column(group, "step", (), "int64")
        for name, field in fields.items():
            _create_column(group, name, field.shape, field.dtype)
    for name in scalars:
        if name not in f["scalars"]:
            group = f["scalars"].create_group(name)
            if name == END:
                _create_end_column(group, "step", "int64", UNWRITTEN_STEP)
                _create_end_column(group, "value", "float64", np.nan)
                continue
            _create_column(group, "step", (), "int64")
            _create_column(group, "value", (), "float64")


def _file_schema(f: h5py.File, path: str) -> dict[str, dict[str, Field]]:
    """``{probe: {field: Field}}`` of the probes in the file."""
    schema = {}
    for probe, group in f["probes"].items():
        if "step" not in group:
            raise RunLogError(f"{path}: corrupt run log: probe {probe!r} has no step dataset")
        schema[probe] = {name: Field(ds.shape[1:], ds.dtype.name)
                         for name, ds in group.items() if name != "step"}
    return schema


def _describe(fields: Mapping[str, Field]) -> str:
    return "{" + ", ".join(f"{k}: shape {v.shape} {v.dtype}" for k, v in sorted(fields.items())) + "}"


def _trim_partial_records(f: h5py.File) -> dict[tuple[str, str], int]:
    """Shrink every dataset to its group's ``len(step)``; return those record counts."""
    counts = {}
    for kind in ("probes", "scalars"):
        for name, group in f[kind].items():
            n = _written(group["step"])
            _truncate(group, n)
            counts[kind, name] = n
    return counts


def _written(step: h5py.Dataset) -> int:
    """Complete records of a group: ``len(step)``, or for a pre-allocated one, the rows before the first unwritten."""
    if step.maxshape[0] is None:
        return len(step)
    unwritten = np.flatnonzero(step[()] == UNWRITTEN_STEP)
    return int(unwritten[0]) if len(unwritten) else len(step)


def _truncate(group: h5py.Group, n: int) -> None:
    """Keep the first ``n`` records of every dataset of ``group`` (pre-allocated rows are reset to unwritten)."""
    for name, dataset in group.items():
        if dataset.maxshape[0] is None:
            if len(dataset) > n:
                dataset.resize(n, axis=0)
        elif n < len(dataset):
            dataset[n:] = UNWRITTEN_STEP if name == "step" else np.nan


def _keep_records(f: h5py.File, path: str, counts: Mapping[tuple[str, str], int],
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
        written = len(_read_group(group, path)["step"]) if n else 0
        if written < want:
            raise RunLogError(f"{path}: {group.name} holds {written} complete records but the checkpoint was taken "
                              f"after {want}: the log lost records (or belongs to another run); cannot resume")
        _truncate(group, want)
        kept[kind, name] = want
    return kept


def _read_group(group: h5py.Group, path: str) -> dict[str, np.ndarray]:
    """All datasets of a probe/scalar group, truncated to the complete records: those before the first step that
    was never written (a failed write, e.g. a full disk), with a warning naming how many were refused."""
    step = group["step"][()]
    unwritten = np.flatnonzero(step == UNWRITTEN_STEP)
    if len(unwritten):
        first = unwritten[0]
        if np.any(step[first:] != UNWRITTEN_STEP):  # written records after an unwritten one: a failed write
            warnings.warn(f"{path}: {group.name}: {len(step) - first} of {len(step)} records are refused from the "
                          f"first one never fully written (a failed write); reading the first {first}",
                          RuntimeWarning, stacklevel=3)
        step = step[:first]  # trailing unwritten entries: a record in progress (live writer) or cut by a failure
    columns = {"step": step}
    for name, dataset in group.items():
        if name == "step":
            continue
        if len(dataset) < len(step):
            raise RunLogError(f"{path}: corrupt run log: {dataset.name} has {len(dataset)} "
                              f"records, step has {len(step)}")
        columns[name] = dataset[: len(step)]
    return columns


# --- records ------------------------------------------------------------------------


def _os_cause(err: BaseException) -> str:
    """The operating system's words for a failed write (HDF5 buries them in a long message: ``errno = 28, error
    message = 'No space left on device'``), else the error's first line."""
    found = re.search(r"error message = '([^']+)'", str(err))
    return ((found.group(1) if found else None) or getattr(err, "strerror", None)
            or (str(err).splitlines() or [""])[0] or type(err).__name__)


def _write_row(dataset: h5py.Dataset, row: int, value: Any) -> None:
    if dataset.maxshape[0] is None:
        dataset.resize(row + 1, axis=0)
    elif row >= len(dataset):
        raise ValueError(f"{dataset.name} holds {len(dataset)} record(s) (a run ends once)")
    dataset[row] = value


def _as_step(step: int) -> np.int64:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
        raise TypeError(f"step must be an int, got {type(step).__name__}")
    if step < 0:
        raise ValueError(f"step must be >= 0 (a training step; -1 marks unwritten entries), got {step}")
    return np.int64(step)


def _as_field_array(probe: str, name: str, field: Field, value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # torch.Tensor, possibly on an accelerator
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.shape != field.shape:
        raise ValueError(f"probe {probe!r} field {name!r}: expected shape {field.shape}, "
                         f"got {array.shape}")
    if not np.can_cast(array.dtype, field.dtype, casting="same_kind"):
        raise ValueError(f"probe {probe!r} field {name!r}: expected dtype {field.dtype}, "
                         f"got {array.dtype} (not castable)")
    return array.astype(field.dtype, copy=False)


# --- attributes ---------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return str(value)


def _to_json(value: Any) -> str:
    return json.dumps(value, default=_json_default)


def _write_attrs(f: h5py.File, values: Mapping[str, Any]) -> None:
    """Set root attributes; values that HDF5 cannot store natively are stored as JSON and
    listed in the ``json_attrs`` attribute."""
    json_names = set(json.loads(f.attrs.get("json_attrs", "[]")))
    for name, value in values.items():
        if isinstance(value, (str, bool, int, float, np.generic, np.ndarray)):
            f.attrs[name] = value
            json_names.discard(name)
        else:
            f.attrs[name] = _to_json(value)
            json_names.add(name)
    f.attrs["json_attrs"] = _to_json(sorted(json_names))


def _decode_attrs(attrs: h5py.AttributeManager) -> dict:
    json_names = set(json.loads(attrs.get("json_attrs", "[]")))
    decoded = {}
    for name, value in attrs.items():
        if name == "json_attrs":
            continue
        if name in json_names:
            value = json.loads(value)
        elif isinstance(value, np.generic):
            value = value.item()
        decoded[name] = value
    return decoded


def _record_resume(f: h5py.File, attrs: Mapping[str, Any], keep: Mapping[str, int] | None) -> None:
    """Append ``{"time", "provenance", "changed"}`` (and ``kept``, the record counts of a resume at a checkpoint)
    to the ``resumes`` attribute."""
    stored = _decode_attrs(f.attrs)
    changed = {}
    for name, value in attrs.items():
        value = json.loads(_to_json(value))
        if name not in stored or json.loads(_to_json(stored[name])) != value:
            changed[name] = value
    entry = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "provenance": provenance(), "changed": changed}
    if keep is not None:
        entry["kept"] = {k: int(v) for k, v in keep.items()}
    _write_attrs(f, {"resumes": [*stored.get("resumes", []), entry]})
