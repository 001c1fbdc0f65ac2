"""The policy-gradient study on MuJoCo: PPO and SAC per task and activation, the buffer-size figure, aggregates.

    python -m reports.mujoco RUNS_DIR [MORE ...] -o OUT/

Runs (PPO or SAC on the paper's MuJoCo tasks: HalfCheetah, Hopper, Walker2d, Ant, Reacher, Swimmer; finished) are
grouped by algorithm, task, activation, buffer size (SAC) and the rest of their config (the seed aside); runs of one
algorithm, task, activation and buffer size in two configs (another length, learning rate, ...) are refused with the
settings that differ: report them separately. A run's score is the authors' (qlan3/Elephant ``analysis``): the
mean return of its last 10% of training episodes (``episode_return``, raw rewards), then mean ± SE over seeds. Per
algorithm, task and buffer size:

* training returns, a trailing mean of 20 episodes, mean ± SE over seeds;
* a table: last-10% return (mean ± SE), all-episode return (the mean return of all its training episodes: the area
  under the learning curve per episode, a measure of sample efficiency; mean ± SE), seeds, env steps, env steps/s
  (``summary.json``).

Per algorithm, where a task was run with several buffer sizes: the paper's buffer-size figure (last-10% return
against buffer size, one panel per task, a line per activation). Across tasks, per algorithm, buffer size and
activation: the IQM and mean of min-max normalised scores (each task's scores mapped to [0, 1] by the lowest and
highest run of that task and algorithm over all its buffer sizes, so that rows of two buffer sizes compare), with 95%
stratified-bootstrap CIs (rliable); a task with fewer seeds than the others cuts every task to its seeds. Then
Elephant against each other activation: per task, the difference of the means and whether the SE intervals overlap,
for the last-10% and the all-episode returns (no verdict where a side has a single seed: it has no SE).
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.figure import Figure

from runlog import Run

from .cli import StudyInputError, open_study, publish_study
from .data import (NO_SE, config_key, config_labels, final_return, finished, format_mean_sem, learning_curve,
                   mean_sem, summary_mean)
from .html import Table
from .plots import activation_color, buffer_axes, buffer_line, mean_curves, save

__all__ = ["Group", "groups", "TASKS", "task_of", "buffer_figure", "normalised_aggregates", "elephant_against", "main"]

ALGOS = ("ppo", "sac")
#: the paper's MuJoCo tasks (any version)
TASKS = ("HalfCheetah", "Hopper", "Walker2d", "Ant", "Reacher", "Swimmer")


def task_of(env: str) -> str | None:
    """The task of a Gymnasium id (``Hopper-v4`` -> ``Hopper``), None for other envs."""
    name = env.split("-v")[0]
    return name if name in TASKS else None


@dataclass
class Group:
    """Runs of one configuration (all seeds)."""

    algo: str
    env: str
    act: str
    buffer_size: int | None
    config: dict
    runs: list[Run]

    def scores(self, fraction: float = 0.1) -> list[float]:
        """Each run's mean return over the last ``fraction`` of its training episodes (1: all of them), by seed."""
        return [final_return(r, fraction) for r in sorted(self.runs, key=lambda r: r.seed)
                if "episode_return" in r.scalars]


def groups(runs: Sequence[Run]) -> tuple[list[Group], list[str]]:
    """Finished PPO/SAC runs on the MuJoCo tasks, grouped by config except the seed; a warning per such run left
    out. Raises StudyInputError if two groups share algorithm, task, activation and buffer size."""
    found: dict[str, Group] = {}
    warnings = []
    for run in sorted(runs, key=lambda r: r.path):
        c = run.config
        if c.get("algo") not in ALGOS or task_of(str(c.get("env", ""))) is None:
            continue
        if not finished(run):
            warnings.append(f"{run.path}: unfinished run; left out")
            continue
        if "episode_return" not in run.scalars:
            warnings.append(f"{run.path}: no finished episode; left out")
            continue
        buffer = int(c["buffer_size"]) if c["algo"] == "sac" else None
        found.setdefault(config_key(c), Group(c["algo"], c["env"], c["act"], buffer, c, [])).runs.append(run)
    cells: dict[tuple, list[Group]] = defaultdict(list)
    for g in found.values():
        cells[(g.algo, g.env, g.act, g.buffer_size)].append(g)
    for (algo, env, act, buffer), clash in sorted(cells.items(), key=lambda kv: str(kv[0])):
        if len(clash) > 1:
            labels = config_labels([g.config for g in clash])
            raise StudyInputError(
                f"{algo.upper()} {act} on {env}" + (f" with a buffer of {buffer:,}" if buffer is not None else "")
                + f" in {len(clash)} configs ({'; '.join(labels)}): report them separately")
    return list(found.values()), warnings


