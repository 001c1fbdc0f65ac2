"""Arrays out of run logs: learning curves, probe series, record selection, what a run holds, what its probe fields
mean; with the grouping of runs by configuration (:mod:`reports.grouping`), whose names this module re-exports.

Pure numpy on :class:`runlog.Run` objects, no plotting, so the arrays can go to pandas, rliable, ...
Steps are the learner's step counter (env steps for RL, samples seen for streaming learners). Functions whose
data may be missing from a run log return ``None`` (or leave it out) instead of raising.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runlog import END, RUN_END, Run
from runlog.schema import FieldDoc, ProbeSchema, default_doc

from .grouping import MAX_LABEL, config_key, config_labels, group_by_config, partition, short_labels
from .labels import layer_labels, parameter_labels

__all__ = [
    "Curve", "Series", "Record", "CurrentNTK", "current_ntk", "config_key", "config_labels", "group_by_config",
    "partition", "short_labels", "MAX_LABEL", "DistanceCurve", "ntk_vs_distance",
    "learning_curve", "final_return", "probe_series", "layer_names", "model_layers", "entry_labels",
    "training_length", "finished", "run_end", "default_steps", "nearest_record", "select_records", "gradcov_losses",
    "ntk_kind", "ntk_matrix", "probe_inputs", "probe_schema", "field_doc", "probe_fields", "summary_mean", "mean_sem",
    "NO_SE", "format_mean_sem",
]


@dataclass(frozen=True)
class _OverRuns:
    """``values`` of several runs stacked on axis 0, at ``steps``; statistics over the runs ignore NaN."""

    steps: np.ndarray
    values: np.ndarray

    @property
    def n(self) -> np.ndarray:
        """``values.shape[1:]`` number of runs with a value (not NaN)."""
        return np.sum(~np.isnan(self.values), axis=0)

    @property
    def mean(self) -> np.ndarray:
        """``values.shape[1:]`` mean over runs; NaN where no run has a value."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "mean of empty slice": NaN is the answer
            return np.nanmean(self.values, axis=0)

    @property
    def sem(self) -> np.ndarray:
        """``values.shape[1:]`` standard error of the mean over runs, ``std(ddof=1) / sqrt(n)``; NaN where
        ``n < 2``."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # "degrees of freedom <= 0": NaN is the answer
            return np.nanstd(self.values, axis=0, ddof=1) / np.sqrt(self.n)


@dataclass(frozen=True)
class Curve(_OverRuns):
    """A scalar series of several runs on a common step grid.

    steps: ``(G,)`` grid, evenly spaced from the first to the last recorded step of any run.
    values: ``(R, G)`` each run's series interpolated onto the grid, NaN outside the run's recorded range.
    """


@dataclass(frozen=True)
class Series(_OverRuns):
    """A probe field over time, at the steps that every run recorded.

    steps: ``(T,)``; values: ``(R, T, *field_shape)``.
    """


@dataclass(frozen=True)
class CurrentNTK:
    """One record of the NTK against the sample being learned (streaming learners).

    kernel: ``(N,)`` ``NTK(x_i, x_t)`` over the probe inputs; x_t: ``(*feature_shape)`` the sample being learned;
    inputs: ``(N, *feature_shape)`` the probe inputs ``x_i``, or None if the run did not log them.
    """

    step: int
    seed: int
    kernel: np.ndarray
    x_t: np.ndarray | None
    inputs: np.ndarray | None


@dataclass(frozen=True)
class Record:
    """One record of a probe field: ``value`` at ``step``, the record nearest to the requested ``target``."""

    step: int
    target: int
    seed: int
    value: np.ndarray


# --- learning curves ----------------------------------------------------------------


def _trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of each value and the ``window - 1`` values before it (fewer at the start)."""
    cum = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(1, len(values) + 1)
    start = np.maximum(idx - window, 0)
    return (cum[idx] - cum[start]) / (idx - start)


def learning_curve(runs: Sequence[Run], scalar: str = "episode_return", num: int = 200,
                   window: int = 1) -> Curve | None:
    """Scalar `scalar` of each run, interpolated linearly onto a common grid of `num` steps.

    `window` > 1 first replaces each value by the mean of the last `window` values (e.g. episodes). Returns
    None if no run has a record of `scalar`.
    """
    if num < 1 or window < 1:
        raise ValueError(f"num and window must be >= 1, got num={num}, window={window}")
    series = [run.scalars[scalar] for run in runs if scalar in run.scalars and len(run.scalars[scalar][0])]
    if not series:
        return None
    lo = min(float(s[0].min()) for s in series)
    hi = max(float(s[0].max()) for s in series)
    grid = np.linspace(lo, hi, num) if hi > lo else np.array([lo])
    rows = []
    for steps, values in series:
        order = np.argsort(steps, kind="stable")
        steps, values = steps[order].astype(float), _trailing_mean(values[order], window)
        row = np.interp(grid, steps, values)
        row[(grid < steps[0]) | (grid > steps[-1])] = np.nan
        rows.append(row)
    return Curve(steps=grid, values=np.stack(rows))


