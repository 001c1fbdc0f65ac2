"""The classic-control study, drawing: points and aggregates -> matplotlib figures (built without pyplot): final
return against buffer size, the aggregates' IQM against buffer size and the performance profiles."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from ..labels import mean_se_over
from ..plots import activation_color, buffer_axes, buffer_line, group_colors
from .data import ClassicRow
from .scores import Aggregate, Profiles


def _line_label(row: ClassicRow) -> str:
    return f"{row.act} {row.setting}".strip()


def buffer_figure(rows: Sequence[ClassicRow]) -> Figure:
    """The paper's buffer-size figure: one panel per environment, final return (mean ± SE over seeds, at each
    point's best learning rate) against buffer size (log scale), one line per activation and setting, each
    activation in its own colour (:data:`reports.plots.ACTIVATION_COLORS`)."""
    envs = sorted({r.env for r in rows})
    fig = Figure(figsize=(4.5 * len(envs), 3.6), layout="constrained")
    axes = fig.subplots(1, len(envs), squeeze=False)[0]
    for ax, env in zip(axes, envs):
        here = [r for r in rows if r.env == env]
        labels = list(dict.fromkeys(map(_line_label, here)))
        colors = group_colors({label: next(r.act for r in here if _line_label(r) == label) for label in labels})
        for label in labels:
            line = [r for r in here if _line_label(r) == label]
            n, n_lrs = min(r.n_seeds for r in line), min(len(r.selectable_lrs) for r in line)
            buffer_line(ax, [(r.buffer_size, r.mean, r.sem) for r in line], colors[label],
                        f"{label} (n={n}, {n_lrs} lrs)")
        buffer_axes(ax, "final return (last 10% of episodes)", f"{env}: {mean_se_over(r.n_seeds for r in here)}")
    return fig


def aggregate_figure(aggs: Sequence[Aggregate]) -> Figure:
    """IQM of the normalised score against buffer size (log scale), one line per activation with its bootstrap CI
    as a band."""
    fig = Figure(figsize=(5.5, 3.8), layout="constrained")
    ax = fig.subplots()
    for act in dict.fromkeys(a.act for a in aggs):
        pts = sorted((a.buffer_size, a.iqm, *a.iqm_ci) for a in aggs if a.act == act)
        x, m, lo, hi = (np.array(v, dtype=float) for v in zip(*pts))
        n = min(a.n_seeds for a in aggs if a.act == act)
        ax.plot(x, m, marker="o", color=activation_color(act), label=f"{act} ({n} seeds per task)")
        ax.fill_between(x, lo, hi, color=activation_color(act), alpha=0.2)
    ax.set_xscale("log")
    ax.set_xlabel("replay buffer size (transitions)")
    ax.set_ylabel("IQM normalised final return")
    ax.set_title("IQM over tasks x seeds, 95% stratified-bootstrap CI", fontsize=10)
    ax.legend(fontsize=7)
    return fig


def profile_figure(profiles: Sequence[Profiles]) -> Figure:
    """One panel per buffer size: each activation's performance profile with its CI band
    (``rliable.plot_utils.plot_performance_profiles``)."""
    from rliable import plot_utils

    cols = min(3, len(profiles))
    rows = math.ceil(len(profiles) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.4 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, p in zip(axes, profiles):
        plot_utils.plot_performance_profiles(p.profiles, p.taus, p.cis, ax=ax,
                                             colors={act: activation_color(act) for act in p.profiles},
                                             xlabel=r"normalised score $\tau$", ylabel=r"fraction of runs > $\tau$",
                                             labelsize="medium", ticklabelsize="small", legend=True,
                                             legendsize="x-small")
        ax.set_title(f"buffer {p.buffer_size}", fontsize=10)
    for ax in axes[len(profiles):]:
        ax.set_visible(False)
    return fig
