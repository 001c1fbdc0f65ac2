"""The one-command showcase: what the toolkit shows about Elephant vs ReLU, in about a minute on a laptop CPU.

    python -m agents.showcase [--out showcase] [--seeds 0,1,2]

1. the paper's sparsity table, measured (Definition 1, eps -> 0, C -> inf);
2. streaming regression on sin(pi x) for Elephant and ReLU (fewer seeds than the paper's 5; the page says how many)
   with NTK, learned-function, sparsity and gradient-covariance probes;
3. local editing at x = 1.5 (Figure 2b) with the measured change far from the edit;
and writes ``OUT/index.html`` (with ``OUT/stream/`` and ``OUT/probes/`` reports beside it). The full table is
``python -m agents.grid agents/grids/stream_table.yml`` (docs/reproductions/streaming-regression.md).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import fields
import re
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from interference.demo import sparsity_table
from runlog import Run, find_runs, read_run
from reports import data as run_data
from reports.build import report_parts
from reports.html import Part, Table, write_index
from reports.paper import method_name
from reports.stream import build_stream_report, edit_table, seeds_phrase, stream_table

from .commands import get_command
from .lifecycle import execute
from .stream.edit import EditConfig
from .stream.learner import StreamConfig

# Learning rates: each method's best on the paper's grid in the full table (docs/reproductions/streaming-regression.md).
METHODS = {"elephant": 3e-4, "relu": 3e-3}


#: probe sections of the showcase: heading as the report names it -> heading on the page (others: as named)
HEADINGS = {"NTK": "Empirical NTK"}
#: the probe report's sections left off the showcase: its learning curve repeats the stream's test MSE (drawn on a
#: log scale above, where Elephant's curve is not flattened to zero)
DROPPED_SECTIONS = ("Learning curves",)
#: columns of the probe report's run tables left off the showcase's copy: development provenance (kept in each run
#: log) rather than results
DROPPED_COLUMNS = ("git commit",)
#: settings `run` passes on to each command (the streaming runs take the stream's; the edit also its own)
STREAM_KEYS = {f.name for f in fields(StreamConfig)} - {"act", "lr", "seeds"} | {"probe_at"}
EDIT_KEYS = STREAM_KEYS - {"probe_at"} | {f.name for f in fields(EditConfig)} - {"act", "lr", "seeds"}


def zero_gradient_rows(runs: Sequence[Run], loss: str = "mse") -> dict[str, int]:
    """``{act: rows}``: per activation, the rows of the gradient-covariance heatmaps (its lowest seed, at the steps
    the report draws: middle and end of the stream) whose off-diagonal entries are all exactly 0 (a sample whose
    loss gradient is exactly zero: ``gradient_covariance`` sets its row and column to 0 and its diagonal to 1)."""
    out: dict[str, int] = {}
    for run in sorted(runs, key=lambda r: r.seed):
        act = str(run.config.get("act"))
        if act in out or loss not in run.probes.get("gradcov", {}):
            continue
        count = 0
        for rec in run_data.select_records(run, "gradcov", loss):
            c = np.asarray(rec.value)
            off = c[~np.eye(len(c), dtype=bool)].reshape(len(c), len(c) - 1)
            count += int((off == 0).all(axis=1).sum())
        out[act] = count
    return out


def _lowest_seed(runs: Sequence[Run], act: str) -> Run | None:
    found = sorted((r for r in runs if r.config.get("act") == act), key=lambda r: r.seed)
    return found[0] if found else None


def zero_output_edge(runs: Sequence[Run], act: str, loss: str = "mse") -> dict[int, float]:
    """``{step: x}``: for `act`'s lowest seed, at the steps of its gradient-covariance heatmaps, the largest probe
    input ``x`` with ``f(x') == 0`` exactly for every probe input ``x' <= x`` (from the ``outputs`` probe's record
    at that step); steps where ``f`` at the smallest probe input is not exactly 0 are left out."""
    run = _lowest_seed(runs, act)
    if run is None or loss not in run.probes.get("gradcov", {}) or run_data.probe_inputs(run) is None:
        return {}
    x = np.asarray(run_data.probe_inputs(run)).reshape(-1)
    order = np.argsort(x)
    out = {}
    for rec in run_data.select_records(run, "gradcov", loss):
        f = run_data.nearest_record(run, "outputs", "y", rec.step)
        if f is None or f.step != rec.step:
            continue
        zero = (np.asarray(f.value).reshape(len(x), -1)[order] == 0).all(axis=1)
        if zero[0]:
            n = len(zero) if zero.all() else int(np.argmin(zero))  # the leading run of exact zeros
            out[rec.step] = float(x[order][n - 1])
    return out


def flat_ntk_steps(runs: Sequence[Run], act: str) -> list[int]:
    """Steps at which `act`'s lowest seed has an NTK(x, x_t) that is exactly 0 at every probe input (the sample
    being learned has a zero gradient)."""
    run = _lowest_seed(runs, act)
    ntk = run.probes.get("ntk", {}) if run is not None else {}
    if "kernel" not in ntk or np.asarray(ntk["kernel"]).ndim != 2:
        return []
    return [int(s) for s, k in zip(ntk["step"], ntk["kernel"]) if not np.asarray(k).any()]


def _gradcov_steps(runs: Sequence[Run]) -> list[int]:
    steps = {int(s) for r in runs for s in r.probes.get("gradcov", {}).get("step", ())}
    return sorted(steps)


def _k(runs: Sequence[Run]) -> int | None:
    for r in runs:
        if "mse" in r.probes.get("gradcov", {}):
            return int(r.probes["gradcov"]["mse"].shape[-1])
    return None


def _probe_caption(heading: str, caption: str, src: str, runs: Sequence[Run], seeds: str) -> str:
    """The showcase's caption of a probe-report figure: what it shows, in a reader's words."""
    k = _k(runs)
    if heading == "Gradient covariance" and k is not None:
        drawn = (f"{k} distinct samples drawn without replacement from those seen so far, in order of x (the "
                 f"probe starts once {k} samples have been seen)")
        if src.endswith("_over_time.png"):
            steps = _gradcov_steps(runs)
            at = f" (at {', '.join(map(str, steps))} samples seen)" if steps else ""
            return (f"Interference over time{at}: the mean off-diagonal C_ij and the fraction of negative C_ij "
                    f"among {drawn}; mean ± SE over {seeds}. A sample whose loss gradient is exactly zero (the "
                    "white rows of the maps above) has C_ij = 0: it counts in the mean, and not as negative. A mean "
                    "near 0 can also come from large entries of both signs (compare the maps above).")
        text = (f"Gradient covariance C_ij = cos(g_i, g_j) of the per-sample MSE-loss gradients g_i of {drawn}, "
                "one seed per activation at the middle and end of the stream: red (C_ij > 0), an update on sample "
                "i also helps sample j; blue (C_ij < 0), it interferes.")
        zeros = {act: n for act, n in zero_gradient_rows(runs).items() if n}
        if zeros:
            which = " and ".join(f"{n} for {method_name(a)}" for a, n in zeros.items())
            text += (f" White rows and columns ({which} in these panels) are samples whose loss gradient is exactly "
                     "zero: such a sample has no gradient direction, so C_ij is set to 0 off the diagonal there (1 "
                     "on it).")
            edge = zero_output_edge(runs, "relu") if "relu" in zeros else {}
            if edge:
                where = ", ".join(f"x <= {x:.2f} after {t} samples" for t, x in edge.items())
                seed = _lowest_seed(runs, "relu").seed
                text += (" For ReLU they are the samples at the smallest x, where no hidden unit is active (dead "
                         "ReLUs at those inputs): the hidden biases start at zero, so at first every unit's kink is "
                         "at x = 0, and during the stream the units active at the smallest x were switched off there "
                         "(their kinks moved to x > 0). Below the first kink f(x) is exactly 0 (the net has no output "
                         f"bias; seed {seed}: for {where}) and so is the gradient of every parameter.")
        return text
    if heading == "NTK" and src.endswith("ntk_current.png"):
        return ("Empirical NTK(x, x_t) of every probe input x against the sample being learned x_t (dashed line), "
                "divided by its largest |value| (so within [-1, 1], as in the paper's Figure 2a), at the middle and "
                "end of the stream; one seed per activation.")
    if heading == "Sparsity and dormancy":  # "act=relu lr=0.003: sparsity.dormant: ...; layers: activation 1 = 1"
        caption = re.sub(r"^act=(\w+) lr=(\S+): ", lambda m: f"{method_name(m.group(1))} (lr {m.group(2)}), "
                         "the hidden layer: ", caption)
        caption = re.sub(r"sparsity\.(\w+)", lambda m: m.group(1).replace("_", " "), caption)
        return re.sub(r"; layers: activation 1 = 1$", "", caption)
    return caption


def _showcase_parts(parts: Sequence[Part], out: Path, runs: Sequence[Run], seeds: str) -> list[Part]:
    """The probe report's parts without :data:`DROPPED_SECTIONS` (their figures deleted) and without the
    :data:`DROPPED_COLUMNS` and the all-empty columns of their tables (RL returns, for a streaming run); sections
    headed as in :data:`HEADINGS`, figures captioned in a reader's words (:func:`_probe_caption`; `seeds`: e.g.
    "3 seeds")."""
    kept = []
    for part in parts:
        for heading in DROPPED_SECTIONS:
            for _, src in part.sections.get(heading, ()):
                for suffix in (".png", ".pdf"):
                    (out / src).with_suffix(suffix).unlink(missing_ok=True)
        sections = {HEADINGS.get(h, h): [(_probe_caption(h, caption, src, runs, seeds), src) for caption, src in figs]
                    for h, figs in part.sections.items() if h not in DROPPED_SECTIONS}
        tables = []
        for table in part.tables:
            keep = [i for i, c in enumerate(table.columns) if c not in DROPPED_COLUMNS
                    and (i == 0 or any(str(row[i]).strip() for row in table.rows))]
            tables.append(Table(table.heading, [table.columns[i] for i in keep],
                                [[row[i] for i in keep] for row in table.rows]))
        kept.append(dataclasses.replace(part, sections=sections, tables=tables))
    return kept


def run(out: Path, seeds: str, settings: Mapping[str, Any] | None = None) -> Path:
    """Train, report and write ``out/index.html``; return its path. `settings`: more ``stream-sin``/``edit``
    settings (e.g. ``{"width": 100, "n": 60}`` for a quick check; each command takes those it knows)."""
    torch.set_num_threads(1)
    start = time.perf_counter()
    settings = dict(settings or {})
    rows = sparsity_table()
    print("Sparsity of activations and of their derivatives (measured | paper):")
    for name, f, pf, g, pg in rows:
        print(f"  {name:9s} S(f) = {f:.3f} | {pf:.2f}    S(f') = {g:.3f} | {pg:.2f}")

    runs_dir = out / "runs"
    unknown = set(settings) - STREAM_KEYS - EDIT_KEYS
    if unknown:
        raise ValueError(f"showcase: unknown settings {sorted(unknown)}")
    stream, edit = get_command("stream-sin"), get_command("edit")
    probe_at: list[int] = []
    for act, lr in METHODS.items():
        cfg = stream.make_config({"act": act, "lr": lr, "seeds": seeds, "probe": "ntk,outputs,sparsity,gradcov",
                                  **{k: v for k, v in settings.items() if k in STREAM_KEYS}})
        probe_at = cfg["probe_at"]
        summary = execute(stream.train, cfg, stream.run_dir(cfg, runs_dir))
        print(f"stream-sin {act:9s} lr={lr:g}: final test MSE per seed {summary['final_mse']}")
        ecfg = edit.make_config({"act": act, "seeds": seeds, **{k: v for k, v in settings.items() if k in EDIT_KEYS}})
        summary = execute(edit.train, ecfg, edit.run_dir(ecfg, runs_dir))
        print(f"edit       {act:9s}: mean |change| far from x=1.5 per seed {summary['far_change']}")

    stream_runs = [read_run(p) for p in find_runs(runs_dir / "stream-sin")]
    edit_runs = [read_run(p) for p in find_runs(runs_dir / "edit")]
    n_seeds = len(seeds.split(","))
    over = seeds_phrase([n_seeds])  # "3 seeds", "1 seed"
    note = (f"Showcase scale: {over} per method (the paper uses 5) and one learning rate per method (each "
            "method's best in the full sweep); the full table is "
            "`python -m agents.grid agents/grids/stream_table.yml`.")
    build_stream_report(stream_runs, edit_runs, out / "stream", note=note)
    parts = _showcase_parts(report_parts(stream_runs, out / "probes"), out / "probes", stream_runs, over)
    write_index(out / "probes", "Probes of the streaming runs", parts=parts)

    table = stream_table(stream_runs)
    edits = edit_table(edit_runs)
    stat = f"mean ± SE over {over}" if n_seeds > 1 else f"{over} (no SE with one seed)"
    tables = [
        Table("Function and gradient sparsity (Definition 1; measured vs paper)",
              ["activation", "S(f) measured", "paper", "S(f') measured", "paper"],
              [[method_name(n), f"{f:.3f}", f"{pf:g}", f"{g:.3f}", f"{pg:g}"] for n, f, pf, g, pg in rows]),
        Table(f"Streaming sin(pi x): final test MSE, {stat} (paper: mean ± SE over 5 seeds, best lr)",
              ["method", "lr", "measured", "paper"],
              [[method_name(r.method), f"{r.best_lr:g}",
                f"{r.mean:.4f} ± {r.sem:.4f}" if n_seeds > 1 else f"{r.mean:.4f}",
                "" if r.paper_mean is None else f"{r.paper_mean:.4f} ± {r.paper_sem:.4f}"] for r in table]),
        Table("Editing at x = 1.5 (target -1 -> -1.5): mean |change| where |x - 1.5| > 0.2",
              ["activation", f"far change ({stat})", "gradient steps (mean)"],
              [[method_name(e.act), f"{e.mean_far_change:.4f} ± {e.sem_far_change:.4f}" if n_seeds > 1
                else f"{e.mean_far_change:.4f}", f"{e.mean_steps:.0f}"] for e in edits.rows]
              + ([["ReLU / Elephant", f"{edits.ratio:.1f}x", ""]] if edits.ratio is not None else [])),
    ]
    steps = f"{probe_at[0]} to {probe_at[-1]}" if probe_at else "a few numbers of"
    flat = {act: t for act in METHODS if (t := flat_ntk_steps(stream_runs, act))}
    relu_why = " (no hidden unit is active there; see the gradient covariance below)"
    flat_ntk = "".join(f". {method_name(act)}'s NTK is 0 everywhere at t = {', '.join(map(str, t))}: its gradient "
                       "at the sample being learned, x_t, is exactly zero" + (relu_why if act == "relu" else "")
                       for act, t in flat.items()) + "."
    figures = {
        "Streaming regression (Figure 2a): learned function and normalised NTK(x, x_t)": [
            (f"Elephant (top) and ReLU (bottom) after {steps} samples (t = samples seen; seed 0; the same y-range "
             "in every panel): the true function, the learned function and the NTK against the sample being "
             "learned, divided by its largest |value| (so within [-1, 1], as in the paper)" + flat_ntk,
             "stream/sine_panels.png"),
            (f"Test MSE after each sample (log scale), {'mean ± SE over ' + over if n_seeds > 1 else over}",
             "stream/test_mse.png")],
        "Local editing (Figure 2b)": [("Before and after the edit at x = 1.5 (seed 0), and the far change of every "
                                       "seed", "stream/edit.png")],
        **{f"Probes during training: {heading}": [(caption, f"probes/{src}") for caption, src in figs]
           for part in parts for heading, figs in part.sections.items()},
    }
    notes = [f"Showcase scale: {over} per method (the paper and the reproduction pages in docs/reproductions use "
             "5). Elephant's far change after an edit is small, so its spread between seeds is large relative to its "
             "mean and the ReLU / Elephant ratio moves with the seeds drawn (docs/reproductions/local-editing.md "
             "reports 5 seeds: python -m agents.train edit --act elephant --seeds 0,1,2,3,4, and the same for relu)."]
    links = [("Streaming report (table, Fig. 2 panels)", "stream/index.html"), ("Probe report", "probes/index.html")]
    index = write_index(out, "interference showcase: Elephant vs ReLU", tables, figures, notes=notes, links=links)
    print(f"\n{index}  (built in {time.perf_counter() - start:.0f} s; full reports in {out / 'stream'} and "
          f"{out / 'probes'})")
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.showcase", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("showcase"), help="output folder")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds per method")
    args = parser.parse_args(argv)
    run(args.out, args.seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
