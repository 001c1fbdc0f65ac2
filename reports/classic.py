"""The classic-control study (the paper's Figure "DQN ... under various buffer sizes"): final return against
replay-buffer size, per environment and activation, at each setting's best learning rate.

    python -m reports.classic RUNS_DIR [MORE ...] -o OUT/

Runs are grouped by their whole config except the seed; groups that differ only in the learning rate are one
setting. Final return = mean episode return over the last 10% of a run's episodes (as in the paper); per setting
the learning rate with the highest mean final return over seeds is selected, and the page shows that mean ±
standard error over seeds (std with ddof=1 / sqrt(n)). Runs that did not finish (interrupted, diverged, or for
logs without a ``run_end`` record, last record short of ``n_timesteps``) and repeats of a config and seed are left
out with a warning on stderr.
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure

from probes.runlog import Run

from .cli import open_study
from .data import config_key, config_labels, final_return, finished, run_end, training_length
from .html import Table, write_index
from .plots import group_colors, save

__all__ = ["ClassicRow", "classic_table", "buffer_figure", "main"]

_KEYS = ("env", "act", "buffer_size", "learning_rate")  # config keys the study needs


@dataclass(frozen=True)
class ClassicRow:
    """One point: final return at a setting's best learning rate, over seeds. `setting` names the config keys
    that set it apart from the other settings of its env and activation besides the buffer size (e.g.
    ``"n_timesteps=2000"``), empty if none."""

    env: str
    act: str
    buffer_size: int
    setting: str
    best_lr: float
    mean: float
    sem: float
    n_seeds: int


def _usable_runs(runs: Sequence[Run]) -> tuple[list[Run], list[str]]:
    """The DQN runs with episodes that finished, one per (config, seed) (the first by path); and a warning line
    per DQN run left out (config lacking a study key, unfinished, no episodes, or a repeat of a config and
    seed)."""
    kept: dict[tuple[str, int], Run] = {}
    warnings = []
    for run in sorted(runs, key=lambda r: r.path):
        c = run.config
        if c.get("algo") != "dqn":
            continue
        key = (config_key(c), run.seed)
        if missing := [k for k in _KEYS if k not in c]:
            warnings.append(f"{run.path}: config has no {', '.join(missing)}; left out")
        elif not finished(run):
            how = {"nan": "diverged (non-finite loss)", "interrupted": "interrupted",
                   "write_error": "stopped by a failed write"}.get(run_end(run), "unfinished")
            of = f" of n_timesteps {c['n_timesteps']}" if "n_timesteps" in c else ""
            warnings.append(f"{run.path}: {how} run (last record at step {training_length(run)}{of}); left out")
        elif len(run.scalars.get("episode_return", ((), ()))[1]) == 0:
            warnings.append(f"{run.path}: no episodes recorded; left out")
        elif key in kept:
            warnings.append(f"{run.path}: same config and seed {run.seed} as {kept[key].path}; counted once")
        else:
            kept[key] = run
    return list(kept.values()), warnings


def classic_table(runs: Sequence[Run]) -> tuple[list[ClassicRow], list[str]]:
    """Best-learning-rate final return per setting (config except seed and learning rate) from the DQN runs in
    `runs`, and a warning line per DQN run left out (see `_usable_runs`)."""
    usable, warnings = _usable_runs(runs)
    finals: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    configs: dict[str, dict] = {}
    for run in usable:
        key = config_key(run.config, ("seed", "learning_rate"))
        configs.setdefault(key, run.config)
        finals[key][float(run.config["learning_rate"])].append(final_return(run))
    by_env_act: dict[tuple[str, str], list[str]] = defaultdict(list)
    for key, c in configs.items():
        by_env_act[(c["env"], c["act"])].append(key)
    rows = []
    for keys in by_env_act.values():
        labels = config_labels([configs[k] for k in keys], skip=("seed", "learning_rate", "buffer_size"))
        for key, setting in zip(keys, labels):
            c = configs[key]
            lr, values = max(finals[key].items(), key=lambda kv: np.mean(kv[1]))
            v = np.asarray(values)
            sem = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")
            rows.append(ClassicRow(c["env"], c["act"], int(c["buffer_size"]), setting, lr, float(v.mean()), sem,
                                   len(v)))
    return sorted(rows, key=lambda r: (r.env, r.act, r.setting, r.buffer_size)), warnings


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
            pts = sorted((r.buffer_size, r.mean, r.sem, r.n_seeds) for r in here if _line_label(r) == label)
            x, m, s, n = (np.array(v, dtype=float) for v in zip(*pts))
            ax.plot(x, m, marker="o", color=colors[label], label=f"{label} (n={int(n.min())})")
            ax.fill_between(x, m - np.nan_to_num(s), m + np.nan_to_num(s), color=colors[label], alpha=0.2)
        ax.set_xscale("log")
        ax.set_xlabel("replay buffer size (transitions)")
        ax.set_ylabel("final return (last 10% of episodes)")
        ax.set_title(f"{env}: mean ± SE over n seeds", fontsize=10)
        ax.legend(fontsize=7)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with `argv` (default ``sys.argv[1:]``); returns the exit code (2 on bad input)."""
    opened = open_study("python -m reports.classic", __doc__, argv, classic_table, "finished DQN runs with episodes")
    if opened is None:
        return 2
    _, rows, out = opened
    save(buffer_figure(rows), out / "buffer_sizes.png")
    settings = any(r.setting for r in rows)
    columns = ["env", "activation", *(["setting"] if settings else []), "buffer", "best lr", "final return", "seeds"]
    cells = [[r.env, r.act, *([r.setting] if settings else []), str(r.buffer_size), f"{r.best_lr:g}",
              f"{r.mean:.1f} ± {r.sem:.1f}", str(r.n_seeds)] for r in rows]
    table = Table("Final return at the best learning rate (mean ± SE over seeds)", columns, cells)
    index = write_index(out, "DQN on classic tasks across buffer sizes", [table],
                        {"Final return against buffer size": [("best learning rate per point", "buffer_sizes.png")]})
    for r in rows:
        print(f"{r.env:16s} {r.act:9s} buffer {r.buffer_size:6d}  lr {r.best_lr:<7g} "
              f"{r.mean:8.1f} ± {r.sem:.1f}  ({r.n_seeds} seeds)  {r.setting}".rstrip())
    print(index)
    return 0


if __name__ == "__main__":
    sys.exit(main())
