"""Streaming regression reports, writing: tables as text, the report folder and the command line
``python -m reports.stream``."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from runlog import Run, RunLogError

from .. import paper
from .. import plots as figures
from ..cli import load_runs, output_dir, steps_arg
from ..html import Table, write_index
from .data import (EditTable, StreamRow, SweepRow, _grouped, _row_label, best_runs, edit_records,
                   edit_table, incomplete_runs, is_edit_run, is_stream_run, lr_sweep, seeds_phrase, stream_table,
                   table_caption)
from .plots import edit_figure, mse_curves, sine_panels


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
    head = f"**Table tb:sin.** {table_caption(r.n_seeds for r in rows)}" + (f" {note}" if note else "")
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
    notes = [["statistic", table_caption(r.n_seeds for r in rows)]]
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
        tables.append(Table(f"Table tb:sin: final test MSE, mean ± standard error over "
                            f"{seeds_phrase(r.n_seeds for r in rows)} at each method's best setting (see Notes), "
                            "measured vs paper", *_stream_cells(rows)))
        best = best_runs(stream_runs)
        try:
            fig = sine_panels(best, steps)
        except ValueError:
            fig = None
        if fig is not None:
            figures.save(fig, out / "sine_panels.png")
            sections.setdefault("Figure 2a: learned function and NTK", []).append(
                ("true sin(pi x), learned f(x) and NTK(x, x_t) divided by its largest |value| (so within [-1, 1]) "
                 "at probe steps (t = samples seen); each method at its selected setting, one seed; the same y-range "
                 "in every panel", "sine_panels.png"))
        groups = _grouped(stream_runs)
        by_method = {_row_label(r): groups[(r.method, r.config_label, r.best_lr)] for r in rows}
        fig = mse_curves(by_method)
        if fig is not None:
            figures.save(fig, out / "test_mse.png")
            sections.setdefault("Test MSE during the stream", []).append(
                ("test MSE after each sample (log scale), each method at its selected setting: mean over seeds, "
                 "shaded ± standard error", "test_mse.png"))
    if edits is not None:
        md.append(edit_markdown(edits))
        columns, cells = _edit_cells(edits)
        if edits.ratio is not None:
            notes.append(["ReLU / Elephant far change", f"{edits.ratio:.3g}"])
        tables.append(Table("Local editing (Figure 2b)", columns, cells))
        figures.save(edit_figure(edit_runs), out / "edit.png")
        sections.setdefault("Figure 2b: local editing", []).append(
            (f"f before and after moving the target at x={edits.x_edit:g} to {edits.target:g} (one seed), and "
             "the change far from it per activation (mean ± SE over seeds)", "edit.png"))
    if rows:
        tables.append(Table("Learning-rate sweep: mean final test MSE ± SE per setting", *_sweep_cells(sweep)))
    tables.insert(0, Table("Notes", ["item", "note"], notes))
    (out / "stream_table.md").write_text("\n".join(md), encoding="utf-8")
    return write_index(out, "Streaming regression on sin(pi x) (paper section 6.1)", tables, sections)


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
