"""The MinAtar study: DQN and Rainbow with Elephant vs ReLU per game, against a random policy run on the
same games, and the paper's sensitivity figure on Elephant's a and d.

    python -m reports.minatar RUNS_DIR [MORE ...] -o OUT/

Runs are grouped by algorithm, game, activation and the rest of their config (the seed aside). Final return = mean
episode return over the last 10% of a run's episodes (training episodes, epsilon-greedy; as the classic study);
a group shows mean ± standard error over seeds (std with ddof=1 / sqrt(n)). The random baseline comes from run logs
too: runs that never update (``learning_starts >= n_timesteps``: SB3 acts uniformly at random until then) on the
same env id and env settings (MinAtar's sticky actions and difficulty ramping): mean ± SE over all their episodes.
A group is "above random" when its mean exceeds the random mean by more than 3 combined standard errors
(``3 sqrt(SE_agent^2 + SE_random^2)``; no verdict for a single seed). Env steps per second come from each run's
``summary.json`` (wall time of the whole run, random steps and updates included) and so does the parameter count
(the networks trained).

The sensitivity figure takes the Elephant DQN runs that differ in ``act_kwargs.a`` / ``act_kwargs.d`` only, and the
ReLU DQN runs of the same env and budget as the reference line (mean ± SE band).
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from runlog import Run

from .cli import open_study, publish_study, warn
from .data import NO_SE, config_key, final_return, finished, format_mean_sem, learning_curve, summary_mean
from .html import Table
from .plots import activation_color, mean_curves, save

__all__ = ["Group", "groups", "random_baseline", "sensitivity_figure", "main"]

ALGOS = ("dqn", "rainbow")


@dataclass
class Group:
    """Runs of one configuration (all seeds): their final returns and speeds."""

    algo: str
    env: str
    act: str
    key: str
    config: dict
    runs: list[Run]

    @property
    def finals(self) -> np.ndarray:
        return np.array([final_return(r) for r in self.runs])

    @property
    def mean(self) -> float:
        return float(self.finals.mean())

    @property
    def sem(self) -> float:
        f = self.finals
        return float(f.std(ddof=1) / math.sqrt(len(f))) if len(f) > 1 else math.nan

    @property
    def steps_per_second(self) -> float:
        return summary_mean(self.runs, "steps_per_second")

    @property
    def parameters(self) -> float:
        return summary_mean(self.runs, "parameters")

    @property
    def act_kwargs(self) -> dict:
        return dict(self.config.get("act_kwargs") or {})


def groups(runs: Sequence[Run]) -> tuple[list[Group], list[str]]:
    """Finished DQN/Rainbow runs on MinAtar ids with episodes (random-policy runs aside), grouped by config except
    the seed; a warning line per MinAtar run left out."""
    found: dict[str, Group] = {}
    warnings = []
    for run in sorted(runs, key=lambda r: r.path):
        c = run.config
        if c.get("algo") not in ALGOS or not str(c.get("env", "")).startswith("MinAtar/"):
            continue
        if not finished(run):
            warnings.append(f"{run.path}: unfinished run; left out")
            continue
        if len(run.scalars.get("episode_return", ((), ()))[1]) == 0:
            warnings.append(f"{run.path}: no episodes recorded; left out")
            continue
        if is_random(run):
            continue  # the baseline (random_runs)
        key = config_key(c)
        group = found.setdefault(key, Group(c["algo"], c["env"], c["act"], key, c, []))
        if any(r.seed == run.seed for r in group.runs):
            warnings.append(f"{run.path}: same config and seed {run.seed} as another run; counted once")
            continue
        group.runs.append(run)
    return list(found.values()), warnings


def is_random(run: Run) -> bool:
    """Whether ``run`` acted uniformly at random throughout (it never reached ``learning_starts``)."""
    c = run.config
    return c.get("learning_starts", 0) >= c.get("n_timesteps", math.inf)


def random_baseline(runs: Sequence[Run]) -> tuple[float, float, int]:
    """Mean, standard error and count of the episode returns of random-policy runs ``runs`` (all episodes)."""
    r = np.concatenate([run.scalars["episode_return"][1] for run in runs])
    return float(r.mean()), float(r.std(ddof=1) / math.sqrt(len(r))) if len(r) > 1 else math.nan, len(r)


def above_random(mean: float, sem: float, r_mean: float, r_sem: float) -> str:
    """"yes" where ``mean > r_mean + 3 sqrt(sem^2 + r_sem^2)``, else "no"; "(no baseline)" where the random mean is
    NaN, "(one seed: no SE)" where ``sem`` is (a single seed: no claim either way) and "(one episode: no SE)" where
    ``r_sem`` is."""
    if not math.isfinite(r_mean):
        return "(no baseline)"
    if not math.isfinite(sem):
        return f"({NO_SE})"
    if not math.isfinite(r_sem):
        return "(one episode: no SE)"
    return "yes" if mean - r_mean > 3 * math.sqrt(sem ** 2 + r_sem ** 2) else "no"


def _main_groups(all_groups: Sequence[Group]) -> dict[tuple[str, str], list[Group]]:
    """Per (algo, env): the groups at the activation's default arguments (the sensitivity points aside)."""
    by: dict[tuple[str, str], list[Group]] = defaultdict(list)
    for g in all_groups:
        by[(g.algo, g.env)].append(g)
    out = {}
    for k, gs in by.items():
        # the most seeds first: the main comparison has 3 seeds, sensitivity points 2
        best: dict[str, Group] = {}
        for g in sorted(gs, key=lambda g: -len(g.runs)):
            if g.act not in best and not _is_sensitivity_point(g, gs):
                best[g.act] = g
        out[k] = sorted(best.values(), key=lambda g: g.act)
    return out


