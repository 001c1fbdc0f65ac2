"""Streaming regression on sin(pi x) (the paper's section 5.1): Table tb:sin, Figure 2a and Figure 2b from run logs.

Reads the run logs that ``python -m agents.train stream-sin`` and ``... edit`` write (``algo`` ``"stream-sin"``:
scalar ``test_mse`` after each sample, probes ``outputs``/``ntk``/``inputs`` at a few steps; ``algo`` ``"edit"``:
one record of probe ``edit``) and compares them with the paper's numbers in :mod:`reports.paper`.

The first half of this module only reads (numpy, dataclasses); the second half draws (matplotlib figures built
without pyplot); the last part writes the report and is the command line::

    python -m reports.stream RUNS_DIR [RUNS_DIR ...] -o OUT/ [--seeds-note TEXT] [--steps 1,50,200]

Selection follows the paper's appendix: per method, the learning rate (for SR-NN also the activation, the Set-KL
weight lambda > 0 and the target sparsity beta) whose final test MSE, averaged over seeds, is lowest; the table
reports mean +- standard error (``std(ddof=1) / sqrt(n)``) over seeds of the final test MSE at that setting.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from probes.runlog import Run, RunLogError

from . import data, paper, plots
from .cli import load_runs, output_dir, steps_arg
from .html import Table, write_index

__all__ = [
    "STREAM_ALGO", "EDIT_ALGO", "TABLE_CAPTION", "SweepRow", "StreamRow", "SineSnapshot", "EditRecord", "EditRow",
    "EditTable", "is_stream_run", "is_edit_run", "method_of", "config_label", "final_mse", "incomplete_runs",
    "lr_sweep", "stream_table", "best_runs", "sine_snapshots", "edit_records", "edit_table", "sine_panels",
    "mse_curves", "edit_figure", "stream_markdown", "sweep_markdown", "edit_markdown", "build_stream_report",
    "main",
]

STREAM_ALGO = "stream-sin"
EDIT_ALGO = "edit"
TABLE_CAPTION = (
    "Final test MSE on sin(pi x) (test MSE after the last sample of the stream), mean ± standard error "
    "(std with ddof=1 / sqrt(n)) over n seeds, at the learning rate with the lowest mean final test MSE; for SR-NN "
    "the best over activation × lambda (> 0) × beta × learning rate. Paper (tb:sin): 5 runs, standard errors.")
_METHOD_ORDER = tuple(paper.METHOD_NAMES)
# Config keys that are not settings of the experiment as a whole: the sweep axes and bookkeeping.
_SWEPT = {"seed", "seeds", "lr", "act", "srnn_lambda", "srnn_beta", "command", "probe", "probe_at"}
_ELEPHANT_KEYS = {"d", "a", "h", "sigma_bias"}  # only matter for Elephant runs
_FIG2A_METHODS = ("elephant", "relu", "srnn")


# ====================================================================================
# Reading: run logs -> numbers
# ====================================================================================


def is_stream_run(run: Run) -> bool:
    """Whether `run` is a ``stream-sin`` run log."""
    return run.config.get("algo") == STREAM_ALGO


def is_edit_run(run: Run) -> bool:
    """Whether `run` is an ``edit`` run log."""
    return run.config.get("algo") == EDIT_ALGO


def _lambda(run: Run) -> float:
    return float(run.config.get("srnn_lambda") or 0.0)


def method_of(run: Run) -> str:
    """``"srnn"`` for a classical activation with Set-KL weight lambda > 0, ``"elephant-srnn"`` for Elephant with
    lambda > 0 (not in the paper), otherwise the activation (``"relu"``, ``"elephant"``, ...)."""
    act = str(run.config.get("act"))
    if _lambda(run) > 0:
        return "elephant-srnn" if act == "elephant" else "srnn"
    return act


def config_label(run: Run) -> str:
    """The setting apart from the learning rate: ``"relu"`` or ``"tanh lambda=0.1 beta=0.05"``."""
    act = str(run.config.get("act"))
    if _lambda(run) > 0:
        return f"{act} lambda={_lambda(run):g} beta={float(run.config.get('srnn_beta', math.nan)):g}"
    return act


def final_mse(run: Run) -> float | None:
    """Test MSE at the last step of the stream; None if the run has no ``test_mse`` or has not reached step
    ``config["n"]`` (still running or cut off)."""
    steps, values = run.scalars.get("test_mse", (np.empty(0), np.empty(0)))
    if len(steps) == 0:
        return None
    n = run.config.get("n")
    if isinstance(n, int) and int(steps.max()) < n:
        return None
    return float(values[int(np.argmax(steps))])


def incomplete_runs(runs: Iterable[Run]) -> list[str]:
    """Paths of the stream runs without a final test MSE (see `final_mse`); the tables leave them out."""
    return [r.path for r in runs if is_stream_run(r) and final_mse(r) is None]


def _differing(runs: Sequence[Run], keys: Iterable[str]) -> dict[str, list]:
    """``{key: distinct values}`` for the `keys` whose values differ between `runs`."""
    out = {}
    for key in keys:
        values = {json.dumps(r.config.get(key), sort_keys=True, default=str) for r in runs}
        if len(values) > 1:
            out[key] = sorted(values)
    return out


def _check_settings(runs: Sequence[Run], what: str, ignore: set[str], per_act: set[str] = frozenset()) -> None:
    """ValueError if `runs` differ in a config key outside `ignore` (keys in `per_act` only within an
    activation): they would belong to different experiments."""
    keys = {k for r in runs for k in r.config} - set(ignore)
    diff = _differing(runs, keys - set(per_act))
    for act in sorted({str(r.config.get("act")) for r in runs}):
        for key, values in _differing([r for r in runs if str(r.config.get("act")) == act],
                                      keys & set(per_act)).items():
            diff[f"{key} ({act})"] = values
    if diff:
        detail = "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(diff.items()))
        raise ValueError(f"{what} runs from different experiments (settings differ: {detail}); "
                         "pass the directories of one experiment")


def _lr(run: Run) -> float:
    return float(run.config.get("lr", math.nan))


def _key(run: Run) -> tuple[str, str, float]:
    return method_of(run), config_label(run), _lr(run)


def _method_rank(method: str) -> tuple[int, str]:
    return (_METHOD_ORDER.index(method), "") if method in _METHOD_ORDER else (len(_METHOD_ORDER), method)


def _mean_sem(values: Sequence[float]) -> tuple[float, float]:
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return math.nan, math.nan
    sem = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan
    return float(v.mean()), sem


@dataclass(frozen=True)
class SweepRow:
    """Final test MSE of one setting (method config, learning rate) over its seeds."""

    method: str
    config_label: str
    lr: float
    mean: float
    sem: float  # std(ddof=1) / sqrt(n); NaN with one seed
    n_seeds: int
    seeds: tuple[int, ...]
    values: tuple[float, ...]  # final test MSE of each seed, in `seeds` order


@dataclass(frozen=True)
class StreamRow:
    """One row of Table tb:sin: a method at its selected setting, and the paper's value (None if it has none)."""

    method: str
    config_label: str
    best_lr: float
    mean: float
    sem: float
    n_seeds: int
    paper_mean: float | None
    paper_sem: float | None


