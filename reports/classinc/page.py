"""Class-incremental reports, drawing and writing: the figures (matplotlib, built without pyplot), the tables as
markdown, the report folder and the command line ``python -m reports.classinc``."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from runlog import Run, RunLogError, find_runs

from .. import plots as figures
from ..cli import load_runs, output_dir, warn
from ..html import Part, Table, write_index
from ..labels import mean_se_over
from .data import (HYPER_COLUMNS, MAKE_RUNS, TABLE_CAPTION, TASK_PROBES, Forgetting, LeftOut, SettingRow,
                   accuracy_curve, best_settings, forgetting_table, incomplete_matrices, is_classinc_run,
                   mean_task_ends, paper_dataset, paper_rows, paper_value, reference_data, sections, sweep,
                   task_probe, usable_runs)

TITLE = "Class-incremental streaming classification (the paper's appendix \u201cClass Incremental Learning\u201d)"
FORGETTING_NOTE = (
    "Accuracy matrix A[k, j]: test accuracy on task j's classes (classified among all classes) after the k-th task, "
    "mean over seeds (with a random class order, task j is the j-th task of each seed's own order). Average "
    "forgetting: mean over tasks j < last of max_{k < last} A[k, j] - A[last, j], computed per seed, then mean ± "
    "standard error over seeds.")
#: one colour per method on every figure (ReLU blues/greens, Elephant reds)
METHOD_COLORS = {"mlp-relu": "C0", "mlp-relu-ewc": "C2", "mlp-elephant": "C3", "cnn-relu": "C9",
                 "cnn-relu-ewc": "C8", "cnn-elephant": "C1"}
_SPARE_COLORS = ("C4", "C5", "C6", "C7")


def method_colors(methods: Sequence[str]) -> dict[str, str]:
    """``{method: colour}``: :data:`METHOD_COLORS`, others the spare tab10 colours in order."""
    spare = iter(_SPARE_COLORS * (1 + len(methods) // len(_SPARE_COLORS)))
    return {m: METHOD_COLORS.get(m) or next(spare) for m in methods}


# --- figures ------------------------------------------------------------------------


def _section_title(data: str, width: int) -> str:
    return f"{data}, width {width}"


def accuracy_figure(rows: Sequence[SettingRow]) -> Figure | None:
    """The paper's accuracy curves for one (data, width): test accuracy over the classes seen so far against
    training samples seen, one line per method at its selected setting (mean over seeds, shaded ± standard error),
    task ends (mean over seeds) as dotted vertical lines. None if no run has ``test_acc``."""
    curves = {row.name: c for row in rows if (c := accuracy_curve(row.runs)) is not None}
    if not curves:
        return None
    colors = method_colors([r.method for r in rows])
    fig = figures.mean_curves({"test accuracy, classes seen so far": curves},
                              colors={r.name: colors[r.method] for r in rows}, xlabel="training samples seen",
                              title=f"{_section_title(rows[0].data, rows[0].width)}: each method at its selected "
                                    f"setting\n{mean_se_over(len(c.values) for c in curves.values())}; dotted lines: "
                                    "task ends")
    ax = fig.axes[0]
    for end in mean_task_ends(r for row in rows for r in row.runs)[:-1]:
        ax.axvline(float(end), color="0.55", ls=":", lw=0.9, zorder=0)
    ax.set_ylim(-0.02, 1.02)
    return fig


def matrix_figure(table: Sequence[Forgetting]) -> Figure:
    """Accuracy-matrix heatmaps, one panel per method: mean over seeds of ``A[k, j]`` (rows: after task k; columns:
    task j), tasks not yet seen (``j > k``) blank, colour scale fixed to [0, 1], values printed in the cells.
    ValueError if `table` is empty."""
    if not table:
        raise ValueError("matrix_figure: no accuracy matrices")
    k = max(f.mean.shape[0] for f in table)
    side = 0.45 * k + 1.6
    fig = Figure(figsize=(side * len(table) + 1.0, side + 0.6), layout="constrained")
    axes = fig.subplots(1, len(table), squeeze=False)[0]
    image = None
    for ax, f in zip(axes, table):
        shown = f.mean.copy()
        shown[np.triu_indices_from(shown, k=1)] = np.nan
        image = ax.imshow(shown, cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
        if shown.shape[0] <= 12:
            for (i, j), v in np.ndenumerate(shown):
                if np.isfinite(v):
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                            color="k" if v > 0.6 else "w")
        n = len(f.matrices)
        ax.set_title(f"{f.row.name} (n={n})\navg forgetting {f.forgetting:.3f}", fontsize=9)
        ax.set_xticks(range(shown.shape[1]))
        ax.set_yticks(range(shown.shape[0]))
        ax.set_xlabel("task j (evaluated)", fontsize=8)
        ax.set_ylabel("after task k", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.colorbar(image, ax=list(axes), shrink=0.8, label="test accuracy")
    row = table[0].row
    fig.suptitle(f"{_section_title(row.data, row.width)}: accuracy matrix, mean over seeds", fontsize=10)
    return fig


_PROBE_LABELS = {"gradcov.nll_negative_mass": "negative share of |C_ij| mass (gradcov)",
                 "sparsity.activation_sparsity": "fraction of |phi| <= eps (sparsity)"}


def probe_figure(rows: Sequence[SettingRow]) -> Figure | None:
    """The probes at task ends, one panel per probe field of :data:`TASK_PROBES` that some run has (gradient
    interference ``nll_negative_mass``; ``activation_sparsity`` of the last activation layer) against the task index,
    one line per method at its selected setting (mean over seeds, shaded ± standard error). None if no run has
    either probe."""
    colors = method_colors([r.method for r in rows])
    panels: dict[str, dict[str, Any]] = {}
    for probe, name, what in TASK_PROBES:
        found = {row.name: s for row in rows if (s := task_probe(row.runs, probe, name)) is not None}
        if found:
            panels[f"{probe}.{name}"] = found
    if not panels:
        return None
    fig = figures.mean_curves(panels, colors={r.name: colors[r.method] for r in rows}, xlabel="after task k",
                              title=f"{_section_title(rows[0].data, rows[0].width)}: probes at task ends, "
                                    f"{mean_se_over(len(s.values) for p in panels.values() for s in p.values())}")
    titles = {f"{p}.{n}": what for p, n, what in TASK_PROBES}
    for ax, key in zip(fig.axes, panels):
        ax.set_title(titles[key], fontsize=8)
        ax.set_ylabel(_PROBE_LABELS.get(key, key))
        for line in ax.get_lines():
            line.set_marker("o")
            line.set_markersize(3)
        top = max(len(s.steps) for s in panels[key].values())
        ax.set_xticks(range(1, top + 1))
    return fig


# --- tables -------------------------------------------------------------------------


def _pm(mean: float | None, sem: float | None) -> str:
    """``0.723 ± 0.006`` (three decimals, as the paper); the mean alone without a standard error."""
    if mean is None or not math.isfinite(mean):
        return "–" if mean is None else str(mean)
    if sem is None or not math.isfinite(sem):
        return f"{mean:.3f}"
    return f"{mean:.3f} ± {sem:.3f}" if sem >= 5e-4 or sem == 0 else f"{mean:.3f} ± {sem:.1e}"


def _paper_pm(value: tuple[float, float | None] | None) -> str:
    """The paper's number as transcribed: ``0.665 ± 0.014``, ``0.100 ± 0.0027``, ``0.69``."""
    if value is None:
        return "–"
    mean, sem = value
    if sem is None:
        return f"{mean:.3f}"
    return f"{mean:.3f} ± {sem:.3f}" if round(sem, 3) == sem else f"{mean:.3f} ± {sem:g}"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _hyper_cells(row: SettingRow) -> list[str]:
    """The hyper-parameter columns: ``–`` where one does not apply, ``act default`` for the activation's
    convention."""
    return ["–" if key not in row.hyper else "act default" if row.hyper[key] is None else _value(row.hyper[key])
            for key, _ in HYPER_COLUMNS]


