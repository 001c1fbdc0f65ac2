"""The whole report: every figure the run logs have data for, as PNGs, plus ``index.html``.

Hand-made sections (learning curves, gradient covariance, NTK) come first; every other probe field (sparsity,
weights and Elephant's h and a, a plugin's probes) is plotted as its schema (:mod:`runlog.schema`, stored in the
run log) says (:mod:`reports.fields`), with no edit here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from runlog import END, Run

from . import data, plots
from .fields import one_seed, probe_figures, slug
from .html import Part, Table, write_index
from .labels import mean_se_over, scalar_label, step_label

__all__ = ["build_report", "report_parts", "run_tables", "SCALARS"]

#: Scalars plotted first, in this order; any others follow alphabetically.
SCALARS = ("episode_return", "eval_return", "test_mse", "episode_length", "eval_length", "loss", "actor_loss", "critic_loss", "learning_rate")


#: at most this many configurations are drawn side by side (one column each) in the gradient-covariance figure
SIDE_BY_SIDE = 6

#: commands of the streaming learners, whose paper figures come from :mod:`reports.stream`
STREAM_COMMANDS = ("stream-sin", "edit")

_Sections = dict[str, list[tuple[str, str]]]


class _Writer:
    """Saves figures under ``out/sub`` and records them as (caption, path relative to `out`) per section."""

    def __init__(self, out: Path, sub: str = "") -> None:
        self.out, self.sub = out, sub
        self.sections: _Sections = {}

    def add(self, section: str, caption: str, name: str, fig: Figure) -> None:
        name = name if name.endswith(".png") else f"{name}.png"
        rel = f"{self.sub}/{name}" if self.sub else name
        plots.save(fig, self.out / rel)
        self.sections.setdefault(section, []).append((caption, rel))


def _constant(runs: Sequence[Run], name: str) -> float | None:
    """The value of a scalar series that never changes in any run (None if it changes or is absent)."""
    values = [run.scalars[name][1] for run in runs if name in run.scalars and len(run.scalars[name][1])]
    if not values:
        return None
    joined = np.concatenate(values)
    return float(joined[0]) if np.all(joined == joined[0]) else None


def _learning_curves(w: _Writer, groups: Mapping[str, list[Run]], colors: dict[str, str], window: int) -> list[str]:
    """Learning-curve figures; returns notes on the series left out (constant ones)."""
    runs = [r for g in groups.values() for r in g]
    present = {name for run in runs for name in run.scalars} - {END}
    names = [s for s in SCALARS if s in present] + sorted(present - set(SCALARS))
    notes, config = [], runs[0].config
    for name in names:
        if (value := _constant(runs, name)) is not None:
            notes.append(f"{scalar_label(name, config)} is {value:.4g} throughout (not plotted).")
            continue
        curves = {label: c for label, runs in groups.items()
                  if (c := data.learning_curve(runs, name, window=window)) is not None}
        if curves:
            over = mean_se_over(len(c.values) for c in curves.values())
            fig = plots.mean_curves({scalar_label(name, config): curves}, colors=colors, xlabel=step_label(config),
                                    title=over)
            w.add("Learning curves", f"{scalar_label(name, config)}: {over}{', shaded' if 'SE' in over else ''}",
                  f"curve_{slug(name)}", fig)
    return notes


def _gradcov(w: _Writer, groups: Mapping[str, list[Run]], colors: dict[str, str],
             steps: Sequence[int] | None) -> None:
    losses = list(dict.fromkeys(loss for runs in groups.values() for loss in data.gradcov_losses(runs[0])))
    section = "Gradient covariance"
    for loss in losses:
        panels = {label: records for label, runs in groups.items()
                  if (records := data.select_records(runs[0], "gradcov", loss, steps))}
        if panels:  # configurations side by side at matching steps (the paper's layout) while they fit a page
            side = 1 < len(panels) <= SIDE_BY_SIDE
            w.add(section, f"{loss} loss: gradient covariance of {one_seed(panels)}"
                  + (", configurations side by side at the same steps" if side else ", one panel per step"),
                  f"gradcov_{slug(loss)}", plots.gradcov_heatmaps(panels, loss, side_by_side=side))
        stats = {"mean off-diagonal C_ij": f"{loss}_offdiag_mean",
                 "fraction of negative C_ij": f"{loss}_negative_fraction"}
        curves = {ylabel: {label: s for label, runs in groups.items()
                           if (s := data.probe_series(runs, "gradcov", field)) is not None}
                  for ylabel, field in stats.items()}
        curves = {ylabel: c for ylabel, c in curves.items() if c}
        if curves:
            over = mean_se_over(len(s.values) for c in curves.values() for s in c.values())
            w.add(section, f"{loss} loss: interference over time, {over}", f"gradcov_{slug(loss)}_over_time",
                  plots.mean_curves(curves, title=f"{loss} loss: {over}", colors=colors,
                                    xlabel=step_label(runs_of(groups)[0].config)))


def _ntk(w: _Writer, groups: Mapping[str, list[Run]], colors: dict[str, str], steps: Sequence[int] | None) -> None:
    matrices = {label: records for label, runs in groups.items() if data.ntk_kind(runs[0]) == "matrix"
                and (records := data.select_records(runs[0], "ntk", "kernel", steps))}
    if matrices:
        w.add("NTK", f"empirical NTK on the fixed probe inputs, {one_seed(matrices)}", "ntk",
              plots.ntk_matrices(matrices))
    decay = {label: c for label, runs in groups.items() if (c := data.ntk_vs_distance(runs)) is not None}
    if decay:
        w.add("NTK", "normalised NTK against the distance between probe inputs at the last record: how local an "
              "update's effect is", "ntk_distance", plots.ntk_distance(decay, colors))
    vectors = {label: records for label, runs in groups.items() if data.ntk_kind(runs[0]) == "current"
               and (records := data.current_ntk(runs[0], steps))}
    if vectors:
        w.add("NTK", f"NTK(x, x_t) against the sample being learned, {one_seed(vectors)}",
              "ntk_current", plots.ntk_vectors(vectors))


def _hand_made(probe: str, field: str) -> bool:
    """Whether a hand-made section above renders this field (every other field is rendered from its schema)."""
    return probe in ("gradcov", "ntk")


def _commit(run: Run) -> str:
    prov = run.attrs.get("provenance", {})
    commit = str(prov.get("git_commit", "unknown"))[:12]
    return f"{commit} (dirty)" if prov.get("git_dirty") else commit


def _final(run: Run) -> float:
    return data.final_return(run) if len(run.scalars.get("episode_return", ((), ()))[1]) else math.nan


def _fmt(x: float) -> str:
    return "" if math.isnan(x) else f"{x:.4g}"


def _widths(config: Mapping) -> str:
    """The hidden widths built (after width matching), e.g. ``1571`` or ``pi 64,64; vf 64,64``."""
    hidden = (config.get("derived") or {}).get("hidden")
    if not hidden:
        return ""
    text = "; ".join(f"{role} {','.join(map(str, w))}" for role, w in hidden.items()) if len(hidden) > 1 else \
        ",".join(map(str, next(iter(hidden.values()))))
    return f"{text} (matched)" if config.get("match_width") and config.get("act") != "elephant" else text


def _ranges(seeds: Sequence[int]) -> str:
    """``0–4, 7, 9–11``: sorted seeds with consecutive runs joined."""
    out: list[list[int]] = []
    for seed in sorted(set(seeds)):
        if out and out[-1][1] == seed - 1:
            out[-1][1] = seed
        else:
            out.append([seed, seed])
    return ", ".join(f"{a}" if a == b else f"{a}, {b}" if b == a + 1 else f"{a}–{b}" for a, b in out)


def runs_of(groups: Mapping[str, list[Run]]) -> list[Run]:
    return [r for g in groups.values() for r in g]


def run_tables(groups: Mapping[str, list[Run]], settings: Mapping[str, str] | None = None,
               root: str | None = None) -> list[Table]:
    """A table of the groups (settings where the label is shortened, hidden widths built, seeds, final return
    mean ± standard error over seeds) and one of the runs (file relative to ``root``, seed, how it ended, last
    step, final return, git commit)."""
    settings = settings or {}
    summary = []
    for label, runs in groups.items():
        finals = np.array([_final(r) for r in runs])
        finals = finals[~np.isnan(finals)]
        sem = finals.std(ddof=1) / np.sqrt(len(finals)) if len(finals) > 1 else math.nan
        mean = finals.mean() if len(finals) else math.nan
        ret = f"{_fmt(mean)} ± {_fmt(sem)} (n={len(finals)})" if len(finals) > 1 else _fmt(mean)
        summary.append([label, settings.get(label, ""), _widths(runs[0].config), _ranges([r.seed for r in runs]),
                        ret])
    rows = [[os.path.relpath(r.path, root) if root else r.path, label, str(r.seed), data.run_end(r) or "unfinished",
             str(data.training_length(r)), _fmt(_final(r)), _commit(r)]
            for label, runs in groups.items() for r in runs]
    columns = ["configuration", "settings", "hidden widths", "seeds", "final return (last 10% of episodes), mean ± SE"]
    if not settings:  # no label was shortened: the labels say it all
        columns, summary = columns[:1] + columns[2:], [row[:1] + row[2:] for row in summary]
    return [Table("Configurations", columns, summary),
            Table("Runs", ["file", "configuration", "seed", "end", "last step", "final return", "git commit"], rows)]


def _part(heading: str, runs: Sequence[Run], out: Path, sub: str, steps: Sequence[int] | None, window: int,
          root: str | None) -> Part:
    """The section of one (algorithm, env): its configurations, labelled by what differs between them."""
    full = data.group_by_config(runs, fallback=("act",))  # the part's heading names the algorithm and env
    short = data.short_labels(list(full))
    groups = {short[label]: group for label, group in full.items()}
    settings = {short[label]: label for label in full if short[label] != label}
    colors = plots.group_colors({label: group[0].config.get("act") for label, group in groups.items()})
    w = _Writer(out, sub)
    notes = _learning_curves(w, groups, colors, window)
    _gradcov(w, groups, colors, steps)
    _ntk(w, groups, colors, steps)
    probe_figures(w.add, groups, colors, steps, skip=_hand_made, note=notes.append)
    if (runs[0].config.get("command") or runs[0].config.get("algo")) in STREAM_COMMANDS:
        notes.append("The paper's streaming table and Fig. 2 panels for these runs: python -m reports.stream DIR -o OUT.")
    if not w.sections:
        notes.append("No figures: these logs hold no scalar series or probe records that this report plots.")
    return Part(heading, run_tables(groups, settings, root), w.sections, notes)


def report_parts(runs: Sequence[Run], out_dir: str | os.PathLike, steps: Sequence[int] | None = None,
                 window: int = 1) -> list[Part]:
    """Write every figure the runs have data for (PNG and PDF) under `out_dir` and return the report's parts: one
    per (algorithm, env), each with its configurations labelled by what differs between them, its tables and its
    figure sections (captions and paths relative to `out_dir`), for a page of one's own (the showcase's)."""
    if not runs:
        raise ValueError("build_report: no runs")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    split = data.partition(runs)
    root = os.path.commonpath([os.path.dirname(os.path.abspath(r.path)) for r in runs])
    return [_part(heading, part, out, slug(heading.lower()) if len(split) > 1 else "", steps, window, root)
            for heading, part in split.items()]


def build_report(runs: Sequence[Run], out_dir: str | os.PathLike, steps: Sequence[int] | None = None,
                 window: int = 1) -> Path:
    """:func:`report_parts` and ``out_dir/index.html`` showing them.

    steps: training steps of the heatmaps and NTK panels (nearest records); default midpoint and end of
        training. window: episodes averaged (trailing) before learning curves are interpolated.
    Returns the path of ``index.html``.
    """
    parts = report_parts(runs, out_dir, steps, window)
    root = os.path.commonpath([os.path.dirname(os.path.abspath(r.path)) for r in runs])
    n, k = len(runs), len(parts)
    notes = [f"{n} run log{'s' * (n != 1)} under {root}, in {k} part{'s' * (k != 1)} by algorithm and environment."]
    return write_index(Path(out_dir), "Run report", parts=parts, notes=notes)