def _grouped(runs: Iterable[Run]) -> dict[tuple[str, str, float], list[Run]]:
    """Complete stream runs by setting, seeds sorted; ValueError on mixed experiments or a repeated seed."""
    stream = [r for r in runs if is_stream_run(r)]
    _check_settings(stream, "stream-sin", _SWEPT | {"algo"}, _ELEPHANT_KEYS)
    groups: dict[tuple[str, str, float], list[Run]] = {}
    for run in stream:
        if final_mse(run) is None:
            continue
        group = groups.setdefault(_key(run), [])
        twin = next((r for r in group if r.seed == run.seed), None)
        if twin is not None:
            raise ValueError(f"seed {run.seed} of {config_label(run)} lr={_lr(run):g} appears twice: "
                             f"{twin.path} and {run.path}")
        group.append(run)
    order = sorted(groups, key=lambda k: (_method_rank(k[0]), k[1], -k[2]))
    return {k: sorted(groups[k], key=lambda r: r.seed) for k in order}


def lr_sweep(runs: Iterable[Run]) -> list[SweepRow]:
    """Mean final test MSE per (method config, learning rate), over the seeds of each; for a sensitivity table.

    Rows in the paper's method order, then by config label, then learning rate from large to small. Only
    ``stream-sin`` runs that reached the end of the stream count. Raises ValueError if the runs come from
    different experiments (e.g. different stream lengths or widths) or a seed appears twice in a setting.
    """
    rows = []
    for (method, label, lr), group in _grouped(runs).items():
        values = tuple(final_mse(r) for r in group)
        mean, sem = _mean_sem(values)
        rows.append(SweepRow(method, label, lr, mean, sem, len(group), tuple(r.seed for r in group), values))
    return rows