def _seeds_cell(row: SettingRow) -> str:
    return f"{row.n_seeds} (fewer than {row.expected_seeds})" if row.flagged else str(row.n_seeds)


def _paper_column(data: str, width: int) -> str:
    dataset = paper_dataset(data)
    if dataset is None or not paper_rows(dataset, width):
        return "Paper (no table for this dataset and width)"
    name = reference_data()["datasets"][dataset]
    return f"Paper, {name}, width {width}{'' if dataset == data else f' (not {data})'}"


def best_cells(best: Sequence[SettingRow]) -> tuple[list[str], list[list[str]]]:
    """Table (a) of one (data, width): per method its selected setting and final accuracy, and the paper's number."""
    columns = ["Method", "Run folder", *(name for _, name in HYPER_COLUMNS), "Other settings",
               "Final accuracy (mean ± SE)", "Seeds", _paper_column(best[0].data, best[0].width)]
    return columns, [[r.name, r.method, *_hyper_cells(r), r.other or "–", _pm(r.mean, r.sem), _seeds_cell(r),
                      _paper_pm(paper_value(r.data, r.width, r.method))] for r in best]


def paper_cells(width: int) -> tuple[list[str], list[list[str]]] | None:
    """The paper's tables tb:mnist and tb:cifar at `width` side by side, every method they list; None if the paper
    has no such width."""
    ref = reference_data()
    tables = {d: paper_rows(d, width) for d in ref["datasets"]}
    if not any(tables.values()):
        return None
    names = list(dict.fromkeys(n for t in tables.values() for n in t))
    passes, boundary = ref.get("passes", {}), set(ref.get("task_boundary", ()))

    def note(name: str) -> str:
        parts = [f"{passes[name]} dataset passes"] if name in passes else []
        return "; ".join(parts + (["uses task boundaries"] if name in boundary else [])) or "–"

    columns = ["Method", *(f"{ref['datasets'][d]}, width {width}" for d in tables), "Note"]
    return columns, [[n, *(_paper_pm(t.get(n)) for t in tables.values()), note(n)] for n in names]


