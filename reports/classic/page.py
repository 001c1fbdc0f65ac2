"""The classic-control study, writing: the notes, tables and CSV files of the report, the report folder and the
command line ``python -m reports.classic``."""

from __future__ import annotations

import csv
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runlog import Run, RunLogError

from ..cli import OutputDirError, load_runs, publish_study, study_inputs, study_parser, warn
from ..data import config_key, final_return, format_mean_sem
from ..html import Table
from ..plots import save
from .data import REFERENCE, ClassicRow, _usable_runs, authors_comparison, classic_table, reference_data
from .plots import aggregate_figure, buffer_figure, profile_figure
from .scores import REPS, aggregates, performance_profiles, score_matrices


def _search_notes(rows: Sequence[ClassicRow]) -> list[str]:
    """A note where the points were selected from different sets of learning rates (a wider search favours its
    points), naming each set and the (task, activation) pairs searched over it; none where all are equal."""
    searched: dict[tuple[float, ...], set[str]] = defaultdict(set)
    for r in rows:
        searched[r.lrs].add(f"{r.env} {r.act}")
    if len(searched) < 2:
        return []
    parts = [f"{{{', '.join(f'{lr:g}' for lr in lrs)}}} for {', '.join(sorted(pairs))}"
             for lrs, pairs in sorted(searched.items(), key=lambda item: (-len(item[0]), item[0]))]
    return ["The learning rates searched differ between points, which favours the points searched more widely: "
            + "; ".join(parts) + "."]


def _coverage_notes(rows: Sequence[ClassicRow]) -> list[str]:
    """A note naming the learning rates that were tried but had fewer usable seeds than their point's best-covered
    one (runs left out: diverged, unfinished, ...), and so were not selectable; none where all were complete."""
    short = [f"{r.env} {r.act}{f' {r.setting}' if r.setting else ''} at buffer {r.buffer_size}: "
             + ", ".join(f"{lr:g} ({k} of {max(r.lr_seeds)})" for lr, k in zip(r.lrs, r.lr_seeds)
                         if k < max(r.lr_seeds)) for r in rows if r.lr_seeds and min(r.lr_seeds) < max(r.lr_seeds)]
    if not short:
        return []
    return ["Learning rates with fewer usable seeds than their point's best-covered one were not selectable (their "
            "other runs were left out, as the warnings say): " + "; ".join(short) + "."]


def _left_out_note(runs: Sequence[Run]) -> list[str]:
    """A note counting the DQN runs left out and the repeats counted once (each is named in a warning)."""
    _, warnings = _usable_runs(runs)
    out = sum(w.endswith("left out") for w in warnings)
    repeats = len(warnings) - out
    if not warnings:
        return []
    return [f"{out} DQN run(s) left out (unfinished, diverged, interrupted, without episodes or with a non-finite "
            f"final return) and {repeats} repeat(s) of a config and seed counted once; each is named in a warning "
            "on stderr."]


def _ci(ci: tuple[float, float]) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def _side(stats: tuple[float, float, int] | None, missing: str) -> str:
    return f"{format_mean_sem(stats[0], stats[1], 1)} ({stats[2]})" if stats else missing


def _write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def _point_csvs(rows: Sequence[ClassicRow], runs: Sequence[Run], out: Path) -> None:
    """``points.csv`` (one row per point: the selected learning rate's mean, SE and seeds, the learning rates
    searched) and ``runs.csv`` (one row per usable run at every learning rate: its final return and run log), so that
    the numbers behind the page can be re-analysed without the run logs."""
    _write_csv(out / "points.csv", ["env", "activation", "setting", "buffer_size", "best_lr", "mean", "sem", "n_seeds",
                                    "seeds", "finals", "lrs_tried", "usable_seeds_per_lr"],
               [[r.env, r.act, r.setting, r.buffer_size, r.best_lr, r.mean, r.sem, r.n_seeds,
                 " ".join(map(str, r.seeds)), " ".join(str(float(f)) for f in r.finals), " ".join(map(str, r.lrs)),
                 " ".join(map(str, r.lr_seeds))] for r in rows])
    usable, _ = _usable_runs(runs)
    setting = {config_key(r.config, ("seed", "learning_rate")): row.setting for row in rows for r in row.runs}
    _write_csv(out / "runs.csv", ["env", "activation", "setting", "buffer_size", "learning_rate", "seed",
                                  "final_return", "run_log"],
               sorted([[r.config["env"], r.config["act"], setting[config_key(r.config, ("seed", "learning_rate"))],
                        int(r.config["buffer_size"]), float(r.config["learning_rate"]), r.seed, float(final_return(r)),
                        str(r.path)] for r in usable], key=lambda row: row[:6]))