def _best(rows: Iterable[SweepRow]) -> SweepRow:
    """The row with the lowest mean (NaN/inf count as worst; ties: the first)."""
    return min(rows, key=lambda r: r.mean if math.isfinite(r.mean) else math.inf)


def stream_table(runs: Iterable[Run]) -> list[StreamRow]:
    """Table tb:sin from run logs: per method its best setting (lowest mean final test MSE over seeds) with mean
    ± standard error over seeds there, next to the paper's value.

    Methods: each plain activation (``srnn_lambda == 0``) with the learning rate selected, and ``"srnn"`` with
    activation, lambda, beta and learning rate selected together. In the paper's order (ReLU, Sigmoid, Tanh, ELU,
    SR-NN, Elephant), methods without a paper value after them.
    """
    by_method: dict[str, list[SweepRow]] = {}
    for row in lr_sweep(runs):
        by_method.setdefault(row.method, []).append(row)
    out = []
    for method, rows in by_method.items():
        best = _best(rows)
        ref = paper.SIN_TABLE.get(method)
        out.append(StreamRow(method, best.config_label, best.lr, best.mean, best.sem, best.n_seeds,
                             None if ref is None else ref[0], None if ref is None else ref[1]))
    return out


def best_runs(runs: Iterable[Run], methods: Sequence[str] | None = None) -> dict[str, Run]:
    """``{label: run}``: per method the lowest seed at its selected setting, labelled e.g. ``"Elephant (lr
    0.0003)"`` or ``"SR-NN (tanh lambda=0.1 beta=0.1, lr 0.001)"``. `methods` default: Elephant, ReLU and SR-NN
    (Figure 2a), those present; all methods if none of them is."""
    runs = list(runs)
    groups = _grouped(runs)
    table = {row.method: row for row in stream_table(runs)}
    wanted = list(methods) if methods is not None else ([m for m in _FIG2A_METHODS if m in table] or list(table))
    out = {}
    for method in wanted:
        row = table.get(method)
        if row is None:
            continue
        out[_row_label(row)] = groups[(method, row.config_label, row.best_lr)][0]
    return out


def _row_label(row: StreamRow) -> str:
    setting = "" if row.config_label == row.method else f"{row.config_label}, "
    return f"{paper.method_name(row.method)} ({setting}lr {row.best_lr:g})"


@dataclass(frozen=True)
class SineSnapshot:
    """The learned function and the NTK against the current sample at one probe step of a stream run.

    x: ``(N,)`` probe inputs, increasing; f: ``(N,)`` learned f(x); ntk: ``(N,)`` normalised NTK(x, x_t) or None;
    x_t: the sample being learned (None if not logged).
    """

    step: int
    seed: int
    x: np.ndarray
    f: np.ndarray
    ntk: np.ndarray | None
    x_t: float | None


def _record_steps(run: Run, probe: str) -> list[int]:
    columns = run.probes.get(probe, {})
    return sorted({int(s) for s in columns.get("step", ())})


def _spread(steps: list[int], k: int) -> list[int]:
    """At most `k` of `steps`, evenly spaced, first and last kept."""
    if len(steps) <= k:
        return steps
    return [steps[i] for i in sorted({round(j * (len(steps) - 1) / (k - 1)) for j in range(k)})]


