"""The Atari study: evaluation and training returns per game, and the paper's gradient-covariance figure.

    python -m reports.atari RUNS_DIR [MORE ...] -o OUT/

Runs (DQN or Rainbow on ALE ids, finished) are grouped by algorithm, game, activation and the rest of their config
(the seed aside). Per (algorithm, game):

* evaluation returns (``eval_return``: greedy episodes on whole games, real scores, the authors' protocol), mean over
  each evaluation's episodes, then mean ± SE over seeds at each evaluation step; training returns (``episode_return``:
  whole games under epsilon-greedy, unclipped) as a trailing mean of 20 games;
* the gradient covariance figure as the paper's (Amidar in the paper): the activations side by side in columns, one
  row per recorded point (0.2M, 6.2M, 12.2M steps at full length), one seed (the lowest) per activation;
* a table: last evaluation (mean ± SE over seeds), seeds, env steps, env steps/s (``summary.json``).

Per algorithm and activation, over games and seeds: the human-normalised score of each run's last evaluation,
``(R - random) / (human - random)`` (:data:`SCORES`, ``reports/reference/atari_scores.json``), aggregated as the
paper's summary figure aggregates it: IQM and mean with 95% stratified-bootstrap CIs (rliable). Games without
reference scores are left out of it, and a game with fewer seeds than the others cuts every game to its seeds.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from runlog import Run

from .cli import open_study, publish_study
from .data import (Curve, config_key, finished, format_mean_sem, gradcov_losses, learning_curve, mean_sem,
                   select_records, summary_mean)
from .html import Table
from .plots import activation_color, gradcov_heatmaps, mean_curves, save

__all__ = ["Group", "groups", "eval_curve", "main"]

ALGOS = ("dqn", "rainbow")
#: random and human scores per game (``reports/reference/atari_scores.json``): ``{game: {"random": r, "human": h}}``
SCORES = json.loads((Path(__file__).parent / "reference" / "atari_scores.json").read_text())["games"]


def _is_atari(env: str) -> bool:
    return env.startswith("ALE/") or "NoFrameskip" in env


@dataclass
class Group:
    """Runs of one configuration (all seeds)."""

    algo: str
    env: str
    act: str
    config: dict
    runs: list[Run]


def groups(runs: Sequence[Run]) -> tuple[list[Group], list[str]]:
    """Finished DQN/Rainbow runs on ALE ids, grouped by config except the seed; a warning per Atari run left out."""
    found: dict[str, Group] = {}
    warnings = []
    for run in sorted(runs, key=lambda r: r.path):
        c = run.config
        if c.get("algo") not in ALGOS or not _is_atari(str(c.get("env", ""))):
            continue
        if not finished(run):
            warnings.append(f"{run.path}: unfinished run; left out")
            continue
        group = found.setdefault(config_key(c), Group(c["algo"], c["env"], c["act"], c, []))
        group.runs.append(run)
    return list(found.values()), warnings


def eval_curve(runs: Sequence[Run]) -> Curve | None:
    """Mean evaluation return per evaluation step of each run ``(R, T)`` at the steps every run evaluated."""
    per_run = []
    for run in runs:
        steps, values = run.scalars.get("eval_return", (np.array([]), np.array([])))
        if len(steps):
            at = np.unique(steps)
            per_run.append({int(s): float(values[steps == s].mean()) for s in at})
    if not per_run:
        return None
    common = sorted(set.intersection(*(set(r) for r in per_run)))
    if not common:
        return None
    return Curve(steps=np.array(common, dtype=float), values=np.array([[r[s] for s in common] for r in per_run]))


def _last_eval(run: Run) -> float | None:
    """The mean return of a run's last evaluation, or None if it has none."""
    steps, values = run.scalars.get("eval_return", (np.array([]), np.array([])))
    return float(values[steps == steps.max()].mean()) if len(steps) else None