def _aggregate_part(rows: Sequence[ClassicRow], out: Path, reps: int, seed: int
                    ) -> tuple[list[Table], dict[str, list[tuple[str, str]]], list[str]]:
    """The aggregates' tables, figures and notes (warnings printed); rows of tasks without normalisation constants
    are left out, with a warning naming them."""
    known = reference_data()["normalisation"]["tasks"]
    unknown = sorted({r.env for r in rows} - set(known))
    matrices, tasks, warnings = score_matrices([r for r in rows if r.env in known])
    if unknown:
        warnings.insert(0, f"no normalisation constants for {', '.join(unknown)} in {REFERENCE.name}; left out of "
                           "the aggregates")
    for message in warnings:
        warn(message)
    left_out = [f"In the aggregates: {'; '.join(warnings)}."] if warnings else []
    if not matrices:
        return [], {}, ["No aggregates: no activation and buffer size has runs on every task with normalisation "
                        "constants.", *left_out]
    aggs = aggregates(matrices, reps, seed)
    _write_csv(out / "aggregates.csv", ["activation", "buffer_size", "iqm", "iqm_low", "iqm_high", "mean", "mean_low",
                                        "mean_high", "seeds_per_task", "tasks"],
               [[a.act, a.buffer_size, a.iqm, *a.iqm_ci, a.mean, *a.mean_ci, a.n_seeds, " ".join(tasks)]
                for a in sorted(aggs, key=lambda a: (a.act, a.buffer_size))])
    save(aggregate_figure(aggs), out / "aggregate_iqm.png")
    save(profile_figure(performance_profiles(matrices, reps, seed)), out / "performance_profiles.png")
    table = Table(f"Normalised final return across {', '.join(tasks)} (tasks x seeds; 95% stratified-bootstrap CI)",
                  ["activation", "buffer", "IQM", "IQM CI", "mean", "mean CI", "seeds per task"],
                  [[a.act, str(a.buffer_size), f"{a.iqm:.3f}", _ci(a.iqm_ci), f"{a.mean:.3f}", _ci(a.mean_ci),
                    str(a.n_seeds)] for a in sorted(aggs, key=lambda a: (a.act, a.buffer_size))])
    constants = "; ".join(f"{t}: R_random {known[t]['random']:g}, R_ref {known[t]['reference']:g}" for t in tasks)
    notes = [f"Normalised score = (R - R_random) / (R_ref - R_random) per task, R the final return of one seed at the "
             f"selected learning rate: R_random is a uniform-random policy's mean return, R_ref the best mean late "
             f"return (below) among the authors' activations at their default buffer (0 = random, 1 = the authors' "
             f"best); "
             f"{constants} ({REFERENCE.name}). Aggregates by rliable: IQM (25% trimmed mean) and mean over all tasks "
             f"x seeds, stratified-bootstrap 95% CIs from {reps} resamples (numpy seed {seed}); performance profiles "
             f"give the fraction of runs scoring above each threshold.", *left_out]
    sections = {"Aggregates across tasks": [("IQM against buffer size", "aggregate_iqm.png"),
                                            ("performance profiles per buffer size", "performance_profiles.png")]}
    return [table], sections, notes