def sine_snapshots(run: Run, steps: Sequence[int] | None = None, max_steps: int = 6) -> list[SineSnapshot]:
    """Snapshots at the ``outputs`` records nearest to `steps` (default: the recorded steps, at most
    `max_steps` of them evenly spaced). Empty if the run has no ``outputs`` records or no probe inputs."""
    inputs = data.probe_inputs(run)
    if inputs is None or "y" not in run.probes.get("outputs", {}):
        return []
    x = np.asarray(inputs, dtype=float).reshape(len(inputs), -1)[:, 0]
    order = np.argsort(x, kind="stable")
    targets = _spread(_record_steps(run, "outputs"), max_steps) if steps is None else list(steps)
    out: list[SineSnapshot] = []
    for target in targets:
        rec = data.nearest_record(run, "outputs", "y", target)
        if rec is None or any(s.step == rec.step for s in out):
            continue
        f = np.asarray(rec.value, dtype=float).reshape(len(x), -1)[:, 0]
        kernel = data.nearest_record(run, "ntk", "kernel", rec.step)
        x_t = data.nearest_record(run, "ntk", "x_t", rec.step)
        kernel = kernel if kernel is not None and kernel.step == rec.step else None
        x_t = x_t if x_t is not None and x_t.step == rec.step else None
        out.append(SineSnapshot(step=rec.step, seed=run.seed, x=x[order], f=f[order],
                                ntk=None if kernel is None else np.asarray(kernel.value, dtype=float)[order],
                                x_t=None if x_t is None else float(np.asarray(x_t.value).reshape(-1)[0])))
    return out


@dataclass(frozen=True)
class EditRecord:
    """One seed's edit: predictions on the grid `x` before and after moving the target at ``x_edit``."""

    act: str
    seed: int
    x: np.ndarray
    before: np.ndarray
    after: np.ndarray
    far_change: float  # mean |after - before| where |x - x_edit| > far
    steps: int  # gradient steps the edit took
    pretrain_mse: float
    x_edit: float
    target: float
    far: float


@dataclass(frozen=True)
class EditRow:
    """Far change of one activation over its seeds (mean ± standard error), and the edit's gradient steps."""

    act: str
    mean_far_change: float
    sem_far_change: float
    mean_steps: float
    min_steps: int
    max_steps: int
    mean_pretrain_mse: float
    n_seeds: int


@dataclass(frozen=True)
class EditTable:
    """Rows per activation (Elephant, ReLU first) and ``ratio`` = ReLU mean far change / Elephant's (None
    unless both are present)."""

    rows: list[EditRow]
    ratio: float | None
    x_edit: float
    target: float
    far: float


def edit_records(edit_runs: Iterable[Run]) -> dict[str, list[EditRecord]]:
    """``{act: [record per seed]}`` of the ``edit`` run logs (others and logs without an ``edit`` record are left
    out), Elephant and ReLU first, seeds sorted. ValueError if the runs differ in settings other than the
    activation, or a seed of an activation appears twice."""
    runs = [r for r in edit_runs if is_edit_run(r) and len(r.probes.get("edit", {}).get("step", ()))]
    _check_settings(runs, "edit", {"act", "seed", "seeds", "command", "lr"}, _ELEPHANT_KEYS)
    out: dict[str, list[EditRecord]] = {}
    for run in runs:
        c = run.probes["edit"]
        act = str(run.config.get("act"))
        rec = EditRecord(act=act, seed=run.seed, x=np.asarray(c["x"][0], dtype=float),
                         before=np.asarray(c["before"][0], dtype=float), after=np.asarray(c["after"][0], dtype=float),
                         far_change=float(c["far_change"][0]), steps=int(c["steps"][0]),
                         pretrain_mse=float(c["pretrain_mse"][0]), x_edit=float(run.config.get("x_edit", math.nan)),
                         target=float(run.config.get("target", math.nan)), far=float(run.config.get("far", math.nan)))
        if any(r.seed == rec.seed for r in out.get(act, [])):
            raise ValueError(f"edit: seed {rec.seed} of {act} appears twice ({run.path})")
        out.setdefault(act, []).append(rec)
    first = ("elephant", "relu")
    acts = sorted(out, key=lambda a: (first.index(a) if a in first else 2, _method_rank(a)))
    return {a: sorted(out[a], key=lambda r: r.seed) for a in acts}


def edit_table(edit_runs: Iterable[Run]) -> EditTable:
    """Mean far change ± standard error over seeds and the edit's gradient steps per activation, and the
    ReLU / Elephant ratio of mean far changes. ValueError if there are no edit records."""
    records = edit_records(edit_runs)
    if not records:
        raise ValueError("edit_table: no edit run logs")
    return _table_of(records)


