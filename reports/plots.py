"""Matplotlib figures of the arrays in :mod:`reports.data`.

Every function returns a :class:`matplotlib.figure.Figure` built without pyplot (no global state, rendered
by the Agg canvas); `save` writes it as a PNG and a vector PDF. Mappings are ``{group label: data}``, plotted in their order.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from .data import CurrentNTK, Curve, DistanceCurve, Record, Series, ntk_matrix
from .labels import mean_se_over

__all__ = ["buffer_line", "buffer_axes", "ntk_distance", "GRADCOV_CMAP", "GRADCOV_CLIM", "ACTIVATION_COLORS", "activation_color", "group_colors", "heatmap_scale",
           "save", "mean_curves", "gradcov_heatmaps", "ntk_matrices",
           "ntk_vectors", "layer_series", "layer_ranges", "heatmaps"]

GRADCOV_CMAP = "RdBu_r"
GRADCOV_CLIM = (-1.0, 1.0)  # gradient covariance entries are cosines; fixed so panels compare
_PANEL_IN = 3.2  # inches per heatmap panel
_LINE_W_IN, _LINE_H_IN = 5.0, 3.4  # inches per line-plot panel


def _wrap(label: str, width: int = 45) -> str:
    """A group label broken into lines that fit above one heatmap panel."""
    return textwrap.fill(label, width, break_on_hyphens=False)


def save(fig: Figure, path: str | os.PathLike, dpi: int = 100, pdf: bool = True) -> Path:
    """Write `fig` as a PNG at `path` and (``pdf``) as vector PDF beside it (same name, ``.pdf``, for papers);
    returns the PNG's path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=dpi)
    if pdf:
        fig.savefig(path.with_suffix(".pdf"), format="pdf")
    return path


#: one colour per activation on every figure and page (matplotlib's tab10 names)
ACTIVATION_COLORS = {"elephant": "C3", "relu": "C0", "tanh": "C2", "sigmoid": "C4", "elu": "C1", "maxout": "C5",
                     "lwta": "C6", "fta": "C7", "leaky_relu": "C8", "gelu": "C9", "silu": "C9"}


def activation_color(act: str) -> str:
    """The colour of activation ``act`` (a fixed map; others get grey)."""
    return ACTIVATION_COLORS.get(act, "0.4")


def group_colors(acts: Mapping[str, str | None]) -> dict[str, str]:
    """Colours of groups ``{label: activation}``: each activation's own colour when every group has another
    activation (so Elephant is the same colour on every figure), else one tab10 colour per group in order."""
    names = list(acts.values())
    if all(a is not None for a in names) and len(set(names)) == len(names):
        return {label: activation_color(a) for label, a in acts.items()}
    return {label: f"C{i % 10}" for i, label in enumerate(acts)}


def _colors(labels: Sequence[str], colors: Mapping[str, str] | None) -> dict[str, str]:
    return {label: (colors or {}).get(label, f"C{i % 10}") for i, label in enumerate(labels)}


def mean_curves(panels: Mapping[str, Mapping[str, Curve | Series]], title: str = "",
                colors: Mapping[str, str] | None = None, xlabel: str = "step") -> Figure:
    """One subplot per panel ``{ylabel: {label: curve}}``: each curve's mean over runs as a line, shaded
    ± one standard error where at least two runs contribute, ``(n=...)`` in the legend. Curves must hold scalar
    values."""
    fig = Figure(figsize=(_LINE_W_IN * len(panels), _LINE_H_IN), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (ylabel, curves) in zip(axes, panels.items()):
        palette = _colors(list(curves), colors)
        for label, curve in curves.items():
            mean, sem = curve.mean, curve.sem
            ax.plot(curve.steps, mean, color=palette[label], label=f"{label} (n={len(curve.values)})")
            if np.any(np.isfinite(sem)):
                ax.fill_between(curve.steps, mean - sem, mean + sem, color=palette[label], alpha=0.25, lw=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def _grid(n_rows: int, n_cols: int) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(_PANEL_IN * n_cols + 1.0, _PANEL_IN * n_rows), layout="constrained")
    axes = fig.subplots(n_rows, n_cols, squeeze=False)
    for ax in axes.ravel():
        ax.set_axis_off()
    return fig, axes


def gradcov_heatmaps(panels: Mapping[str, Sequence[Record]], loss: str, side_by_side: bool = False) -> Figure:
    """Gradient covariance matrices ``(k, k)``: one row per group, one panel per record (e.g. the midpoint
    and end of training), colormap `GRADCOV_CMAP` with limits fixed to `GRADCOV_CLIM`, one shared colorbar.
    ``side_by_side``: the paper's layout instead, the groups (activations) side by side in columns and one row per
    record, so each row compares them at the same step."""
    n_cols = max((len(records) for records in panels.values()), default=0)
    if n_cols == 0:
        raise ValueError("gradcov_heatmaps: no records to plot")
    fig, axes = _grid(n_cols, len(panels)) if side_by_side else _grid(len(panels), n_cols)
    if side_by_side:
        axes = axes.T  # axes[g] is group g's column
    image = None
    for row, (label, records) in zip(axes, panels.items()):
        for ax, record in zip(row, records):
            ax.set_axis_on()
            image = ax.imshow(record.value, cmap=GRADCOV_CMAP, vmin=GRADCOV_CLIM[0], vmax=GRADCOV_CLIM[1],
                              interpolation="nearest")
            ax.set_title(f"{_wrap(label)}\nstep {record.step} (seed {record.seed})", fontsize=8)
            ax.set_xlabel("sample j", fontsize=8)
            ax.set_ylabel("sample i", fontsize=8)
    fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label=r"$C_{ij}$")
    fig.suptitle(f"Gradient covariance ({loss} loss)")
    return fig


