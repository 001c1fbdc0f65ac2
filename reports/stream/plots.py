"""Streaming regression reports, drawing: numbers -> matplotlib figures (built without pyplot): Figure 2a (learned
functions and NTK rows), the test-MSE curves and Figure 2b (local editing)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from runlog import Run

from .. import data as run_data
from .. import paper
from .. import plots as figures
from .data import _table_of, edit_records, sine_snapshots


#: size of one Figure-2a panel (inches; saved at 100 dpi): six columns make a figure about 1,300 px wide, shown at
#: (nearly) full size on a report page, so the font sizes below are what a reader sees
_PANEL_W, _PANEL_H = 2.05, 2.2
#: font sizes of the Figure-2a panels (points): titles, axis labels, tick labels, legend
_TITLE, _LABEL, _TICK, _LEGEND = 12, 12, 11, 12
#: the y-range of the Figure-2a panels grows with the learned functions up to this bound (beyond: a note in the panel)
_Y_BOUND = 3.0


def shared_ylim(curves: Iterable[np.ndarray], bound: float = _Y_BOUND, least: float = 1.6) -> tuple[float, float]:
    """One y-range for panels of `curves`: at least ``[-least, least]`` (sin and the normalised NTK fit), grown to
    the curves' finite extremes plus a margin, clipped to ``[-bound, bound]``."""
    finite = [c[np.isfinite(c)] for c in curves]
    finite = np.concatenate(finite) if finite else np.empty(0)
    lo = float(finite.min()) - 0.1 if len(finite) else -least
    hi = float(finite.max()) + 0.1 if len(finite) else least
    return max(-bound, min(-least, lo)), min(bound, max(least, hi))


def sine_panels(runs_by_label: Mapping[str, Run], steps: Sequence[int] | None = None) -> Figure:
    """Figure 2a: one row per method, one column per probe step (nearest ``outputs`` records to `steps`,
    default the recorded ones, at most 6): true sin(pi x), learned f(x), normalised NTK(x, x_t) and the sample
    x_t (dotted line, dot at (x_t, y_t)); one legend for the figure. Every panel has the same y-range
    (:func:`shared_ylim`); a panel whose f(x) leaves it says how far. ValueError if no run has snapshots."""
    rows = {label: snaps for label, run in runs_by_label.items() if (snaps := sine_snapshots(run, steps))}
    if not rows:
        raise ValueError("sine_panels: no run has 'outputs' probe records with probe inputs")
    n_cols = max(len(s) for s in rows.values())
    lo, hi = shared_ylim(s.f for snaps in rows.values() for s in snaps)
    fig = Figure(figsize=(_PANEL_W * n_cols + 0.8, _PANEL_H * len(rows) + 0.9), layout="constrained")
    axes = fig.subplots(len(rows), n_cols, squeeze=False, sharex=True, sharey=True)
    handles: dict[str, object] = {}
    for r, (label, snaps) in enumerate(rows.items()):
        for c in range(n_cols):
            ax = axes[r, c]
            if c >= len(snaps):
                ax.set_axis_off()
                continue
            s = snaps[c]
            lines = {r"true $\sin(\pi x)$": ax.plot(s.x, np.sin(np.pi * s.x), color="k", ls="--", lw=1)[0],
                     r"learned $f(x)$": ax.plot(s.x, s.f, color="C0", lw=1.6)[0]}
            if s.ntk is not None:
                lines[r"normalised NTK$(x, x_t)$"] = ax.plot(s.x, s.ntk, color="C3", lw=1.3)[0]
            if s.x_t is not None:
                lines[r"$x_t$"] = ax.axvline(s.x_t, color="0.45", ls=":", lw=1)
                lines[r"sample $(x_t, y_t)$"] = ax.plot([s.x_t], [np.sin(np.pi * s.x_t)], "o", color="C2", ms=5)[0]
            for name, handle in lines.items():
                handles.setdefault(name, handle)
            finite = s.f[np.isfinite(s.f)]
            off = [f"max {finite.max():.3g}" for _ in [0] if len(finite) and finite.max() > hi] + \
                  [f"min {finite.min():.3g}" for _ in [0] if len(finite) and finite.min() < lo]
            if len(finite) < len(s.f):
                off.append("not finite")
            if off:
                ax.text(0.03, 0.03, "f(x) off scale: " + ", ".join(off), transform=ax.transAxes, fontsize=_TICK,
                        color="C0", va="bottom", ha="left")
            ax.set_ylim(lo, hi)
            ax.set_xlim(float(s.x[0]), float(s.x[-1]))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # "0.5", "1": short tick labels
            ax.axhline(0.0, color="0.85", lw=0.6, zorder=0)
            ax.set_title(f"t = {s.step}", fontsize=_TITLE)
            ax.tick_params(labelsize=_TICK)
            if r == len(rows) - 1 or c >= len(rows[list(rows)[r + 1]]):
                ax.set_xlabel("x", fontsize=_LABEL)
        axes[r, 0].set_ylabel(f"{label.replace(' (', chr(10) + '(')}\nseed {snaps[0].seed}", fontsize=_LABEL)
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center", ncol=len(handles),
               fontsize=_LEGEND, frameon=False)
    fig.suptitle("Streaming regression on sin(pi x): learned function and NTK against the current sample "
                 "(t = samples seen)", fontsize=_TITLE + 1)
    return fig