def final_return(run: Run, fraction: float = 0.1, scalar: str = "episode_return") -> float:
    """Mean of `scalar` over the last `fraction` of its records (at least one), e.g. of episode returns.

    With ``n`` episodes that is the last ``ceil(fraction * n)``. Raises ValueError if the run has none.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    steps, values = run.scalars.get(scalar, (np.empty(0), np.empty(0)))
    if len(values) == 0:
        raise ValueError(f"{run.path}: no {scalar!r} records")
    values = values[np.argsort(steps, kind="stable")]
    k = max(1, math.ceil(round(fraction * len(values), 9)))
    return float(np.mean(values[-k:]))


# --- probe series -------------------------------------------------------------------


def _field(run: Run, probe: str, field: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps (n,), values (n, ...)) of a probe field, None if absent or empty."""
    columns = run.probes.get(probe, {})
    if field not in columns or len(columns["step"]) == 0:
        return None
    return columns["step"], columns[field]


def probe_series(runs: Sequence[Run], probe: str, field: str) -> Series | None:
    """Field `field` of `probe` in every run, at the steps all runs recorded (None if there are none)."""
    fields = [_field(run, probe, field) for run in runs]
    if not fields or any(f is None for f in fields):
        return None
    shared = fields[0][0]
    for steps, _ in fields[1:]:
        shared = np.intersect1d(shared, steps)
    if len(shared) == 0:
        return None
    values = []
    for steps, vals in fields:
        order = np.argsort(steps, kind="stable")
        values.append(vals[order][np.searchsorted(steps[order], shared)])
    return Series(steps=np.asarray(shared), values=np.stack(values).astype(float))


def layer_names(run: Run, probe: str, key: str, n: int) -> list[str]:
    """The `n` layer names stored in ``probe_settings[probe][key]`` (e.g. sparsity ``layers``, weights
    ``elephant_layers``), or ``layer 0 .. n-1`` if they are missing or do not match. Module paths that are bare
    indices (``"1"``, a ``Sequential``'s child) read ``module 1``, so a legend never shows a lone number."""
    names = run.attrs.get("probe_settings", {}).get(probe, {}).get(key)
    if isinstance(names, list) and len(names) == n:
        return [f"module {name}" if str(name).isdigit() else str(name) for name in names]
    return [f"layer {i}" for i in range(n)]


def model_layers(run: Run) -> list[tuple[str, str, str]]:
    """``(module path, kind, class name)`` of the probed model's layers (kinds of :data:`reports.labels.LAYER_KINDS`),
    in model order, from the probe settings in the run log: the weights probe's ``modules`` where it recorded them;
    else pieced together from the layers the probes name (plasticity's ``linear_layers`` and ``layers``, sparsity's
    ``layers``, the weights probe's ``*_layers`` and its parameters' modules, kind ``param``)."""
    settings = run.attrs.get("probe_settings", {})
    if not isinstance(settings, Mapping):
        return []
    modules = (settings.get("weights") or {}).get("modules")
    if isinstance(modules, list) and all(isinstance(m, list) and len(m) == 3 for m in modules):
        return [(str(n), str(k), str(c)) for n, k, c in modules]
    kinds: dict[str, str] = {}

    def note(names: Any, kind: str) -> None:
        for name in names if isinstance(names, list) else ():
            if kind != "param" or kinds.get(str(name), "param") == "param":
                kinds[str(name)] = kind

    weights = settings.get("weights") or {}
    note([str(p).rpartition(".")[0] for p in weights.get("parameters") or [] if "." in str(p)], "param")
    plasticity = settings.get("plasticity") or {}
    note(plasticity.get("linear_layers"), "linear")
    note(plasticity.get("layers"), "activation")
    note((settings.get("sparsity") or {}).get("layers"), "activation")
    for key, names in weights.items():
        if key.endswith("_layers"):
            note(names, "activation")
    return [(name, kind, "") for name, kind in kinds.items()]


