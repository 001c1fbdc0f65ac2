"""The whole report: every figure the run logs have data for, as PNGs, plus ``index.html``.

Hand-made sections (learning curves, gradient covariance, NTK) come first; every other probe field (sparsity,
weights and Elephant's h and a, a plugin's probes) is plotted as its schema (:mod:`probes.schema`, stored in the
run log) says (:mod:`reports.fields`), with no edit here.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from probes.runlog import Run

from . import data, plots
from .fields import probe_figures, slug
from .html import Table, write_index

__all__ = ["build_report", "run_tables", "SCALARS"]

#: Scalars plotted first, in this order; any others follow alphabetically.
SCALARS = ("episode_return", "test_mse", "episode_length", "loss", "actor_loss", "critic_loss", "learning_rate")

_Sections = dict[str, list[tuple[str, str]]]


class _Writer:
    """Saves figures under `out` and records them as (caption, file name) per section."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.sections: _Sections = {}

    def add(self, section: str, caption: str, name: str, fig: Figure) -> None:
        plots.save(fig, self.out / name)
        self.sections.setdefault(section, []).append((caption, name))


def _learning_curves(w: _Writer, groups: Mapping[str, list[Run]], colors: dict[str, str], window: int) -> None:
    present = {name for runs in groups.values() for run in runs for name in run.scalars}
    names = [s for s in SCALARS if s in present] + sorted(present - set(SCALARS))
    for name in names:
        curves = {label: c for label, runs in groups.items()
                  if (c := data.learning_curve(runs, name, window=window)) is not None}
        if curves:
            fig = plots.mean_curves({name: curves}, colors=colors)
            w.add("Learning curves", f"{name}: mean over seeds, shaded ± standard error",
                  f"curve_{slug(name)}.png", fig)


def _gradcov(w: _Writer, groups: Mapping[str, list[Run]], colors: dict[str, str],
             steps: Sequence[int] | None) -> None:
    losses = list(dict.fromkeys(loss for runs in groups.values() for loss in data.gradcov_losses(runs[0])))
    section = "Gradient covariance"
    for loss in losses:
        panels = {label: records for label, runs in groups.items()
                  if (records := data.select_records(runs[0], "gradcov", loss, steps))}
        if panels:
            w.add(section, f"{loss} loss: gradient covariance of one seed per configuration",
                  f"gradcov_{slug(loss)}.png", plots.gradcov_heatmaps(panels, loss))
        stats = {"mean off-diagonal C_ij": f"{loss}_offdiag_mean",
                 "fraction of negative C_ij": f"{loss}_negative_fraction"}
        curves = {ylabel: {label: s for label, runs in groups.items()
                           if (s := data.probe_series(runs, "gradcov", field)) is not None}
                  for ylabel, field in stats.items()}
        curves = {ylabel: c for ylabel, c in curves.items() if c}
        if curves:
            w.add(section, f"{loss} loss: interference over time, mean over seeds ± standard error",
                  f"gradcov_{slug(loss)}_over_time.png",
                  plots.mean_curves(curves, title=f"{loss} loss", colors=colors))


def _ntk(w: _Writer, groups: Mapping[str, list[Run]], steps: Sequence[int] | None) -> None:
    matrices = {label: records for label, runs in groups.items() if data.ntk_kind(runs[0]) == "matrix"
                and (records := data.select_records(runs[0], "ntk", "kernel", steps))}
    if matrices:
        w.add("NTK", "empirical NTK on the fixed probe inputs, one seed per configuration", "ntk.png",
              plots.ntk_matrices(matrices))
    vectors = {label: records for label, runs in groups.items() if data.ntk_kind(runs[0]) == "current"
               and (records := data.current_ntk(runs[0], steps))}
    if vectors:
        w.add("NTK", "NTK(x, x_t) against the sample being learned, one seed per configuration",
              "ntk_current.png", plots.ntk_vectors(vectors))


def _hand_made(probe: str, field: str) -> bool:
    """Whether a hand-made section above renders this field (every other field is rendered from its schema)."""
    return probe in ("gradcov", "ntk")


def _commit(run: Run) -> str:
    prov = run.attrs.get("provenance", {})
    commit = str(prov.get("git_commit", "unknown"))[:12]
    return f"{commit} (dirty)" if prov.get("git_dirty") else commit


def _final(run: Run) -> float:
    return data.final_return(run) if len(run.scalars.get("episode_return", ((), ()))[1]) else math.nan


def _cell(config: dict, key: str) -> str:
    value = config.get(key, "")
    return value if isinstance(value, str) else json.dumps(value)


def _fmt(x: float) -> str:
    return "" if math.isnan(x) else f"{x:.4g}"


def run_tables(groups: Mapping[str, list[Run]]) -> list[Table]:
    """A table of the groups (seeds, final return mean ± standard error over seeds) and one of the runs
    (file, seed, git commit, final return, config)."""
    summary = []
    for label, runs in groups.items():
        finals = np.array([_final(r) for r in runs])
        finals = finals[~np.isnan(finals)]
        sem = finals.std(ddof=1) / np.sqrt(len(finals)) if len(finals) > 1 else math.nan
        mean = finals.mean() if len(finals) else math.nan
        summary.append([label, ", ".join(str(r.seed) for r in runs),
                        f"{_fmt(mean)} ± {_fmt(sem)}" if len(finals) > 1 else _fmt(mean)])
    keys = list(dict.fromkeys(k for runs in groups.values() for r in runs for k in r.config))
    rows = [[r.path, label, str(r.seed), _commit(r), _fmt(_final(r)), *(_cell(r.config, k) for k in keys)]
            for label, runs in groups.items() for r in runs]
    return [Table("Configurations", ["configuration", "seeds", "final return (last 10% of episodes)"], summary),
            Table("Runs", ["file", "configuration", "seed", "git commit", "final return", *keys], rows)]


def build_report(runs: Sequence[Run], out_dir: str | os.PathLike, steps: Sequence[int] | None = None,
                 window: int = 1) -> Path:
    """Write every figure the runs have data for as PNGs under `out_dir`, and ``out_dir/index.html``.

    steps: training steps of the heatmaps and NTK panels (nearest records); default midpoint and end of
        training. window: episodes averaged (trailing) before learning curves are interpolated.
    Returns the path of ``index.html``.
    """
    if not runs:
        raise ValueError("build_report: no runs")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    groups = data.group_by_config(runs)
    colors = {label: f"C{i % 10}" for i, label in enumerate(groups)}
    w = _Writer(out)
    _learning_curves(w, groups, colors, window)
    _gradcov(w, groups, colors, steps)
    _ntk(w, groups, steps)
    probe_figures(w.add, groups, colors, steps, skip=_hand_made)
    return write_index(out, "Run report", run_tables(groups), w.sections)
