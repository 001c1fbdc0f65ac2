"""The one-command showcase: what the toolkit shows about Elephant vs ReLU, in about a minute on a laptop CPU.

    python -m agents.showcase [--out showcase] [--seeds 0,1,2]

1. the paper's sparsity table, measured (Definition 1, eps -> 0, C -> inf);
2. streaming regression on sin(pi x) for Elephant and ReLU (fewer seeds than the paper's 5; the page says how many)
   with NTK, learned-function, sparsity and gradient-covariance probes;
3. local editing at x = 1.5 (Figure 2b) with the measured change far from the edit;
and writes ``OUT/index.html`` (with ``OUT/stream/`` and ``OUT/probes/`` reports beside it). The full table is
``python -m agents.grid agents/grids/stream_table.yml`` (see the README).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from interference.demo import sparsity_table
from probes import find_runs, read_run
from reports.build import report_parts
from reports.html import Table, write_index
from reports.stream import build_stream_report, edit_table, stream_table

from .commands import get_command

# Learning rates: each method's best on the paper's grid in our full-table run (README, "Streaming table").
METHODS = {"elephant": 3e-4, "relu": 3e-3}


def run(out: Path, seeds: str) -> Path:
    torch.set_num_threads(1)
    start = time.perf_counter()
    rows = sparsity_table()
    print("Sparsity of activations and of their derivatives (measured | paper):")
    for name, f, pf, g, pg in rows:
        print(f"  {name:9s} S(f) = {f:.3f} | {pf:.2f}    S(f') = {g:.3f} | {pg:.2f}")

    runs_dir = out / "runs"
    stream, edit = get_command("stream-sin"), get_command("edit")
    for act, lr in METHODS.items():
        cfg = stream.make_config({"act": act, "lr": lr, "seeds": seeds, "probe": "ntk,outputs,sparsity,gradcov"})
        summary = stream.run(cfg, stream.run_dir(cfg, runs_dir))
        print(f"stream-sin {act:9s} lr={lr:g}: final test MSE per seed {summary['final_mse']}")
        ecfg = edit.make_config({"act": act, "seeds": seeds})
        summary = edit.run(ecfg, edit.run_dir(ecfg, runs_dir))
        print(f"edit       {act:9s}: mean |change| far from x=1.5 per seed {summary['far_change']}")

    stream_runs = [read_run(p) for p in find_runs(runs_dir / "stream-sin")]
    edit_runs = [read_run(p) for p in find_runs(runs_dir / "edit")]
    n_seeds = len(seeds.split(","))
    note = (f"Showcase scale: {n_seeds} seeds per method (the paper uses 5) and one learning rate per method (each "
            "method's best in the full sweep); the full table is `python -m agents.grid agents/grids/stream_table.yml`.")
    build_stream_report(stream_runs, edit_runs, out / "stream", note=note)
    parts = report_parts(stream_runs, out / "probes")
    write_index(out / "probes", "Probes of the streaming runs", parts=parts)

    table = stream_table(stream_runs)
    edits = edit_table(edit_runs)
    tables = [
        Table("Function and gradient sparsity (Definition 1; measured vs paper)",
              ["activation", "S(f) measured", "paper", "S(f') measured", "paper"],
              [[n, f"{f:.3f}", f"{pf:g}", f"{g:.3f}", f"{pg:g}"] for n, f, pf, g, pg in rows]),
        Table(f"Streaming sin(pi x): final test MSE, mean ± SE over {n_seeds} seeds (paper: 5 seeds, best lr)",
              ["method", "lr", "measured", "paper"],
              [[r.method, f"{r.best_lr:g}", f"{r.mean:.4f} ± {r.sem:.4f}",
                "" if r.paper_mean is None else f"{r.paper_mean:.4f} ± {r.paper_sem:.4f}"] for r in table]),
        Table("Editing at x = 1.5 (target -1 -> -1.5): mean |change| where |x - 1.5| > 0.2",
              ["activation", "far change (mean ± SE)", "gradient steps"],
              [[e.act, f"{e.mean_far_change:.4f} ± {e.sem_far_change:.4f}", f"{e.mean_steps:.0f}"]
               for e in edits.rows]
              + ([["ReLU / Elephant", f"{edits.ratio:.1f}x", ""]] if edits.ratio is not None else [])),
    ]
    figures = {
        "Streaming regression (Figure 2a): learned function and normalised NTK(x, x_t)": [
            ("Elephant (top) and ReLU (bottom) after 1 to 200 samples: the learned function and NTK(x, x_t)",
             "stream/sine_panels.png"),
            (f"Test MSE after each sample, mean ± SE over {n_seeds} seeds", "stream/test_mse.png")],
        "Local editing (Figure 2b)": [("Before and after the edit at x = 1.5 (seed 0), and the far change of every "
                                       "seed", "stream/edit.png")],
        **{f"Probes during training: {heading.lower()}": [(caption, f"probes/{src}") for caption, src in figs]
           for part in parts for heading, figs in part.sections.items()},
    }
    notes = [f"Showcase scale: {n_seeds} seeds per method (the paper and the README's tables use 5). Elephant's "
             "far change after an edit varies between seeds more than ReLU's, so the ReLU / Elephant ratio moves "
             "with the seeds drawn (the README quotes 5 seeds: python -m agents.train edit --act elephant --seeds "
             "0,1,2,3,4, and the same for relu)."]
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