def ntk_matrices(panels: Mapping[str, Sequence[Record]]) -> Figure:
    """Empirical NTK on the probe inputs, ``(N, N)`` (``(N, N, O, O)`` kernels traced over outputs): one row
    per group, one panel per record, each with symmetric color limits ``± max |K|`` and its own colorbar."""
    traced = {label: [Record(r.step, r.target, r.seed, ntk_matrix(r.value)) for r in records]
              for label, records in panels.items()}
    return heatmaps(traced, "Empirical NTK on the probe inputs", ("input i", "input j"))


def heatmap_scale(value: np.ndarray) -> tuple[str, float, float]:
    """(colour map, vmin, vmax) of a matrix: sequential from 0 when no entry is negative (an NTK of positive
    entries keeps its structure instead of showing as one block of a diverging map), else diverging and symmetric
    about 0."""
    finite = value[np.isfinite(value)]
    if finite.size and finite.min() >= 0:
        return "viridis", 0.0, float(finite.max()) or 1.0
    limit = float(np.abs(finite).max()) if finite.size else 1.0
    return "RdBu_r", -(limit or 1.0), limit or 1.0


def heatmaps(panels: Mapping[str, Sequence[Record]], title: str, axes_names: Sequence[str] = ("i", "j")) -> Figure:
    """Matrices ``(M, M')``: one row per group, one panel per record, each with its own colorbar, scaled by
    :func:`heatmap_scale`, its range printed above it; ``axes_names`` label the rows and columns."""
    n_cols = max((len(records) for records in panels.values()), default=0)
    if n_cols == 0:
        raise ValueError("heatmaps: no records to plot")
    fig, axes = _grid(len(panels), n_cols)
    for row, (label, records) in zip(axes, panels.items()):
        for ax, record in zip(row, records):
            cmap, vmin, vmax = heatmap_scale(record.value)
            ax.set_axis_on()
            image = ax.imshow(record.value, cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
            fig.colorbar(image, ax=ax, shrink=0.8)
            lo, hi = np.nanmin(record.value), np.nanmax(record.value)
            ax.set_title(f"{_wrap(label)}\nstep {record.step} (seed {record.seed}); range [{lo:.3g}, {hi:.3g}]",
                         fontsize=8)
            ax.set_xlabel(axes_names[1], fontsize=8)
            ax.set_ylabel(axes_names[0], fontsize=8)
    fig.suptitle(title)
    return fig


def ntk_distance(curves: Mapping[str, DistanceCurve], colors: Mapping[str, str] | None = None) -> Figure:
    """Normalised NTK against probe-input distance, ``{label: DistanceCurve}``: mean over seeds per distance bin,
    shaded ± standard error; a fast decay means an update at one input changes the function elsewhere little."""
    fig = mean_curves({r"normalised NTK $K_{ij}/\sqrt{K_{ii}K_{jj}}$": curves}, colors=colors,
                      xlabel=r"distance $\|x_i - x_j\|$ between probe inputs",
                      title=f"step {max(c.step for c in curves.values())}: "
                            f"{mean_se_over(len(c.values) for c in curves.values())}")
    fig.axes[0].axhline(0.0, color="0.6", lw=0.8)
    return fig


def ntk_vectors(panels: Mapping[str, Sequence[CurrentNTK]]) -> Figure:
    """``NTK(x, x_t)`` against the sample being learned: one subplot per group, one line per record. With
    one-feature inputs the x axis is the input value and ``x_t`` a dashed line; otherwise the input index."""
    fig = Figure(figsize=(_LINE_W_IN * len(panels), _LINE_H_IN), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (label, records) in zip(axes, panels.items()):
        for i, rec in enumerate(records):
            color = f"C{i % 10}"
            scalar_inputs = rec.inputs is not None and rec.inputs[0].size == 1
            if scalar_inputs:
                x = rec.inputs.reshape(-1)
                order = np.argsort(x)
                ax.plot(x[order], rec.kernel[order], color=color, label=f"step {rec.step}")
                if rec.x_t is not None:
                    ax.axvline(float(rec.x_t.reshape(-1)[0]), color=color, ls="--", lw=1)
            else:
                ax.plot(rec.kernel, ".-", color=color, label=f"step {rec.step}")
            ax.set_xlabel("x" if scalar_inputs else "probe input index")
        ax.axhline(0.0, color="0.6", lw=0.8)
        ax.set_ylabel(r"NTK$(x, x_t)$")
        ax.set_title(f"{label} (seed {records[0].seed})" if records else label, fontsize=9)
        ax.legend(fontsize=7)
    return fig


def layer_series(series: Mapping[str, Series], layers: Sequence[str], title: str = "", *,
                 ylabel: str = "fraction", ylim: tuple[float, float] | None = (-0.02, 1.02),
                 xlabel: str = "step") -> Figure:
    """Per-layer fields over time, ``{field: Series}`` with values ``(R, T, L)``: one subplot per field, one
    line per layer (mean over runs), y axis ``ylabel`` within ``ylim`` (default: a fraction in [0, 1]; None:
    automatic); two subplots per row."""
    n_cols = min(2, len(series))
    n_rows = -(-len(series) // n_cols)
    outside = len(layers) > _LEGEND_INSIDE  # many entries (a parameter per line): legend beside the panels
    legend_cols = 1 if len(layers) <= 30 else 2
    height = max(_LINE_H_IN * n_rows, 0.14 * len(layers) / legend_cols + 0.8) if outside else _LINE_H_IN * n_rows
    fig = Figure(figsize=(_LINE_W_IN * n_cols + (2.2 * legend_cols if outside else 0), height), layout="constrained")
    axes = fig.subplots(n_rows, n_cols, squeeze=False).ravel()
    for ax in axes[len(series):]:
        ax.set_axis_off()
    palette = line_colors(len(layers))
    for ax, (name, s) in zip(axes, series.items()):
        mean = s.mean
        for i, layer in enumerate(layers):
            ax.plot(s.steps, mean[:, i], marker=".", label=layer, color=palette[i])
        if ylim is not None:
            ax.set_ylim(*ylim)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(name.replace("_", " "), fontsize=9)
    if outside:
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right upper", fontsize=7, ncols=legend_cols)
    else:
        axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return fig


_LEGEND_INSIDE = 6  # legends of more entries go beside the panels


def line_colors(n: int) -> list:
    """``n`` distinguishable line colours: tab10 up to 10, else evenly spaced on viridis."""
    if n <= 10:
        return [f"C{i}" for i in range(n)]
    from matplotlib import colormaps

    return [colormaps["viridis"](i / (n - 1)) for i in range(n)]


def layer_ranges(series: Mapping[str, Series], layers: Sequence[str], title: str = "", xlabel: str = "step") -> Figure:
    """Per-unit parameters over time, e.g. ``{"elephant_h": Series, "elephant_a": Series}`` with values
    ``(R, T, L, 3)`` (mean, min, max over the units of each layer): one subplot per field, per layer its mean as a
    line and its min-max range as a band (each averaged over runs)."""
    fig = Figure(figsize=(_LINE_W_IN * len(series), _LINE_H_IN), layout="constrained")
    axes = fig.subplots(1, len(series), squeeze=False)[0]
    for ax, (name, s) in zip(axes, series.items()):
        mean = s.mean
        for i, layer in enumerate(layers):
            color = f"C{i % 10}"
            ax.plot(s.steps, mean[:, i, 0], color=color, label=layer)
            ax.fill_between(s.steps, mean[:, i, 1], mean[:, i, 2], color=color, alpha=0.2, lw=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(name.replace("_", " "))
        ax.set_title(f"{name}: mean over units, band min to max", fontsize=9)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return fig


def buffer_line(ax, points: Sequence[tuple[float, float, float]], color: str, label: str) -> None:
    """One line of a buffer-size figure: ``points`` (buffer size, mean, SE), shaded ± SE (a missing SE: none)."""
    x, m, s = (np.array(v, dtype=float) for v in zip(*sorted(points)))
    ax.plot(x, m, marker="o", color=color, label=label)
    ax.fill_between(x, m - np.nan_to_num(s), m + np.nan_to_num(s), color=color, alpha=0.2)


def buffer_axes(ax, ylabel: str, title: str) -> None:
    """A buffer-size panel's axes: buffer size on a log scale, ``ylabel``, ``title``, the legend."""
    ax.set_xscale("log")
    ax.set_xlabel("replay buffer size (transitions)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