def _table_of(records: Mapping[str, list[EditRecord]]) -> EditTable:
    rows = []
    for act, recs in records.items():
        mean, sem = _mean_sem([r.far_change for r in recs])
        steps = [r.steps for r in recs]
        rows.append(EditRow(act, mean, sem, float(np.mean(steps)), min(steps), max(steps),
                            float(np.mean([r.pretrain_mse for r in recs])), len(recs)))
    by_act = {r.act: r for r in rows}
    ratio = None
    if "relu" in by_act and "elephant" in by_act and by_act["elephant"].mean_far_change > 0:
        ratio = by_act["relu"].mean_far_change / by_act["elephant"].mean_far_change
    one = next(iter(records.values()))[0]
    return EditTable(rows, ratio, one.x_edit, one.target, one.far)


# ====================================================================================
# Plotting: numbers -> matplotlib figures (no pyplot)
# ====================================================================================

_PANEL_W, _PANEL_H = 2.6, 2.2


def sine_panels(runs_by_label: Mapping[str, Run], steps: Sequence[int] | None = None) -> Figure:
    """Figure 2a: one row per method, one column per probe step (nearest ``outputs`` records to `steps`,
    default the recorded ones, at most 6): true sin(pi x), learned f(x), normalised NTK(x, x_t) and the sample
    x_t (dotted line, dot at (x_t, y_t)); one legend for the figure. ValueError if no run has snapshots."""
    rows = {label: snaps for label, run in runs_by_label.items() if (snaps := sine_snapshots(run, steps))}
    if not rows:
        raise ValueError("sine_panels: no run has 'outputs' probe records with probe inputs")
    n_cols = max(len(s) for s in rows.values())
    fig = Figure(figsize=(_PANEL_W * n_cols + 0.6, _PANEL_H * len(rows) + 0.7), layout="constrained")
    axes = fig.subplots(len(rows), n_cols, squeeze=False, sharex=True)
    handles: dict[str, object] = {}
    for r, (label, snaps) in enumerate(rows.items()):
        for c in range(n_cols):
            ax = axes[r, c]
            if c >= len(snaps):
                ax.set_axis_off()
                continue
            s = snaps[c]
            lines = {r"true $\sin(\pi x)$": ax.plot(s.x, np.sin(np.pi * s.x), color="k", ls="--", lw=1)[0],
                     r"learned $f(x)$": ax.plot(s.x, s.f, color="C0", lw=1.5)[0]}
            if s.ntk is not None:
                lines[r"normalised NTK$(x, x_t)$"] = ax.plot(s.x, s.ntk, color="C3", lw=1.2)[0]
            if s.x_t is not None:
                lines[r"$x_t$"] = ax.axvline(s.x_t, color="0.45", ls=":", lw=1)
                lines[r"sample $(x_t, y_t)$"] = ax.plot([s.x_t], [np.sin(np.pi * s.x_t)], "o", color="C2", ms=4)[0]
            for name, handle in lines.items():
                handles.setdefault(name, handle)
            finite = s.f[np.isfinite(s.f)]
            lo = max(-4.0, min(-1.6, float(finite.min()) if len(finite) else -1.6))
            hi = min(4.0, max(1.6, float(finite.max()) if len(finite) else 1.6))
            ax.set_ylim(lo, hi)
            ax.set_xlim(float(s.x[0]), float(s.x[-1]))
            ax.axhline(0.0, color="0.85", lw=0.6, zorder=0)
            ax.set_title(f"t = {s.step}", fontsize=9)
            ax.tick_params(labelsize=7)
            if r == len(rows) - 1:
                ax.set_xlabel("x", fontsize=8)
        axes[r, 0].set_ylabel(f"{label.replace(' (', chr(10) + '(')}\nseed {snaps[0].seed}", fontsize=8)
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center", ncol=len(handles),
               fontsize=8, frameon=False)
    fig.suptitle("Streaming regression on sin(pi x): learned function and NTK against the current sample",
                 fontsize=10)
    return fig


def mse_curves(runs_by_label: Mapping[str, Sequence[Run]]) -> Figure | None:
    """Test MSE after each sample, ``{label: runs}`` (e.g. each method at its selected setting): mean over
    seeds, shaded ± standard error, log y axis. None if no run has ``test_mse``."""
    curves = {f"{label}": c for label, runs in runs_by_label.items()
              if (c := data.learning_curve(runs, "test_mse", num=max(_stream_length(runs), 2))) is not None}
    if not curves:
        return None
    fig = plots.mean_curves({"test MSE": curves}, title="Test MSE during the stream")
    ax = fig.axes[0]
    ax.set_yscale("log")
    ax.set_xlabel("samples seen")
    return fig