def _comparison_part(rows: Sequence[ClassicRow]) -> tuple[Table, list[str]]:
    authors = reference_data()["authors"]
    comps = authors_comparison(rows, authors)
    settings = any(c.setting for c in comps)
    cells = [[c.env, c.act, *([c.setting] if settings else []), _side(c.ours, "no runs"),
              _side(c.theirs, "not in reference data"), f"{c.difference:.1f}" if math.isfinite(c.difference) else "—",
              f"{c.our_steps or '—'} / {c.their_steps or '—'}", str(len(c.our_lrs)) if c.our_lrs else "—"]
             for c in comps]
    table = Table(f"Ours against the authors' published results at buffer {authors['buffer_size']} (late return: "
                  "mean ± SE (seeds))", ["task", "activation", *(["setting"] if settings else []), "ours", "authors",
                                         "ours - authors", "steps ours / authors", "our lrs tried"], cells)
    only_ours = sorted({f"{c.env} {c.act}" for c in comps if c.theirs is None})
    only_theirs = sorted({f"{c.env} {c.act}" for c in comps if c.ours is None})
    notes = [f"Authors: {authors['source']} {authors['buffer_note']} {authors['seeds_note']} Late return, on both "
             f"sides: {authors['final']} SE = std (ddof=1) / sqrt(n) on both sides. The authors selected each "
             "point's learning rate from 8 (1e-2 to 3e-6); ours from the number of rates in the last column, so a "
             "point searched narrowly can only be worse than a wider search would make it.",
             f"No authors' numbers in the reference data for: {', '.join(only_ours) or 'none'}. Not run by us at "
             f"buffer {authors['buffer_size']}: {', '.join(only_theirs) or 'none'}."]
    return table, notes


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with `argv` (default ``sys.argv[1:]``); returns the exit code (2 on bad input)."""
    # the help text is the package's docstring, which describes the study
    parser = study_parser("python -m reports.classic", sys.modules[__package__].__doc__)
    parser.add_argument("--reps", type=int, default=REPS, help=f"bootstrap resamples of the CIs and performance "
                        f"profiles (default {REPS}; about a minute for 5 activations x 6 buffer sizes)")
    parser.add_argument("--seed", type=int, default=0, help="numpy seed of the bootstrap (default 0)")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be >= 1")
    try:
        runs = load_runs(args.paths)
        rows, out = study_inputs(runs, args.out, classic_table,
                                 f"no finished DQN runs with episodes under {', '.join(map(str, args.paths))}")
        agg_tables, agg_sections, agg_notes = _aggregate_part(rows, out, args.reps, args.seed)
        comparison, comparison_notes = _comparison_part(rows)
    except (RunLogError, OutputDirError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    save(buffer_figure(rows), out / "buffer_sizes.png")
    _point_csvs(rows, runs, out)
    settings = any(r.setting for r in rows)
    columns = ["env", "activation", *(["setting"] if settings else []), "buffer", "best lr", "final return", "seeds",
               "lrs tried"]
    cells = [[r.env, r.act, *([r.setting] if settings else []), str(r.buffer_size), f"{r.best_lr:g}",
              format_mean_sem(r.mean, r.sem, 1), str(r.n_seeds), ", ".join(f"{lr:g}" for lr in r.lrs)] for r in rows]
    table = Table("Final return at the best learning rate (mean ± SE over seeds)", columns, cells)
    notes = ["Final return = mean return of a run's last 10% of episodes. Per task, activation, buffer size and "
             "setting, the learning rate with the highest mean final return over seeds is selected; each point shows "
             "that learning rate's mean ± SE (std ddof=1 / sqrt(n)) over seeds.", *_left_out_note(runs),
             *_coverage_notes(rows), *_search_notes(rows), *agg_notes,
             *comparison_notes]
    sections = {"Final return against buffer size": [("best learning rate per point", "buffer_sizes.png")],
                **agg_sections}
    lines = [[f"{r.env:16s} {r.act:9s} buffer {r.buffer_size:6d}  lr {r.best_lr:<7g} "
              f"{r.mean:8.1f} ± {r.sem:.1f}  ({r.n_seeds} seeds)  {r.setting}".rstrip()] for r in rows]
    return publish_study(out, "DQN on classic tasks across buffer sizes", [table, *agg_tables, comparison], sections,
                         notes, lines)