def entry_labels(run: Run, probe: str, key: str, n: int) -> tuple[list[str], dict[str, str]]:
    """The `n` entries of a per-layer field named as a reader does (:func:`reports.labels.layer_labels`, one naming
    for all of the run's probes: ``hidden 1``, ``activation 1``, ``output``; parameters ``hidden 1 weight``), and
    ``{label: module path}`` of the layers named. The names come from ``probe_settings[probe][key]``; without them
    (or not `n` of them) ``layer 0 .. n-1`` (:func:`layer_names`) and no paths."""
    names = run.attrs.get("probe_settings", {}).get(probe, {}).get(key)
    if not (isinstance(names, list) and len(names) == n):
        return layer_names(run, probe, key, n), {}
    names = [str(name) for name in names]
    labels = layer_labels(model_layers(run))
    if key == "parameters":
        modules = [name.rpartition(".")[0] for name in names]
        shown = parameter_labels(names, labels)
    else:
        modules = names
        shown = [labels.get(name, f"module {name}" if name.isdigit() else name) for name in names]
    paths = {labels[m]: m for m in dict.fromkeys(modules) if m in labels and labels[m] != m}
    return shown, paths


# --- record selection ---------------------------------------------------------------


def mean_sem(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error ``std(ddof=1) / sqrt(n)`` of ``values`` (NaN for the SE of fewer than 2)."""
    v = np.asarray(values, dtype=float)
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else math.nan


#: the verdict of a comparison where a side has a single seed: it has no SE, so no claim either way
NO_SE = "one seed: no SE"


def format_mean_sem(mean: float, sem: float, digits: int = 2) -> str:
    """``5.58 ± 0.06`` (the mean alone where the SE is NaN)."""
    return f"{mean:.{digits}f} ± {sem:.{digits}f}" if math.isfinite(sem) else f"{mean:.{digits}f}"


def summary_mean(runs: Sequence[Run], key: str) -> float:
    """Mean of ``key`` over the ``summary.json`` files beside the runs' logs (NaN where none has it)."""
    values = []
    for run in runs:
        try:
            values.append(float(json.loads((Path(run.path).parent / "summary.json").read_text())[key]))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return float(np.mean(values)) if values else math.nan


def training_length(run: Run) -> int:
    """The last step of any record in the run (0 if it has none)."""
    last = [int(c["step"].max()) for c in run.probes.values() if len(c["step"])]
    last += [int(steps.max()) for steps, _ in run.scalars.values() if len(steps)]
    return max(last, default=0)


def run_end(run: Run) -> str | None:
    """How the run ended (one of :data:`runlog.RUN_END`: ``"finished"``, ``"interrupted"``, ``"nan"``), from
    its ``run_end`` scalar; None for a log without one (still running, killed, or written by another tool)."""
    steps, values = run.scalars.get("run_end", ((), ()))
    return RUN_END[int(values[-1])] if len(values) else None


def finished(run: Run) -> bool:
    """Whether the run reached its end: its ``run_end`` is ``"finished"``; False where the log has a ``run_end``
    series without its record (our writers declare it: the run is still being written, or was killed); for a log
    without that series (another tool's), its last record is within the last 1% of the config's ``n_timesteps``
    (True if the config has none)."""
    end = run_end(run)
    if end is not None:
        return end == "finished"
    if END in run.scalars:
        return False
    total = run.config.get("n_timesteps")
    return total is None or training_length(run) >= int(total) - int(total) // 100


def default_steps(run: Run) -> list[int]:
    """The midpoint and end of training, ``[T // 2, T]`` with ``T`` = `training_length`."""
    end = training_length(run)
    return [end // 2, end]


def nearest_record(run: Run, probe: str, field: str, step: int) -> Record | None:
    """The record of `field` nearest to `step` (the earlier one on a tie); None if there is none."""
    found = _field(run, probe, field)
    if found is None:
        return None
    steps, values = found
    i = int(np.argmin(np.abs(steps.astype(np.int64) - int(step))))
    return Record(step=int(steps[i]), target=int(step), seed=run.seed, value=np.asarray(values[i]))


def select_records(run: Run, probe: str, field: str, steps: Sequence[int] | None = None) -> list[Record]:
    """Nearest records to each of `steps` (default: the midpoint and end of training); empty if none."""
    targets = default_steps(run) if steps is None else steps
    records = [nearest_record(run, probe, field, s) for s in targets]
    return [r for r in records if r is not None]


# --- what a run holds ---------------------------------------------------------------


def gradcov_losses(run: Run) -> list[str]:
    """Loss names of the gradient-covariance matrices in the run (fields holding ``(k, k)`` records)."""
    columns = run.probes.get("gradcov", {})
    return [name for name, values in columns.items() if name != "step" and values.ndim == 3]


def ntk_kind(run: Run) -> str | None:
    """``"matrix"`` (``(N, N)`` or ``(N, N, O, O)`` kernel), ``"current"`` (``(N,)`` kernel against the sample
    being learned), or None if the run has no NTK records."""
    if _field(run, "ntk", "kernel") is None:
        return None
    return "current" if run.probes["ntk"]["kernel"].ndim == 2 else "matrix"


def current_ntk(run: Run, steps: Sequence[int] | None = None) -> list[CurrentNTK]:
    """The against-current NTK records nearest to `steps` (default: midpoint and end of training)."""
    inputs = probe_inputs(run)
    out = []
    for kernel in select_records(run, "ntk", "kernel", steps):
        x_t = nearest_record(run, "ntk", "x_t", kernel.step)
        out.append(CurrentNTK(step=kernel.step, seed=run.seed, kernel=kernel.value,
                              x_t=None if x_t is None else x_t.value, inputs=inputs))
    return out


def probe_inputs(run: Run) -> np.ndarray | None:
    """The run's fixed probe inputs ``(N, *obs_shape)``, or None."""
    found = _field(run, "inputs", "x")
    return None if found is None else np.asarray(found[1][0])


def ntk_matrix(kernel: np.ndarray) -> np.ndarray:
    """An ``(N, N)`` kernel as is; an ``(N, N, O, O)`` one traced over its outputs."""
    return np.trace(kernel, axis1=2, axis2=3) if kernel.ndim == 4 else kernel


@dataclass(frozen=True)
class DistanceCurve(_OverRuns):
    """Normalised NTK ``K_ij / sqrt(K_ii K_jj)`` against the distance ``||x_i - x_j||`` between probe inputs, binned:
    ``steps`` holds the bin centres ``(B,)`` and ``values`` ``(R, B)`` each run's mean over its pairs in each bin
    (NaN where a run has none); ``step`` is the training step of the records used (the last one of each run)."""

    step: int = 0


def ntk_vs_distance(runs: Sequence[Run], bins: int = 12) -> DistanceCurve | None:
    """How fast the NTK decays with input distance, per run at its last NTK record (``(N, N)`` kernels on logged
    probe inputs; pairs ``i != j``), on bins shared by the runs from 0 to their largest distance; None if no run
    has both."""
    pairs = []
    for run in runs:
        inputs, found = probe_inputs(run), _field(run, "ntk", "kernel")
        if inputs is None or found is None or found[1].ndim not in (3, 5):
            continue
        kernel = ntk_matrix(found[1][-1])
        x = inputs.reshape(len(inputs), -1).astype(np.float64)
        if kernel.shape != (len(x), len(x)):
            continue
        diag = np.sqrt(np.clip(np.diag(kernel), 1e-30, None))
        i, j = np.triu_indices(len(x), k=1)
        pairs.append((int(found[0][-1]), np.linalg.norm(x[i] - x[j], axis=1), kernel[i, j] / (diag[i] * diag[j])))
    if not pairs:
        return None
    top = max(float(d.max()) for _, d, _ in pairs) or 1.0
    edges = np.linspace(0.0, top, bins + 1)
    values = np.full((len(pairs), bins), np.nan)
    for r, (_, dist, k) in enumerate(pairs):
        which = np.clip(np.digitize(dist, edges) - 1, 0, bins - 1)
        for b in range(bins):
            if np.any(which == b):
                values[r, b] = k[which == b].mean()
    return DistanceCurve(steps=(edges[:-1] + edges[1:]) / 2, values=values, step=max(s for s, _, _ in pairs))


# --- what a probe's fields mean -------------------------------------------------------


def probe_schema(run: Run, probe: str) -> ProbeSchema:
    """The schema of ``probe``: the one stored in the run log; for logs written before schemas were stored, the
    registered probe's (:data:`probes.PROBES`); else an empty one titled by the probe's name."""
    stored = run.attrs.get("probe_schema", {}).get(probe)
    if stored:
        try:
            return ProbeSchema.from_json(stored)
        except ValueError:
            warnings.warn(f"{run.path}: the stored schema of probe {probe!r} is unreadable; using the registry's")
    from probes import PROBES  # imports torch: only for old logs

    cls = PROBES.get(probe)
    return cls.schema if cls is not None and cls.schema is not None else ProbeSchema(probe)


def field_doc(run: Run, probe: str, field: str) -> FieldDoc:
    """The doc of one probe field: declared in its schema, or by its per-record shape (:func:`default_doc`)."""
    doc = probe_schema(run, probe).doc(field)
    if doc is None:
        values = run.probes.get(probe, {}).get(field)
        doc = default_doc(tuple(values.shape[1:]) if values is not None else ())
    return doc


def probe_fields(runs: Iterable[Run]) -> dict[str, list[str]]:
    """``{probe: [field, ...]}`` over ``runs`` in first-seen order (``step`` and the probe inputs left out)."""
    out: dict[str, list[str]] = {}
    for run in runs:
        for probe, columns in run.probes.items():
            if probe != "inputs":
                names = out.setdefault(probe, [])
                names += [f for f in columns if f != "step" and f not in names]
    return out