def human_normalised(found: Sequence[Group]) -> tuple[list[list[str]], list[str]]:
    """Rows ``[agent, activation, games, seeds, IQM [CI], mean [CI]]`` of human-normalised last evaluations per
    algorithm and activation (rliable's IQM and mean over games x seeds, 95% stratified-bootstrap CIs), and notes on
    what was left out."""
    from .classic.scores import aggregates

    by: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(dict)
    notes = []
    for g in found:
        game = g.env.removeprefix("ALE/").split("-v")[0].removesuffix("NoFrameskip")
        if game not in SCORES:
            notes.append(f"{g.env}: no human and random scores, left out of the human-normalised aggregate")
            continue
        ref = SCORES[game]
        finals = [(v - ref["random"]) / (ref["human"] - ref["random"]) for r in sorted(g.runs, key=lambda r: r.seed)
                  if (v := _last_eval(r)) is not None]
        if finals:
            by[(g.algo, g.act)][game] = finals
    rows = []
    for (algo, act), games in sorted(by.items()):
        n = min(len(v) for v in games.values())
        matrix = np.array([v[:n] for v in games.values()]).T  # (seeds, games)
        agg = aggregates({0: {act: matrix}})[0]
        rows.append(["DQN" if algo == "dqn" else "Rainbow", act, str(len(games)), str(n),
                     f"{agg.iqm:.3f} [{agg.iqm_ci[0]:.3f}, {agg.iqm_ci[1]:.3f}]",
                     f"{agg.mean:.3f} [{agg.mean_ci[0]:.3f}, {agg.mean_ci[1]:.3f}]"])
    return rows, list(dict.fromkeys(notes))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with `argv` (default ``sys.argv[1:]``); returns the exit code (2 on bad input)."""
    opened = open_study("python -m reports.atari", __doc__, argv, groups, "finished DQN or Rainbow runs on Atari")
    if opened is None:
        return 2
    _, found, out = opened
    by: dict[tuple[str, str], list[Group]] = defaultdict(list)
    for g in found:
        by[(g.algo, g.env)].append(g)
    rows, sections = [], defaultdict(list)
    for (algo, env), gs in sorted(by.items()):
        gs = sorted(gs, key=lambda g: g.act)
        agent = "DQN" if algo == "dqn" else "Rainbow"
        slug = f"{algo}_{env.replace('/', '-')}"
        for g in gs:
            last = []
            for run in g.runs:
                steps, values = run.scalars.get("eval_return", (np.array([]), np.array([])))
                if len(steps):
                    last.append(float(values[steps == steps.max()].mean()))
            rows.append([agent, env, g.act, format_mean_sem(*mean_sem(last), digits=1) if last else "", str(len(g.runs)), f"{int(g.config['n_timesteps']):,}",
                         f"{summary_mean(g.runs, 'steps_per_second'):.0f}"])
        colors = {g.act: activation_color(g.act) for g in gs}
        panels = {}
        evals = {g.act: c for g in gs if (c := eval_curve(g.runs)) is not None}
        if evals:
            panels["evaluation return (greedy, whole games)"] = evals
        train = {g.act: c for g in gs if (c := learning_curve(g.runs, window=20)) is not None}
        if train:
            panels["training return (trailing mean of 20 games)"] = train
        if panels:
            save(mean_curves(panels, title=f"{agent} on {env}: mean ± SE over seeds", colors=colors,
                             xlabel="env step"), out / f"{slug}_returns.png")
            sections["Returns"].append((f"{agent} on {env}", f"{slug}_returns.png"))
        heat = {}
        for g in gs:
            run = min(g.runs, key=lambda r: r.seed)
            losses = gradcov_losses(run)
            if losses:
                steps = [int(s) for s in run.probes["gradcov"]["step"]]
                heat[g.act] = (losses[0], select_records(run, "gradcov", losses[0], steps))
        if heat:
            loss = next(iter(heat.values()))[0]
            fig = gradcov_heatmaps({act: recs for act, (_, recs) in heat.items()}, loss, side_by_side=True)
            save(fig, out / f"{slug}_gradcov.png")
            sections["Gradient covariance (the paper's figure: a column per activation, a row per training point)"]\
                .append((f"{agent} on {env}: C_ij of 32 replay samples ({loss} loss)", f"{slug}_gradcov.png"))
    table = Table("Last evaluation (mean over its episodes, then mean ± SE over seeds)",
                  ["agent", "game", "activation", "last evaluation", "seeds", "steps per run", "env steps/s"], rows)
    normalised, left_out = human_normalised(found)
    tables = [table]
    if normalised:
        tables.append(Table("Human-normalised last evaluation over games and seeds (IQM and mean, 95% CIs)",
                            ["agent", "activation", "games", "seeds per game", "IQM", "mean"], normalised))
    notes = ["Evaluation: greedy episodes (epsilon 0; Rainbow's noisy layers at their mean weights) on an env without "
             "episodic life or reward clipping, every eval_every steps (the authors': 5 episodes every 100k steps). "
             "Training returns: whole games from the Monitor under the Atari wrappers (unclipped).",
             "Human-normalised: (R - random) / (human - random) with the Atari-57 random and human scores of DQN Zoo "
             "and rliable (reports/reference/atari_scores.json); IQM and mean by rliable.", *left_out]
    return publish_study(out, "Atari: DQN and Rainbow", tables, dict(sections), notes, rows)


if __name__ == "__main__":
    sys.exit(main())