def sweep_cells(rows: Sequence[SettingRow], best: Sequence[SettingRow]) -> tuple[list[str], list[list[str]]]:
    """Table (b): every setting, mean ± SE of the final accuracy, its seeds, whether flagged and selected."""
    chosen = {(r.data, r.width, r.key) for r in best}
    columns = ["Method", *(name for _, name in HYPER_COLUMNS), "Other settings", "Final accuracy (mean ± SE)",
               "Seeds", "Seed list", "Selected"]
    return columns, [[r.name, *_hyper_cells(r), r.other or "–", _pm(r.mean, r.sem), _seeds_cell(r),
                      ",".join(map(str, r.seeds)), "yes" if (r.data, r.width, r.key) in chosen else ""]
                     for r in rows]


def forgetting_cells(table: Sequence[Forgetting]) -> tuple[list[str], list[list[str]]]:
    """Table (c): average forgetting per method at its selected setting, per task, and the last row of A."""
    columns = ["Method", "Average forgetting (mean ± SE)", "Forgetting per task j < last (mean)",
               "Final accuracy per task (last row of A, mean)", "Final accuracy (mean ± SE)", "Seeds"]
    return columns, [[f.row.name, _pm(f.forgetting, f.forgetting_sem), " ".join(f"{v:.3f}" for v in f.per_task),
                      " ".join(f"{v:.3f}" for v in f.mean[-1]), _pm(f.row.mean, f.row.sem), str(len(f.matrices))]
                     for f in table]


def matrix_cells(f: Forgetting) -> tuple[list[str], list[list[str]]]:
    """The mean accuracy matrix of one method: a row per task end, a column per task."""
    k = f.mean.shape[1]
    return (["after task k", *(f"task {j}" for j in range(k))],
            [[str(i), *("–" if not math.isfinite(v) else f"{v:.3f}" for v in row)] for i, row in enumerate(f.mean)])


def _markdown(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return "\n".join([line(columns), line(["---"] * len(columns)), *(line(r) for r in rows)]) + "\n"


def left_out_cells(left: Sequence[LeftOut]) -> tuple[list[str], list[list[str]]]:
    return ["Run log", "Why left out"], [[x.path, x.reason] for x in left]


# --- the report ---------------------------------------------------------------------


def _slug(data: str, width: int) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in data) + f"_w{width}"


