"""Writing a run log: :class:`RunLog`, the single writer (layout in :mod:`runlog.format`).

Crash safety and live reading rely on HDF5 SWMR (single writer, multiple readers): every dataset is created up
front (SWMR forbids creating objects or attributes later), then the file is switched to SWMR mode and each record
is written and flushed. The value datasets of a record are written and flushed before its ``step`` entry, and
readers take ``n = len(step)``, so a record is visible only once complete. A writer killed at any point (SIGKILL,
OOM, preemption) leaves a file that :func:`runlog.read_run` opens, holding every record but at most the one being
written. Re-opening the same path with :class:`RunLog` appends (after repairing a file left by a killed writer).
POSIX only (uses ``flock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .failpoints import kill_point
from .format import (CHUNK_BYTES, END, FORMAT, FORMAT_VERSION, LIBVER, MAX_CHUNK_ROWS, RESERVED_ATTRS, RUN_END,
                     UNWRITTEN_STEP, Field, RunLogBusy, RunLogError, RunLogWriteError, attr_str, checked_attrs, decode_attrs,
                     describe, file_schema, os_cause, to_json, write_attrs)
from .provenance import provenance
from .repair import keep_records, open_for_append, trim_partial_records, try_flock

#: the HDF5 objects of logs whose writes failed, kept alive on purpose (see :meth:`RunLog.close`)
_FAILED_FILES: list = []


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
        if reserved := sorted(RESERVED_ATTRS.intersection(extra)):
            raise ValueError(f"extra_attrs uses reserved attribute names {reserved}")
        attrs = {
            "config": dict(config),
            "seed": int(seed),
            "device": str(device),
            "probe_settings": dict(probe_settings or {}),
            **extra,
        }
        if os.path.exists(self.path) and not overwrite:
            f = open_for_append(self.path)
        else:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            try:
                f = h5py.File(self.path, "w", libver=LIBVER)
            except BlockingIOError as err:
                raise RunLogBusy(f"{self.path}: in use by another process; cannot overwrite it: "
                                  f"{err}") from err
            except OSError as err:
                raise RunLogWriteError(f"{self.path}: cannot create the run log ({os_cause(err)})") from err
        try:
            if "format" in f.attrs:
                checked_attrs(f, self.path)  # (a corrupted attribute is refused, not sealed under a new digest)
                _record_resume(f, attrs, keep)
                if "log_id" not in f.attrs:  # a log from before ids gets one when resumed
                    write_attrs(f, {"log_id": uuid.uuid4().hex})
            else:
                f.require_group("probes")
                f.require_group("scalars")
                write_attrs(f, {"format": FORMAT, "format_version": FORMAT_VERSION,
                                 "provenance": provenance(), "log_id": uuid.uuid4().hex, **attrs})
            _declare(f, self.path, probes, scalars)
            self._fields = file_schema(f, self.path)
            #: this log's id: a fresh run's log gets a new one, a resumed run keeps it (a log from before ids gets one
            #: then), so it tells whether a folder's log is still the one a checkpoint continues
            self.log_id: str = attr_str(f.attrs["log_id"])
            self._counts = trim_partial_records(f)
            if keep is not None:
                self._counts = keep_records(f, self.path, self._counts, keep)
            f.swmr_mode = True
            if keep is not None:
                kill_point("resume.after_truncate")
        except (OSError, RuntimeError) as err:  # HDF5 could not write the file's layout: a full or failing disk
            with contextlib.suppress(OSError, RuntimeError):
                f.close()
            raise RunLogWriteError(f"{self.path}: cannot write the run log ({os_cause(err)}): the disk may be full "
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
        try_flock(self._lock_fd, fcntl.LOCK_SH)

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
            cause = os_cause(err)
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
    rows = min(MAX_CHUNK_ROWS, max(1, CHUNK_BYTES // record_bytes))
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
    existing = file_schema(f, path)
    for probe, fields in probes.items():
        if probe in existing:
            if dict(fields) != existing[probe]:
                raise RunLogError(f"{path}: probe {probe!r} is declared with fields "
                                  f"{describe(fields)} but the file has {describe(existing[probe])}")
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


def _record_resume(f: h5py.File, attrs: Mapping[str, Any], keep: Mapping[str, int] | None) -> None:
    """Append ``{"time", "provenance", "changed"}`` (and ``kept``, the record counts of a resume at a checkpoint)
    to the ``resumes`` attribute."""
    stored = decode_attrs(f.attrs)
    changed = {}
    for name, value in attrs.items():
        value = json.loads(to_json(value))
        if name not in stored or json.loads(to_json(stored[name])) != value:
            changed[name] = value
    entry = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "provenance": provenance(), "changed": changed}
    if keep is not None:
        entry["kept"] = {k: int(v) for k, v in keep.items()}
    write_attrs(f, {"resumes": [*stored.get("resumes", []), entry]})