def _stream_length(runs: Sequence[Run]) -> int:
    return max((int(r.scalars["test_mse"][0].max()) for r in runs
                if "test_mse" in r.scalars and len(r.scalars["test_mse"][0])), default=2)


def edit_figure(edit_runs: Iterable[Run]) -> Figure:
    """Figure 2b: per activation (lowest seed) the learned function before and after editing the target at
    ``x_edit``, with the edit point and the excluded band ``|x - x_edit| <= far`` marked; last panel the far
    change per activation, mean ± standard error over seeds (bars) and each seed (dots). ValueError if there
    are no edit records."""
    records = edit_records(edit_runs)
    if not records:
        raise ValueError("edit_figure: no edit run logs")
    table = _table_of(records)
    n = len(records) + 1
    fig = Figure(figsize=(3.3 * n, 3.2), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    for ax, (act, recs) in zip(axes, records.items()):
        rec = recs[0]
        ax.axvspan(rec.x_edit - rec.far, rec.x_edit + rec.far, color="0.92", lw=0, label=f"|x - x_edit| <= {rec.far:g}")
        ax.plot(rec.x, np.sin(np.pi * rec.x), color="k", ls="--", lw=1, label=r"$\sin(\pi x)$")
        ax.plot(rec.x, rec.before, color="C0", lw=1.5, label="before edit")
        ax.plot(rec.x, rec.after, color="C3", lw=1.5, label="after edit")
        ax.plot([rec.x_edit], [rec.target], "*", color="C2", ms=10,
                label=f"new target ({rec.x_edit:g}, {rec.target:g})")
        ax.set_title(f"{paper.method_name(act)} (seed {rec.seed}): far change {rec.far_change:.3g}", fontsize=9)
        ax.set_xlabel("x")
        shown = np.concatenate([rec.before, rec.after, [rec.target]])
        shown = shown[np.isfinite(shown)]
        ax.set_ylim(max(-4.0, min(-1.2, float(shown.min()) - 0.2)), min(4.0, max(1.2, float(shown.max()) + 0.2)))
        ax.tick_params(labelsize=7)
    axes[0].set_ylabel("f(x)")
    axes[0].legend(fontsize=6, loc="upper right")
    ax = axes[-1]
    names = [paper.method_name(r.act) for r in table.rows]
    means = np.array([r.mean_far_change for r in table.rows])
    sems = np.nan_to_num(np.array([r.sem_far_change for r in table.rows]))
    pos = np.arange(len(names))
    ax.bar(pos, means, yerr=sems, color=[f"C{i % 10}" for i in range(len(names))], alpha=0.6, capsize=4)
    for i, recs in enumerate(records.values()):
        ax.plot(np.full(len(recs), float(i)), [r.far_change for r in recs], "o", color="k", ms=3)
    ax.set_xticks(pos, names, fontsize=8)
    ax.set_ylabel(f"mean |after - before|, |x - x_edit| > {table.far:g}", fontsize=8)
    title = "far change, mean ± SE over seeds"
    if table.ratio is not None:
        title += f"\nReLU / Elephant = {table.ratio:.3g}"
    ax.set_title(title, fontsize=9)
    fig.suptitle(f"Editing f({table.x_edit:g}) to {table.target:g}", fontsize=10)
    return fig


# ====================================================================================
# Tables as text, the report, the command line
# ====================================================================================


def _num(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a" if x is None or math.isnan(x) else str(x)
    return f"{x:.4f}" if x == 0 or abs(x) >= 1e-3 else f"{x:.2e}"


def _pm(mean: float | None, sem: float | None) -> str:
    """``0.0081 ± 0.0009`` (four decimals, as the paper), scientific notation for what would print as zero."""
    if mean is None:
        return "–"
    if sem is None or math.isnan(sem):
        return _num(mean)
    err = f"{sem:.4f}" if sem == 0 or sem >= 5e-5 or not math.isfinite(sem) else f"{sem:.1e}"
    return f"{_num(mean)} ± {err}"


def _stream_cells(rows: Sequence[StreamRow]) -> tuple[list[str], list[list[str]]]:
    columns = ["Method", "Selected setting", "Best lr", "Measured MSE (mean ± SE)", "Seeds", "Paper MSE (mean ± SE)"]
    cells = [[paper.method_name(r.method), r.config_label, f"{r.best_lr:g}", _pm(r.mean, r.sem), str(r.n_seeds),
              _pm(r.paper_mean, r.paper_sem)] for r in rows]
    return columns, cells


def _sweep_cells(rows: Sequence[SweepRow]) -> tuple[list[str], list[list[str]]]:
    columns = ["Method", "Setting", "lr", "Mean final MSE ± SE", "Seeds"]
    return columns, [[paper.method_name(r.method), r.config_label, f"{r.lr:g}", _pm(r.mean, r.sem), str(r.n_seeds)]
                     for r in rows]


def _edit_cells(table: EditTable) -> tuple[list[str], list[list[str]]]:
    columns = ["Activation", "Far change (mean ± SE)", "Edit steps (mean, min–max)", "Pretrain MSE (mean)", "Seeds"]
    cells = [[paper.method_name(r.act), _pm(r.mean_far_change, r.sem_far_change),
              f"{r.mean_steps:.1f} ({r.min_steps}–{r.max_steps})", _num(r.mean_pretrain_mse), str(r.n_seeds)]
             for r in table.rows]
    return columns, cells


def _markdown(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return "\n".join([line(columns), line(["---"] * len(columns)), *(line(r) for r in rows)]) + "\n"


def stream_markdown(rows: Sequence[StreamRow], note: str = "") -> str:
    """Table tb:sin, measured next to the paper, as markdown with its caption (and `note`) above."""
    head = f"**Table tb:sin.** {TABLE_CAPTION}" + (f" {note}" if note else "")
    return head + "\n\n" + _markdown(*_stream_cells(rows))


def sweep_markdown(rows: Sequence[SweepRow]) -> str:
    """The learning-rate sensitivity table as markdown."""
    return ("**Learning-rate sweep.** Final test MSE per setting, mean ± standard error over seeds.\n\n"
            + _markdown(*_sweep_cells(rows)))


def edit_markdown(table: EditTable) -> str:
    """The edit table as markdown, with the ReLU / Elephant ratio of mean far changes below it."""
    head = (f"**Local editing (Figure 2b).** f({table.x_edit:g}) moved to {table.target:g}; far change = mean "
            f"|after - before| over |x - {table.x_edit:g}| > {table.far:g}, mean ± standard error over seeds.\n\n")
    tail = "" if table.ratio is None else f"\nReLU / Elephant mean far change: {table.ratio:.3g}\n"
    return head + _markdown(*_edit_cells(table)) + tail


def _settings(runs: Sequence[Run]) -> str:
    keys = ("n", "n_test", "updates", "width")
    if not runs:
        return ""
    c = runs[0].config
    return ", ".join(f"{k}={c[k]}" for k in keys if k in c)


def build_stream_report(stream_runs: Sequence[Run], edit_runs: Sequence[Run], out_dir: str | os.PathLike,
                        note: str = "", steps: Sequence[int] | None = None) -> Path:
    """Write ``stream_table.md``, the figures (``sine_panels.png``, ``test_mse.png``, ``edit.png``, those the runs
    have data for) and ``index.html`` under `out_dir`; return the path of ``index.html``.

    `note` (e.g. how many seeds, shortened settings) goes under the table caption. `steps`: probe steps of the
    Figure-2a panels (nearest records; default the recorded ones). ValueError if there are neither complete
    stream runs nor edit runs, or the runs mix experiments.
    """
    stream_runs = [r for r in stream_runs if is_stream_run(r)]
    edit_runs = [r for r in edit_runs if is_edit_run(r)]
    rows = stream_table(stream_runs)
    sweep = lr_sweep(stream_runs)
    edits = edit_table(edit_runs) if edit_records(edit_runs) else None
    if not rows and edits is None:
        raise ValueError("no complete stream-sin runs and no edit runs")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tables: list[Table] = []
    sections: dict[str, list[tuple[str, str]]] = {}
    md: list[str] = []
    notes = [["statistic", TABLE_CAPTION]]
    if note:
        notes.append(["note", note])
    if stream_runs:
        notes.append(["stream settings", _settings(stream_runs)])
    skipped = incomplete_runs(stream_runs)
    if skipped:
        notes.append(["left out", f"{len(skipped)} stream run(s) without a final test MSE (unfinished): "
                                  + ", ".join(skipped[:5]) + (" ..." if len(skipped) > 5 else "")])
    if rows:
        md += [stream_markdown(rows, note), sweep_markdown(sweep)]
        tables.append(Table("Table tb:sin: final test MSE, mean ± standard error over seeds at each method's "
                            "best setting (see Notes), measured vs paper", *_stream_cells(rows)))
        best = best_runs(stream_runs)
        try:
            fig = sine_panels(best, steps)
        except ValueError:
            fig = None
        if fig is not None:
            plots.save(fig, out / "sine_panels.png")
            sections.setdefault("Figure 2a: learned function and NTK", []).append(
                ("true sin(pi x), learned f(x) and normalised NTK(x, x_t) at probe steps; each method at its "
                 "selected setting, one seed", "sine_panels.png"))
        groups = _grouped(stream_runs)
        by_method = {_row_label(r): groups[(r.method, r.config_label, r.best_lr)] for r in rows}
        fig = mse_curves(by_method)
        if fig is not None:
            plots.save(fig, out / "test_mse.png")
            sections.setdefault("Test MSE during the stream", []).append(
                ("test MSE after each sample, each method at its selected setting: mean over seeds, "
                 "shaded ± standard error", "test_mse.png"))
    if edits is not None:
        md.append(edit_markdown(edits))
        columns, cells = _edit_cells(edits)
        if edits.ratio is not None:
            notes.append(["ReLU / Elephant far change", f"{edits.ratio:.3g}"])
        tables.append(Table("Local editing (Figure 2b)", columns, cells))
        plots.save(edit_figure(edit_runs), out / "edit.png")
        sections.setdefault("Figure 2b: local editing", []).append(
            (f"f before and after moving the target at x={edits.x_edit:g} to {edits.target:g} (one seed), and "
             "the change far from it per activation (mean ± SE over seeds)", "edit.png"))
    if rows:
        tables.append(Table("Learning-rate sweep: mean final test MSE ± SE per setting", *_sweep_cells(sweep)))
    tables.insert(0, Table("Notes", ["item", "note"], notes))
    (out / "stream_table.md").write_text("\n".join(md), encoding="utf-8")
    return write_index(out, "Streaming regression on sin(pi x) (paper section 5.1)", tables, sections)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m reports.stream RUNS_DIR [...] -o OUT/ [--seeds-note TEXT] [--steps 1,50,200]``: find the
    ``stream-sin`` and ``edit`` run logs, write the report, print the table and the path of ``index.html``.
    Bad input (missing path, not a run log, no stream/edit runs, runs of different experiments, an output path
    that cannot be written): one line on stderr, exit code 2."""
    parser = argparse.ArgumentParser(
        prog="python -m reports.stream",
        description="Table tb:sin and Figure 2 of the paper from stream-sin/edit run logs.")
    parser.add_argument("runs", nargs="+", metavar="RUNS_DIR", help="directory of run logs (or a run log .h5)")
    parser.add_argument("-o", "--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--seeds-note", dest="note", default="",
                        help="text put under the table caption, e.g. '3 seeds, n=200 (paper: 5 seeds)'")
    parser.add_argument("--steps", type=steps_arg, default=None,
                        help="comma-separated probe steps of the Figure-2a panels (default: those recorded)")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(args.runs)
        stream = [r for r in runs if is_stream_run(r)]
        edits = [r for r in runs if is_edit_run(r)]
        if not stream and not edits:
            raise ValueError(f"no stream-sin or edit run logs under {', '.join(args.runs)} "
                             f"({len(runs)} other run log(s))")
        index = build_stream_report(stream, edits, output_dir(args.out), note=args.note, steps=args.steps)
    except (RunLogError, ValueError) as err:
        print(f"error: {err}".replace("\n", " "), file=sys.stderr)
        return 2
    print((Path(args.out) / "stream_table.md").read_text(encoding="utf-8"))
    print(index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
