"""The run-log file format: its layout, version, errors, field declarations and root-attribute codec.

The layout::

    /                       attrs: format='interference-runlog', format_version=3 (1, 2 still read),
                                   config (JSON), seed, provenance (JSON), device,
                                   probe_settings (JSON), json_attrs (JSON list of the attrs
                                   stored as JSON), resumes (JSON, after a resume), log_id (a
                                   random hex id given at creation, kept by resumes; logs written
                                   before 2026-11-24 get one when first resumed), extra attrs,
                                   attrs_sha256 (SHA-256 of every other attribute, decoded:
                                   a reader refuses a log whose attributes do not match it;
                                   required from version 3)
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

import hashlib
import json
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

FORMAT = "interference-runlog"
FORMAT_VERSION = 3
#: versions this code reads: 1 (no checksums or fill values), 2 (Fletcher-32 checksums per chunk; unwritten steps
#: read as -1, unwritten float values as NaN), 3 (the root attributes' SHA-256 in ``attrs_sha256``)
READABLE_VERSIONS = (1, 2, 3)
#: the root attribute holding the SHA-256 of every other one (decoded, canonical JSON)
DIGEST = "attrs_sha256"

#: File format bounds: SWMR needs at least the HDF5 1.10 format; files stay readable by
#: HDF5 >= 1.10 (h5py >= 2.7) as long as no newer feature is used.
LIBVER = ("v110", "latest")

#: How a run ended, coded by position in the optional ``run_end`` scalar (a NaN loss stops a run as ``"nan"``; a
#: failed write of the log or a checkpoint as ``"write_error"``).
RUN_END = ("finished", "interrupted", "nan", "write_error")
#: the scalar series holding :data:`RUN_END`; its one record is allocated on disk when the log is created
END = "run_end"

RESERVED_ATTRS = frozenset(
    {"format", "format_version", "config", "seed", "provenance", "device", "probe_settings",
     "json_attrs", "resumes", "log_id", DIGEST}
)
#: what HDF5 says when a plain (non-SWMR) read meets a file an SWMR writer has open or did not close (killed): only
#: such files are opened in SWMR mode, as an SWMR reader retries failed checksums for minutes (a corrupt file would
#: hang it) where a plain read fails at once
OPEN_FOR_WRITE = ("already open for write", "h5clear", "consistency flags", "unable to lock file")
CHUNK_BYTES = 64 * 1024
UNWRITTEN_STEP = -1  # what a step entry reads as when its chunk never reached the disk
MAX_CHUNK_ROWS = 1024


class RunLogWriteError(OSError):
    """Writing the run log failed (full disk, I/O error, file size limit): the run cannot go on."""


class RunLogError(ValueError):
    """A file is not a readable run log, or does not match what the writer declares."""


class RunLogBusy(RunLogError):
    """Another process (a live writer or reader) has the log open, so it cannot be appended to or replaced now."""


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


def check_format(f: h5py.File, path: str) -> None:
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


def file_schema(f: h5py.File, path: str) -> dict[str, dict[str, Field]]:
    """``{probe: {field: Field}}`` of the probes in the file."""
    schema = {}
    for probe, group in f["probes"].items():
        if "step" not in group:
            raise RunLogError(f"{path}: corrupt run log: probe {probe!r} has no step dataset")
        schema[probe] = {name: Field(ds.shape[1:], ds.dtype.name)
                         for name, ds in group.items() if name != "step"}
    return schema


def describe(fields: Mapping[str, Field]) -> str:
    return "{" + ", ".join(f"{k}: shape {v.shape} {v.dtype}" for k, v in sorted(fields.items())) + "}"


def read_group(group: h5py.Group, path: str) -> dict[str, np.ndarray]:
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


def os_cause(err: BaseException) -> str:
    """The operating system's words for a failed write (HDF5 buries them in a long message: ``errno = 28, error
    message = 'No space left on device'``), else the error's first line."""
    found = re.search(r"error message = '([^']+)'", str(err))
    return ((found.group(1) if found else None) or getattr(err, "strerror", None)
            or (str(err).splitlines() or [""])[0] or type(err).__name__)


# --- attributes ---------------------------------------------------------------------


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return str(value)


def to_json(value: Any) -> str:
    return json.dumps(value, default=_json_default)


def write_attrs(f: h5py.File, values: Mapping[str, Any]) -> None:
    """Set root attributes; values that HDF5 cannot store natively are stored as JSON and
    listed in the ``json_attrs`` attribute."""
    json_names = set(json.loads(f.attrs.get("json_attrs", "[]")))
    for name, value in values.items():
        if isinstance(value, (str, bool, int, float, np.generic, np.ndarray)):
            f.attrs[name] = value
            json_names.discard(name)
        else:
            f.attrs[name] = to_json(value)
            json_names.add(name)
    f.attrs["json_attrs"] = to_json(sorted(json_names))
    f.attrs[DIGEST] = digest(decode_attrs(f.attrs))


def digest(decoded: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of decoded root attributes, ``DIGEST`` itself left out: canonical JSON, keys sorted."""
    body = {k: v for k, v in decoded.items() if k != DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=_json_default).encode()).hexdigest()


def decode_attrs(attrs: h5py.AttributeManager) -> dict:
    """The root attributes, JSON ones decoded (``json_attrs`` itself left out)."""
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




def checked_attrs(f: h5py.File, path: str) -> dict:
    """The decoded root attributes; :class:`RunLogError` if they do not match their stored digest (a changed
    byte), or a version-3 log has none."""
    decoded = decode_attrs(f.attrs)
    stored = decoded.get(DIGEST)
    if stored is None:
        if int(decoded.get("format_version", 0)) >= 3:
            raise RunLogError(f"{path}: corrupt run log: the attributes' digest {DIGEST!r} is missing")
        return decoded
    if attr_str(stored) != digest(decoded):
        raise RunLogError(f"{path}: corrupt run log: the root attributes (config, provenance, ...) do not match "
                          f"their digest {DIGEST!r}")
    del decoded[DIGEST]
    return decoded


def attr_str(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else None if value is None else str(value)