def classinc_markdown(rows: Sequence[SettingRow], left: Sequence[LeftOut] = ()) -> str:
    """Every table of the report as markdown: per (data, width) the selected settings beside the paper, the paper's
    tables at that width, forgetting and the accuracy matrices, the sweep; then the runs left out."""
    best = best_settings(rows)
    md = [f"# {TITLE}\n", f"{TABLE_CAPTION}\n"]
    for data, width in sections(rows):
        here = [r for r in rows if (r.data, r.width) == (data, width)]
        chosen = [r for r in best if (r.data, r.width) == (data, width)]
        md += [f"## {_section_title(data, width)}\n", "**Final accuracy at each method's selected setting.**\n",
               _markdown(*best_cells(chosen))]
        paper = paper_cells(width)
        if paper is not None:
            md += [f"**The paper's numbers at width {width}** (Split MNIST and Split CIFAR-10; ours: {data}).\n",
                   _markdown(*paper)]
        table = forgetting_table(chosen)
        md += [f"{line}\n" for line in _matrix_notes(chosen)]
        if table:
            md += [f"**Forgetting.** {FORGETTING_NOTE}\n", _markdown(*forgetting_cells(table))]
            for f in table:
                md += [f"Accuracy matrix of {f.row.name} (mean over {len(f.matrices)} seeds):\n",
                       _markdown(*matrix_cells(f))]
        md += ["**Sweep: every setting**, final accuracy mean ± SE over its seeds.\n",
               _markdown(*sweep_cells(here, best))]
    if left:
        md += ["## Runs left out\n", _markdown(*left_out_cells(left))]
    return "\n".join(md)


def _matrix_notes(best: Sequence[SettingRow]) -> list[str]:
    return [f"No accuracy matrix or forgetting for {row.name}: its run logs hold {n} of the {k} task-end records "
            "(task_acc_<j>)." for row, n, k in incomplete_matrices(best)]


def _notes(rows: Sequence[SettingRow], left: Sequence[LeftOut]) -> list[list[str]]:
    ref = reference_data()
    flagged = [r for r in rows if r.flagged]
    notes = [["statistic", TABLE_CAPTION],
             ["selection", "per (data, width, method; method = model, activation, EWC on or off) the setting (every "
                           "config key but the seed, device, probes and data folder) with the highest mean final "
                           "accuracy over its seeds; settings with fewer seeds than the most common number at their "
                           "data and width are listed in the sweep, flagged, and only selected where a method has no "
                           "other; ties go to the first setting in a fixed order (its config as sorted JSON)"],
             ["forgetting", FORGETTING_NOTE],
             ["paper", f"{ref['source']}. " + " ".join(ref.get("notes", ()))]]
    if flagged:
        notes.append(["flagged settings", f"{len(flagged)} setting(s) with fewer seeds than the most common number "
                                          "(see the sweep tables)"])
    if left:
        notes.append(["left out", f"{len(left)} class-inc run log(s) incomplete, diverged or repeated; listed in "
                                  "'Runs left out'"])
    return notes


