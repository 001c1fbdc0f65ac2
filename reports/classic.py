"""The classic-control study (the paper's Figure "DQN ... under various buffer sizes"): final return against
replay-buffer size, per environment and activation, at each setting's best learning rate.

    python -m reports.classic RUNS_DIR [MORE ...] -o OUT/

Final return = mean episode return over the last 10% of a run's episodes (as in the paper); per (env, activation,
buffer size) the learning rate with the highest mean final return over seeds is selected, and the page shows that
mean ± standard error over seeds (std with ddof=1 / sqrt(n)).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from probes.runlog import Run, RunLogError

from .cli import load_runs
from .data import final_return
from .html import Table, write_index
from .plots import save

__all__ = ["ClassicRow", "classic_table", "buffer_figure", "main"]


@dataclass(frozen=True)
class ClassicRow:
    env: str
    act: str
    buffer_size: int
    best_lr: float
    mean: float
    sem: float
    n_seeds: int


def classic_table(runs: Sequence[Run]) -> list[ClassicRow]:
    """Best-learning-rate final return per (env, activation, buffer size), from DQN run logs."""
    groups: dict[tuple[str, str, int], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        c = run.config
        if c.get("algo") != "dqn" or "episode_return" not in run.scalars or len(run.scalars["episode_return"][0]) == 0:
            continue
        groups[(c["env"], c["act"], int(c["buffer_size"]))][float(c["learning_rate"])].append(final_return(run))
    rows = []
    for (env, act, buffer), by_lr in sorted(groups.items()):
        lr, values = max(by_lr.items(), key=lambda kv: np.mean(kv[1]))
        v = np.asarray(values)
        sem = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")
        rows.append(ClassicRow(env, act, buffer, lr, float(v.mean()), sem, len(v)))
    return rows


def buffer_figure(rows: Sequence[ClassicRow]) -> Figure:
    """One panel per environment: final return (mean ± SE) against buffer size (log scale), one line per activation."""
    envs = sorted({r.env for r in rows})
    fig = Figure(figsize=(4.5 * len(envs), 3.6), layout="constrained")
    axes = fig.subplots(1, len(envs), squeeze=False)[0]
    for ax, env in zip(axes, envs):
        for act in sorted({r.act for r in rows if r.env == env}):
            pts = sorted((r.buffer_size, r.mean, r.sem) for r in rows if r.env == env and r.act == act)
            x, m, s = (np.array(v, dtype=float) for v in zip(*pts))
            ax.plot(x, m, marker="o", label=act)
            ax.fill_between(x, m - np.nan_to_num(s), m + np.nan_to_num(s), alpha=0.2)
        ax.set_xscale("log")
        ax.set_xlabel("buffer size")
        ax.set_ylabel("final return (last 10% of episodes)")
        ax.set_title(env)
        ax.legend()
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports.classic", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="run logs or directories of them")
    parser.add_argument("-o", "--out", type=Path, required=True, help="output folder")
    args = parser.parse_args(argv)
    try:
        rows = classic_table(load_runs(args.paths))
        if not rows:
            raise RunLogError(f"no DQN runs with episodes under {', '.join(map(str, args.paths))}")
    except RunLogError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    save(buffer_figure(rows), args.out / "buffer_sizes.png")
    table = Table("Final return at the best learning rate (mean ± SE over seeds)",
                  ["env", "activation", "buffer", "best lr", "final return", "seeds"],
                  [[r.env, r.act, str(r.buffer_size), f"{r.best_lr:g}", f"{r.mean:.1f} ± {r.sem:.1f}", str(r.n_seeds)]
                   for r in rows])
    index = write_index(args.out, "DQN on classic tasks across buffer sizes", [table],
                        {"Final return against buffer size": [("best learning rate per point", "buffer_sizes.png")]})
    for r in rows:
        print(f"{r.env:16s} {r.act:9s} buffer {r.buffer_size:6d}  lr {r.best_lr:<7g} "
              f"{r.mean:8.1f} ± {r.sem:.1f}  ({r.n_seeds} seeds)")
    print(index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