def mse_curves(runs_by_label: Mapping[str, Sequence[Run]]) -> Figure | None:
    """Test MSE after each sample, ``{label: runs}`` (e.g. each method at its selected setting): mean over
    seeds, shaded ± standard error, log y axis. None if no run has ``test_mse``."""
    curves = {f"{label}": c for label, runs in runs_by_label.items()
              if (c := run_data.learning_curve(runs, "test_mse", num=max(_stream_length(runs), 2))) is not None}
    if not curves:
        return None
    colors = figures.group_colors({label: runs[0].config.get("act") for label, runs in runs_by_label.items()
                                   if label in curves})
    fig = figures.mean_curves({"test MSE": curves}, title="Test MSE during the stream", colors=colors)
    ax = fig.axes[0]
    ax.set_yscale("log")
    ax.set_xlabel("samples seen", fontsize=10)
    ax.set_ylabel("test MSE (log scale)", fontsize=10)
    ax.tick_params(labelsize=9)
    if ax.get_legend() is not None:
        ax.legend(fontsize=9)
    return fig


def _stream_length(runs: Sequence[Run]) -> int:
    return max((int(r.scalars["test_mse"][0].max()) for r in runs
                if "test_mse" in r.scalars and len(r.scalars["test_mse"][0])), default=2)


def edit_figure(edit_runs: Iterable[Run]) -> Figure:
    """Figure 2b: per activation (lowest seed) the learned function before and after editing the target at
    ``x_edit``, with the edit point and the excluded band ``|x - x_edit| <= far`` marked, on one y-range; last
    panel the far change per activation, mean ± standard error over seeds (bars) and each seed (dots).
    ValueError if there are no edit records."""
    records = edit_records(edit_runs)
    if not records:
        raise ValueError("edit_figure: no edit run logs")
    table = _table_of(records)
    n = len(records) + 1
    fig = Figure(figsize=(3.3 * n, 3.6), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    shown = np.concatenate([np.concatenate([r[0].before, r[0].after, [r[0].target]]) for r in records.values()])
    shown = shown[np.isfinite(shown)]  # one y-range for the function panels
    ylim = (max(-4.0, min(-1.2, float(shown.min()) - 0.2)), min(4.0, max(1.2, float(shown.max()) + 0.2)))
    for ax, (act, recs) in zip(axes, records.items()):
        rec = recs[0]
        ax.axvspan(rec.x_edit - rec.far, rec.x_edit + rec.far, color="0.92", lw=0, label=f"|x - x_edit| <= {rec.far:g}")
        ax.plot(rec.x, np.sin(np.pi * rec.x), color="k", ls="--", lw=1, label=r"$\sin(\pi x)$")
        ax.plot(rec.x, rec.before, color="C0", lw=1.5, label="before edit")
        ax.plot(rec.x, rec.after, color="C3", lw=1.5, label="after edit")
        ax.plot([rec.x_edit], [rec.target], "*", color="C2", ms=10,
                label=f"new target ({rec.x_edit:g}, {rec.target:g})")
        ax.set_title(f"{paper.method_name(act)} (seed {rec.seed}): far change {rec.far_change:.3g}", fontsize=10)
        ax.set_xlabel("x", fontsize=10)
        ax.set_ylim(*ylim)
        ax.tick_params(labelsize=9)
    axes[0].set_ylabel("f(x)", fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=9, frameon=False)
    ax = axes[-1]
    names = [paper.method_name(r.act) for r in table.rows]
    means = np.array([r.mean_far_change for r in table.rows])
    sems = np.nan_to_num(np.array([r.sem_far_change for r in table.rows]))
    pos = np.arange(len(names))
    ax.bar(pos, means, yerr=sems, color=[figures.activation_color(r.act) for r in table.rows], alpha=0.6, capsize=4)
    for i, recs in enumerate(records.values()):
        ax.plot(np.full(len(recs), float(i)), [r.far_change for r in recs], "o", color="k", ms=3)
    ax.set_xticks(pos, names, fontsize=10)
    ax.tick_params(axis="y", labelsize=9)
    ax.set_ylabel(f"mean |after - before|, |x - x_edit| > {table.far:g}", fontsize=9)
    title = "far change, mean ± SE over seeds"
    if table.ratio is not None:
        title += f"\nReLU / Elephant = {table.ratio:.3g}"
    ax.set_title(title, fontsize=10)
    fig.suptitle(f"Editing f({table.x_edit:g}) to {table.target:g}", fontsize=11)
    return fig