def _buffer_text(buffer: int | None) -> str:
    return "" if buffer is None else f"{buffer:,}"


def buffer_figure(found: Sequence[Group], algo: str) -> Figure | None:
    """The paper's buffer-size figure for ``algo``: one panel per task run with several buffer sizes, last-10%
    return (mean ± SE over seeds) against buffer size (log scale), a line per activation; None if no task has
    several."""
    by_env: dict[str, list[Group]] = defaultdict(list)
    for g in found:
        if g.algo == algo and g.buffer_size is not None:
            by_env[g.env].append(g)
    envs = sorted(e for e, gs in by_env.items() if len({g.buffer_size for g in gs}) > 1)
    if not envs:
        return None
    fig = Figure(figsize=(4.5 * len(envs), 3.6), layout="constrained")
    for ax, env in zip(fig.subplots(1, len(envs), squeeze=False)[0], envs):
        for act in sorted({g.act for g in by_env[env]}):
            line = [g for g in by_env[env] if g.act == act]
            buffer_line(ax, [(g.buffer_size, *mean_sem(g.scores())) for g in line], activation_color(act),
                        f"{act} (n={min(len(g.runs) for g in line)})")
        buffer_axes(ax, "return (last 10% of training episodes)", f"{algo.upper()} on {env}: mean ± SE over seeds")
    return fig


def normalised_aggregates(found: Sequence[Group], reps: int = 2000) -> list[list[str]]:
    """Rows ``[agent, buffer, activation, tasks, seeds per task, IQM [CI], mean [CI]]``: min-max normalised
    last-10% returns over tasks x seeds (module docstring), per algorithm and buffer size."""
    from .classic.scores import aggregates

    by: dict[tuple[str, int | None], dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(dict))
    for g in found:
        by[(g.algo, g.buffer_size)][g.env][g.act] = g.scores()
    cells = []
    for (algo, buffer), envs in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        acts = sorted(set.intersection(*(set(a) for a in envs.values())))
        n = min(len(envs[e][a]) for e in envs for a in acts) if acts else 0
        if len(acts) >= 2 and n >= 1:
            cells.append((algo, buffer, envs, acts, n))
    ranges: dict[tuple[str, str], tuple[float, float]] = {}  # (algo, task) -> lowest and highest run, all buffers
    for algo, _, envs, acts, n in cells:
        for env, by_act in envs.items():
            pool = np.concatenate([by_act[a][:n] for a in acts])
            lo, hi = ranges.get((algo, env), (np.inf, -np.inf))
            ranges[(algo, env)] = (min(lo, float(pool.min())), max(hi, float(pool.max())))
    rows = []
    for algo, buffer, envs, acts, n in cells:
        matrices = {}
        for act in acts:
            cols = []
            for env, by_act in sorted(envs.items()):
                lo, hi = ranges[(algo, env)]
                cols.append((np.asarray(by_act[act][:n]) - lo) / (hi - lo) if hi > lo else np.full(n, 0.5))
            matrices[act] = np.stack(cols, axis=1)  # (seeds, tasks)
        for agg in aggregates({0: matrices}, reps=reps):
            rows.append([algo.upper(), _buffer_text(buffer), agg.act, str(len(envs)), str(n),
                         f"{agg.iqm:.3f} [{agg.iqm_ci[0]:.3f}, {agg.iqm_ci[1]:.3f}]",
                         f"{agg.mean:.3f} [{agg.mean_ci[0]:.3f}, {agg.mean_ci[1]:.3f}]"])
    return rows


def _versus(mine: tuple[float, float], theirs: tuple[float, float]) -> list[str]:
    """``[Elephant - it, SE intervals]`` for two (mean, SE) pairs: "Elephant higher" or "Elephant lower" where the
    mean ± SE intervals are apart, "overlap" where not, :data:`NO_SE` where either SE is NaN (one seed)."""
    (me, se), (m, s) = mine, theirs
    if not (np.isfinite(se) and np.isfinite(s)):
        return [f"{me - m:+.1f}", NO_SE]
    apart = abs(me - m) > se + s
    return [f"{me - m:+.1f}", ("Elephant higher" if me > m else "Elephant lower") if apart else "overlap"]