def build_classinc_report(runs: Sequence[Run], out_dir: str | os.PathLike) -> Path:
    """Write ``class_inc_tables.md``, per (data, width) the figures ``accuracy_<data>_w<width>.png`` (accuracy
    curves), ``matrix_<data>_w<width>.png`` (accuracy-matrix heatmaps) and ``probes_<data>_w<width>.png`` (probes
    at task ends; where the runs have them), each also as PDF, and ``index.html`` under `out_dir`; return the path
    of ``index.html``. ValueError if no class-inc run in `runs` is complete (naming those left out)."""
    rows = sweep(runs)
    _, left = usable_runs(runs)
    if not rows:
        shown = "; ".join(f"{x.path}: {x.reason}" for x in left[:5]) + (" ..." if len(left) > 5 else "")
        raise ValueError(f"no complete class-inc runs ({len(left)} left out: {shown})" if left
                         else f"no class-inc run logs; make them with: {MAKE_RUNS}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    best = best_settings(rows)
    parts = []
    for data, width in sections(rows):
        here = [r for r in rows if (r.data, r.width) == (data, width)]
        chosen = [r for r in best if (r.data, r.width) == (data, width)]
        slug = _slug(data, width)
        tables = [Table("Final accuracy at each method's selected setting, measured beside the paper",
                        *best_cells(chosen))]
        paper = paper_cells(width)
        if paper is not None:
            tables.append(Table(f"The paper's numbers at width {width} (Split MNIST and Split CIFAR-10; ours: {data})",
                                *paper))
        figs: dict[str, list[tuple[str, str]]] = {}
        fig = accuracy_figure(chosen)
        if fig is not None:
            figures.save(fig, out / f"accuracy_{slug}.png")
            figs["Accuracy curves"] = [("test accuracy over the classes seen so far against training samples seen, "
                                        "each method at its selected setting: mean over seeds, shaded ± standard "
                                        "error; dotted lines: task ends", f"accuracy_{slug}.png")]
        table = forgetting_table(chosen)
        if table:
            tables.append(Table("Forgetting at each method's selected setting", *forgetting_cells(table)))
            tables += [Table(f"Accuracy matrix: {f.row.name} (mean over {len(f.matrices)} seeds)", *matrix_cells(f))
                       for f in table]
            figures.save(matrix_figure(table), out / f"matrix_{slug}.png")
            figs["Accuracy matrices"] = [("A[k, j]: accuracy on task j's classes after the k-th task, mean over seeds; "
                                          "tasks not yet seen blank", f"matrix_{slug}.png")]
        fig = probe_figure(chosen)
        if fig is not None:
            figures.save(fig, out / f"probes_{slug}.png")
            figs["Probes between tasks"] = [("gradient interference (negative share of the off-diagonal gradient "
                                             "covariance mass, nll loss) and activation sparsity of the last "
                                             "activation layer at each task end, mean ± SE over seeds",
                                             f"probes_{slug}.png")]
        tables.append(Table("Sweep: every setting, final accuracy mean ± SE over its seeds", *sweep_cells(here, best)))
        note = _matrix_notes(chosen) + ([] if paper_dataset(data) in (data, None) else [
            f"Our runs are on {data}; the paper's numbers beside them are for "
            f"{reference_data()['datasets'][paper_dataset(data)]}: orientation only."])
        parts.append(Part(_section_title(data, width), tables, figs, note))
    top = [Table("Notes", ["item", "note"], _notes(rows, left))]
    if left:
        top.append(Table("Runs left out", *left_out_cells(left)))
    (out / "class_inc_tables.md").write_text(classinc_markdown(rows, left), encoding="utf-8")
    return write_index(out, TITLE, top, parts=parts)


def _load(paths: Sequence[str]) -> list[Run]:
    """The run logs under `paths`; ValueError naming the folder and the command that makes runs for a folder
    without any."""
    for path in paths:
        if os.path.isdir(path) and not find_runs(path):
            raise ValueError(f"no class-inc run logs under {path} (no *.h5 files there); make them with: {MAKE_RUNS}")
    return load_runs(paths)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m reports.classinc RUNS_DIR [...] -o OUT/``: find the class-inc run logs, write the report, print
    the tables and the path of ``index.html``; runs left out (incomplete, diverged, repeated) are listed on stderr.
    Bad input (missing path, not a run log, no class-inc runs, none complete, an output path that cannot be
    written): one line on stderr, exit code 2."""
    parser = argparse.ArgumentParser(
        prog="python -m reports.classinc",
        description="Tables and figures of the paper's class-incremental experiments (tb:mnist, tb:cifar) from "
                    "class-inc run logs.")
    parser.add_argument("runs", nargs="+", metavar="RUNS_DIR", help="directory of run logs (or a run log .h5)")
    parser.add_argument("-o", "--out", required=True, help="output directory (created if missing)")
    args = parser.parse_args(argv)
    try:
        runs = _load(args.runs)
        classinc = [r for r in runs if is_classinc_run(r)]
        if not classinc:
            raise ValueError(f"no class-inc run logs under {', '.join(args.runs)} ({len(runs)} other run log(s)); "
                             f"make them with: {MAKE_RUNS}")
        _, left = usable_runs(classinc)
        index = build_classinc_report(classinc, output_dir(args.out))
    except (RunLogError, ValueError) as err:
        print(f"error: {err}".replace("\n", " "), file=sys.stderr)
        return 2
    for x in left:
        warn(f"left out {x.path}: {x.reason}")
    print((Path(args.out) / "class_inc_tables.md").read_text(encoding="utf-8"))
    print(index)
    return 0


__all__ = ["TITLE", "METHOD_COLORS", "method_colors", "accuracy_figure", "matrix_figure",
           "probe_figure", "best_cells", "paper_cells", "sweep_cells", "forgetting_cells", "matrix_cells",
           "classinc_markdown", "build_classinc_report", "main"]