def _is_sensitivity_point(g: Group, same: Sequence[Group]) -> bool:
    """An Elephant group whose a or d differ from the most-seeded Elephant group of its algo and env."""
    if g.act != "elephant":
        return False
    ref = max((x for x in same if x.act == "elephant"), key=lambda x: len(x.runs))
    return g is not ref and (g.act_kwargs.get("a"), g.act_kwargs.get("d")) != (ref.act_kwargs.get("a"),
                                                                               ref.act_kwargs.get("d"))


def sensitivity_figure(all_groups: Sequence[Group], env: str) -> Figure | None:
    """Final return against Elephant's ``a`` (log scale), one line per ``d``, DQN on ``env``; ReLU as a line with
    its ± SE band. ``None`` if fewer than two values of ``a`` were run."""
    ele = [g for g in all_groups if g.algo == "dqn" and g.env == env and g.act == "elephant"]
    a_values = sorted({g.act_kwargs.get("a") for g in ele})
    if len(a_values) < 2:
        return None
    fig = Figure(figsize=(5.5, 3.8), layout="constrained")
    ax = fig.subplots()
    ds = sorted({g.act_kwargs.get("d") for g in ele})
    shades = matplotlib.colormaps["Reds"](np.linspace(0.45, 0.95, len(ds)))  # Elephant's reds, darker for larger d
    for shade, d in zip(shades, ds):
        pts = sorted((g.act_kwargs["a"], g.mean, g.sem, len(g.runs)) for g in ele if g.act_kwargs.get("d") == d)
        a, m, s, n = (np.array(v, dtype=float) for v in zip(*pts))
        ax.errorbar(a, m, yerr=np.nan_to_num(s), marker="o", capsize=3, color=shade,
                    label=f"Elephant d={d} (n={int(n.min())})")
    relu = [g for g in all_groups if g.algo == "dqn" and g.env == env and g.act == "relu"]
    if relu:
        g = max(relu, key=lambda g: len(g.runs))
        ax.axhline(g.mean, color=activation_color("relu"), ls="--", label=f"ReLU (n={len(g.runs)})")
        ax.axhspan(g.mean - np.nan_to_num(g.sem), g.mean + np.nan_to_num(g.sem), color=activation_color("relu"),
                   alpha=0.15, lw=0)
    ax.set_xscale("log")
    ax.set_xticks(a_values, [f"{a:g}" for a in a_values])
    ax.set_xlabel("Elephant a")
    ax.set_ylabel("final return (last 10% of episodes)")
    ax.set_title(f"DQN on {env}: sensitivity to a and d (mean ± SE over seeds)", fontsize=9)
    ax.legend(fontsize=7)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with `argv` (default ``sys.argv[1:]``); returns the exit code (2 on bad input)."""
    opened = open_study("python -m reports.minatar", __doc__, argv, groups, "finished DQN or Rainbow runs on MinAtar")
    if opened is None:
        return 2
    runs, found, out = opened
    main_groups = _main_groups(found)
    envs = sorted({env for _, env in main_groups})
    random: dict[str, tuple[float, float, int]] = {}
    for env in envs:
        c = next(g.config for (_, e), gs in main_groups.items() if e == env for g in gs)
        same = [r for r in runs if is_random(r) and finished(r) and r.config.get("env") == env
                and (r.config.get("env_kwargs"), r.config.get("max_episode_steps")) == (c.get("env_kwargs"),
                                                                                        c.get("max_episode_steps"))]
        if same:
            random[env] = random_baseline(same)
        else:
            warn(f"no random-policy run on {env} (learning_starts >= n_timesteps): no baseline for it")
    rows, parts = [], []
    for (algo, env), gs in sorted(main_groups.items()):
        r_mean, r_sem, _ = random.get(env, (math.nan, math.nan, 0))
        for g in gs:
            rows.append([algo, env, g.act, format_mean_sem(g.mean, g.sem), str(len(g.runs)), format_mean_sem(r_mean, r_sem),
                         above_random(g.mean, g.sem, r_mean, r_sem), f"{g.steps_per_second:.0f}",
                         f"{g.parameters:,.0f}" if math.isfinite(g.parameters) else "", f"{int(g.config['n_timesteps']):,}"])
        curves = {g.act: learning_curve(g.runs, window=20) for g in gs}
        colors = {g.act: activation_color(g.act) for g in gs}
        name = f"{algo}_{env.replace('/', '-')}.png"
        save(mean_curves({"episode return (last 20 episodes)": {k: v for k, v in curves.items() if v is not None}},
                         title=f"{algo.upper() if algo == 'dqn' else 'Rainbow'} on {env}: mean ± SE over seeds",
                         colors=colors, xlabel="env step"), out / name)
        parts.append((f"{'DQN' if algo == 'dqn' else 'Rainbow'} on {env}", name))
    columns = ["agent", "env", "activation", "final return", "seeds", "random policy", "above random + 3 SE",
               "env steps/s", "parameters", "steps per run"]
    tables = [Table("Final return (last 10% of training episodes; mean ± SE over seeds)", columns, rows)]
    sections = {"Learning curves": [(f"{title}: episode return (trailing mean of 20 episodes)", src)
                                    for title, src in parts]}
    baseline = "; ".join(f"{env}: {n} episodes" for env, (_, _, n) in random.items()) or "none"
    notes = [f"Random policy: runs that never update (learning_starts >= n_timesteps), mean ± SE over all their "
             f"episodes ({baseline}). 'Above random + 3 SE': agent mean > random mean + 3 sqrt(SE_agent^2 + "
             "SE_random^2). Env steps/s: whole runs on one core (random steps, updates and checkpoints included)."]
    for env in envs:
        fig = sensitivity_figure(found, env)
        if fig is not None:
            name = f"sensitivity_{env.replace('/', '-')}.png"
            save(fig, out / name)
            sections.setdefault("Sensitivity to Elephant's a and d (DQN)", []).append(
                (f"{env}: final return against a, one line per d; ReLU dashed with its ± SE band", name))
            sens_rows = sorted(((g.act_kwargs.get("a"), g.act_kwargs.get("d"), g) for g in found
                                if g.algo == "dqn" and g.env == env and g.act == "elephant"),
                               key=lambda t: (t[1], t[0]))
            tables.append(Table(f"Sensitivity on {env} (DQN, Elephant; mean ± SE over seeds)",
                                ["d", "a", "final return", "seeds"],
                                [[str(d), f"{a:g}", format_mean_sem(g.mean, g.sem), str(len(g.runs))] for a, d, g in sens_rows]))
    return publish_study(out, "MinAtar: DQN and Rainbow, Elephant vs ReLU", tables, sections, notes, rows)


if __name__ == "__main__":
    sys.exit(main())