def elephant_against(found: Sequence[Group]) -> list[list[str]]:
    """Rows ``[agent, task, buffer, against, Elephant - it, SE intervals, Elephant - it (all episodes), SE intervals
    (all episodes)]``: per task and buffer size, Elephant's mean last-10% return, then its mean all-episode return,
    minus each other activation's, and whether their mean ± SE intervals overlap (:func:`_versus`)."""
    cells: dict[tuple[str, str, int | None], dict[str, Group]] = defaultdict(dict)
    for g in found:
        cells[(g.algo, g.env, g.buffer_size)][g.act] = g
    rows = []
    for (algo, env, buffer), by_act in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)):
        if "elephant" not in by_act:
            continue
        me = by_act["elephant"]
        for act, g in sorted(by_act.items()):
            if act != "elephant":
                rows.append([algo.upper(), env, _buffer_text(buffer), act,
                             *_versus(mean_sem(me.scores()), mean_sem(g.scores())),
                             *_versus(mean_sem(me.scores(1.0)), mean_sem(g.scores(1.0)))])
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with `argv` (default ``sys.argv[1:]``); returns the exit code (2 on bad input)."""
    opened = open_study("python -m reports.mujoco", __doc__, argv, groups, "finished PPO or SAC runs on MuJoCo")
    if opened is None:
        return 2
    _, found, out = opened
    by: dict[tuple[str, str, int | None], list[Group]] = defaultdict(list)
    for g in found:
        by[(g.algo, g.env, g.buffer_size)].append(g)
    rows, sections = [], defaultdict(list)
    for (algo, env, buffer), gs in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)):
        gs = sorted(gs, key=lambda g: g.act)
        for g in gs:
            rows.append([algo.upper(), env, _buffer_text(buffer), g.act,
                         *(format_mean_sem(*mean_sem(g.scores(f)), digits=1) for f in (0.1, 1.0)), str(len(g.runs)),
                         f"{int(g.config['n_timesteps']):,}", f"{summary_mean(g.runs, 'steps_per_second'):.0f}"])
        curves = {g.act: c for g in gs if (c := learning_curve(g.runs, window=20)) is not None}
        if curves:
            slug = f"{algo}_{env}" + (f"_buffer{buffer}" if buffer is not None else "")
            title = f"{algo.upper()} on {env}" + (f", buffer {buffer:,}" if buffer is not None else "")
            save(mean_curves({"training return (trailing mean of 20 episodes)": curves},
                             title=f"{title}: mean ± SE over seeds",
                             colors={g.act: activation_color(g.act) for g in gs}, xlabel="env step"),
                 out / f"{slug}_returns.png")
            sections["Training returns"].append((title, f"{slug}_returns.png"))
    for algo in ALGOS:
        if (fig := buffer_figure(found, algo)) is not None:
            save(fig, out / f"{algo}_buffers.png")
            sections["Buffer size (the paper's figure)"].append((f"{algo.upper()}: return against buffer size",
                                                                 f"{algo}_buffers.png"))
    tables = [Table("Training returns: last 10% and all episodes (mean ± SE over seeds)",
                    ["agent", "task", "buffer", "activation", "last-10% return", "all-episode return", "seeds",
                     "steps per run", "env steps/s"], rows)]
    if aggregated := normalised_aggregates(found):
        tables.append(Table("Across tasks: min-max normalised last-10% returns (IQM and mean, 95% CIs)",
                            ["agent", "buffer", "activation", "tasks", "seeds per task", "IQM", "mean"], aggregated))
    if against := elephant_against(found):
        tables.append(Table("Elephant against each activation (difference of means; mean ± SE intervals)",
                            ["agent", "task", "buffer", "against", "Elephant - it", "SE intervals",
                             "Elephant - it (all episodes)", "SE intervals (all episodes)"], against))
    notes = ["Score: the mean return of a run's last 10% of training episodes (raw rewards, before any reward "
             "normalisation), the authors' protocol; then mean ± SE over seeds. All-episode return: the mean over all "
             "its training episodes (the area under its learning curve per episode: sample efficiency).",
             "Normalised: each task's scores mapped to [0, 1] by the lowest and highest run of that task and "
             "algorithm among the activations compared, over all its buffer sizes (rows of two buffer sizes "
             "compare); IQM and mean by rliable with stratified-bootstrap CIs."]
    return publish_study(out, "MuJoCo: PPO and SAC", tables, dict(sections), notes, rows)


if __name__ == "__main__":
    sys.exit(main())
