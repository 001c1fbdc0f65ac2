"""The classic-control study (the paper's Figure "DQN ... under various buffer sizes"): final return against
replay-buffer size, per environment and activation, at each setting's best learning rate; aggregate statistics across
tasks (rliable); and a comparison with the authors' published per-task results.

    python -m reports.classic RUNS_DIR [MORE ...] -o OUT/ [--reps 2000] [--seed 0]

Runs are grouped by their whole config except the seed; groups that differ only in the learning rate are one
setting. Final return = mean episode return over the last 10% of a run's episodes (as in the paper); per setting
the learning rate with the highest mean final return over seeds is selected, and the page shows that mean ±
standard error over seeds (std with ddof=1 / sqrt(n)), with the learning rates it was chosen from (the page says
where those sets differ between points: a wider search favours its points). Runs that did not finish
(interrupted, diverged, still being written; for other tools' logs without a ``run_end`` series, last record short
of ``n_timesteps``), runs with a non-finite final return, and repeats of a config and seed are left out with a
warning on stderr, counted on the page; a learning rate some of whose runs were left out is still tried but only
selectable if it has as many usable seeds as the point's best-covered one (the page names those that were not).

Aggregates across tasks (Agarwal et al. 2021, computed by rliable): per activation and buffer size, each seed's final
return at the selected learning rate is normalised per task as ``(R - R_random) / (R_ref - R_random)``, with
``R_random`` the mean return of a uniform-random policy and ``R_ref`` the best mean final return among the authors'
activations at their default buffer (constants and sources in ``reports/reference/classic_dqn.json``); 0 is random,
about 1 the authors' best (R_ref is their late return, episodes ending in the last 10% of steps, where R is ours over
the last 10% of episodes; the two differ little on a converged curve). The learning rate is selected on the same
seeds it is scored on, so the aggregates lean optimistic by the selection (the paper's procedure too). IQM and
mean over tasks x seeds come with stratified-bootstrap 95% CIs (``--reps`` resamples, numpy seeded with ``--seed``),
and performance profiles (fraction of runs scoring above tau) per buffer.

Besides the page (``index.html``) and its figures, ``OUT`` gets the numbers as CSV: ``points.csv`` (each point, its
seeds' final returns and the learning rates searched), ``runs.csv`` (every usable run at every learning rate) and
``aggregates.csv`` (IQM and mean with their CIs).

The comparison with the authors uses their per-episode training returns (``results/DQN_*.csv`` of qlan3/Elephant,
at their default buffer 1e4) and ours at the same buffer; there "final" is, on both sides, the mean return of the
episodes that ended in the last 10% of the run's steps (the authors' files are read only at their ends).
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from runlog import Run, RunLogError

from .cli import OutputDirError, load_runs, publish_study, study_inputs, study_parser, warn
from .data import config_key, config_labels, final_return, finished, format_mean_sem, mean_sem, run_end, training_length
from .html import Table
from .labels import mean_se_over
from .plots import activation_color, group_colors, save

__all__ = ["ClassicRow", "classic_table", "buffer_figure", "REFERENCE", "reference_data", "normalise",
           "score_matrices", "Aggregate", "aggregates", "Profiles", "performance_profiles", "aggregate_figure",
           "profile_figure", "late_return", "Comparison", "authors_comparison", "main"]

_KEYS = ("env", "act", "buffer_size", "learning_rate")  # config keys the study needs

#: the study's reference numbers: normalisation constants and the authors' per-seed final returns
REFERENCE = Path(__file__).with_name("reference") / "classic_dqn.json"


@dataclass(frozen=True)
class ClassicRow:
    """One point: final return at a setting's best learning rate, over seeds. `setting` names the config keys
    that set it apart from the other settings of its env and activation besides the buffer size (e.g.
    ``"n_timesteps=2000"``), empty if none. `finals` ``(n_seeds,)`` are the seeds' final returns in seed order
    (`seeds`), `runs` their run logs; `lrs` every learning rate the setting was run with (ascending), `lr_seeds` the
    usable seeds of each (runs left out not counted); the point is selected among those with the most."""

    env: str
    act: str
    buffer_size: int
    setting: str
    best_lr: float
    mean: float
    sem: float
    n_seeds: int
    seeds: tuple[int, ...] = ()
    finals: tuple[float, ...] = ()
    lrs: tuple[float, ...] = ()
    lr_seeds: tuple[int, ...] = ()
    runs: tuple[Run, ...] = field(default=(), repr=False, compare=False)

    @property
    def selectable_lrs(self) -> tuple[float, ...]:
        """The learning rates the point was selected among: those with the most usable seeds."""
        return tuple(lr for lr, k in zip(self.lrs, self.lr_seeds) if k == max(self.lr_seeds)) if self.lr_seeds \
            else self.lrs


def _usable_runs(runs: Sequence[Run]) -> tuple[list[Run], list[str]]:
    """The DQN runs with episodes that finished, one per (config, seed) (the first by path); and a warning line
    per DQN run left out (config lacking a study key, unfinished, no episodes, or a repeat of a config and
    seed, a non-finite final return)."""
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
        elif not math.isfinite(final_return(run)):
            warnings.append(f"{run.path}: non-finite final return; left out")
        elif key in kept:
            warnings.append(f"{run.path}: same config and seed {run.seed} as {kept[key].path}; counted once")
        else:
            kept[key] = run
    return list(kept.values()), warnings


def classic_table(runs: Sequence[Run]) -> tuple[list[ClassicRow], list[str]]:
    """Best-learning-rate final return per setting (config except seed and learning rate) from the DQN runs in
    `runs`, and a warning line per DQN run left out (see `_usable_runs`). The best learning rate is the one with
    the highest mean final return over seeds (the first of equal ones, in the order of the runs' paths), among the
    learning rates with as many usable seeds as the setting's best-covered one: a learning rate whose runs were left
    out in part (diverged, unfinished) is not judged on its survivors. Every learning rate the setting was run with
    counts as tried (``lrs``), usable runs or not."""
    usable, warnings = _usable_runs(runs)
    by_lr: dict[str, dict[float, list[Run]]] = defaultdict(lambda: defaultdict(list))
    configs: dict[str, dict] = {}
    for run in usable:
        key = config_key(run.config, ("seed", "learning_rate"))
        configs.setdefault(key, run.config)
        by_lr[key][float(run.config["learning_rate"])].append(run)
    tried: dict[str, set[float]] = defaultdict(set)
    for run in runs:
        if run.config.get("algo") == "dqn" and all(k in run.config for k in _KEYS):
            tried[config_key(run.config, ("seed", "learning_rate"))].add(float(run.config["learning_rate"]))
    by_env_act: dict[tuple[str, str], list[str]] = defaultdict(list)
    for key, c in configs.items():
        by_env_act[(c["env"], c["act"])].append(key)
    rows = []
    for keys in by_env_act.values():
        labels = config_labels([configs[k] for k in keys], skip=("seed", "learning_rate", "buffer_size"))
        for key, setting in zip(keys, labels):
            c = configs[key]
            finals = {lr: [final_return(r) for r in group] for lr, group in by_lr[key].items()}
            lrs = tuple(sorted(tried[key]))
            counts = tuple(len(finals.get(lr, ())) for lr in lrs)
            lr = max((lr for lr in finals if len(finals[lr]) == max(counts)), key=lambda lr: np.mean(finals[lr]))
            chosen = sorted(zip(by_lr[key][lr], finals[lr]), key=lambda pair: pair[0].seed)
            mean, sem = mean_sem(finals[lr])
            rows.append(ClassicRow(c["env"], c["act"], int(c["buffer_size"]), setting, lr, mean, sem, len(chosen),
                                   tuple(r.seed for r, _ in chosen), tuple(f for _, f in chosen), lrs, counts,
                                   tuple(r for r, _ in chosen)))
    return sorted(rows, key=lambda r: (r.env, r.act, r.setting, r.buffer_size)), warnings


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
            n_lrs = min(len(r.selectable_lrs) for r in here if _line_label(r) == label)
            ax.plot(x, m, marker="o", color=colors[label], label=f"{label} (n={int(n.min())}, {n_lrs} lrs)")
            ax.fill_between(x, m - np.nan_to_num(s), m + np.nan_to_num(s), color=colors[label], alpha=0.2)
        ax.set_xscale("log")
        ax.set_xlabel("replay buffer size (transitions)")
        ax.set_ylabel("final return (last 10% of episodes)")
        ax.set_title(f"{env}: {mean_se_over(r.n_seeds for r in here)}", fontsize=10)
        ax.legend(fontsize=7)
    return fig


# --- normalisation and aggregates across tasks -------------------------------------------------


@cache
def _read_reference(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: cannot read the study's reference numbers: {err}") from None


def reference_data(path: str | Path = REFERENCE) -> dict[str, Any]:
    """The reference file's contents (:data:`REFERENCE`; read once per path): ``normalisation.tasks`` ``{task:
    {"random": R_random, "reference": R_ref}}`` and ``authors.finals`` ``{task: {act: {seed: final return}}}``,
    each with its sources."""
    return _read_reference(Path(path))


def _constants(env: str, constants: Mapping[str, Mapping[str, float]] | None) -> tuple[float, float]:
    table = reference_data()["normalisation"]["tasks"] if constants is None else constants
    if env not in table:
        raise ValueError(f"no normalisation constants for task {env!r} (known: {', '.join(sorted(table))}); "
                         f"add its random and reference returns to {REFERENCE}")
    return float(table[env]["random"]), float(table[env]["reference"])


def normalise(env: str, returns: np.ndarray | Sequence[float] | float,
              constants: Mapping[str, Mapping[str, float]] | None = None) -> np.ndarray:
    """Returns of task `env` as normalised scores ``(R - R_random) / (R_ref - R_random)`` (same shape); constants
    ``{task: {"random": .., "reference": ..}}``, by default the reference file's. Raises ValueError naming the task
    if it has none."""
    random, ref = _constants(env, constants)
    return (np.asarray(returns, dtype=float) - random) / (ref - random)


def score_matrices(rows: Sequence[ClassicRow], constants: Mapping[str, Mapping[str, float]] | None = None
                   ) -> tuple[dict[int, dict[str, np.ndarray]], list[str], list[str]]:
    """Normalised final returns as rliable wants them: ``{buffer: {act: (n_seeds, n_tasks)}}``, the task order of
    the columns (every task in `rows`, sorted) and warning lines.

    An (activation, buffer) is left out, with a warning, when it misses a task or has more than one setting on one
    (ambiguous); where tasks have different numbers of seeds, each keeps its first ``min n`` seeds (in seed order),
    with a warning. Raises ValueError naming a task without normalisation constants."""
    tasks = sorted({r.env for r in rows})
    for env in tasks:
        _constants(env, constants)
    cells: dict[tuple[int, str], dict[str, list[ClassicRow]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        cells[(r.buffer_size, r.act)][r.env].append(r)
    out: dict[int, dict[str, np.ndarray]] = defaultdict(dict)
    warnings = []
    for (buffer, act), by_env in sorted(cells.items()):
        where = f"{act} at buffer {buffer}"
        if missing := [env for env in tasks if env not in by_env]:
            warnings.append(f"{where}: no runs on {', '.join(missing)}; left out of the aggregates")
            continue
        if several := [env for env in tasks if len(by_env[env]) > 1]:
            warnings.append(f"{where}: several settings on {', '.join(several)} "
                            f"({'; '.join(r.setting for r in by_env[several[0]])}); left out of the aggregates")
            continue
        seeds = {env: len(by_env[env][0].finals) for env in tasks}
        n = min(seeds.values())
        if cut := [f"{env} ({k})" for env, k in seeds.items() if k > n]:
            fewest = ", ".join(env for env, k in seeds.items() if k == n)
            warnings.append(f"{where}: only {n} seeds on {fewest}; the first {n} seeds of {', '.join(cut)} used")
        out[buffer][act] = np.stack([normalise(env, by_env[env][0].finals[:n], constants) for env in tasks], axis=1)
    return dict(out), tasks, warnings


@contextmanager
def _numpy_seed(seed: int) -> Iterator[None]:
    """numpy's global generator seeded with `seed`, restored afterwards: rliable 1.2's bootstrap draws from it
    (its ``random_state`` argument does not reach the draws)."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


@dataclass(frozen=True)
class Aggregate:
    """IQM and mean of one activation's normalised scores at one buffer size over tasks x seeds (`n_seeds` per
    task), each with its stratified-bootstrap CI ``(low, high)``."""

    act: str
    buffer_size: int
    iqm: float
    iqm_ci: tuple[float, float]
    mean: float
    mean_ci: tuple[float, float]
    n_seeds: int


#: bootstrap resamples of the aggregates and profiles by default (rliable's own default for profiles)
REPS = 2000


def aggregates(matrices: Mapping[int, Mapping[str, np.ndarray]], reps: int = REPS, seed: int = 0,
               confidence: float = 0.95) -> list[Aggregate]:
    """IQM and mean with `confidence` stratified-bootstrap CIs (``rliable.library.get_interval_estimates``, `reps`
    resamples, numpy seeded with `seed` for each buffer) of each score matrix of :func:`score_matrices`."""
    from rliable import library as rly
    from rliable import metrics

    def iqm_and_mean(scores: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_iqm(scores), metrics.aggregate_mean(scores)])

    out = []
    for buffer, by_act in sorted(matrices.items()):
        with _numpy_seed(seed):
            points, cis = rly.get_interval_estimates(dict(by_act), iqm_and_mean, reps=reps,
                                                     confidence_interval_size=confidence)
        for act, scores in by_act.items():
            (iqm, mean), ci = points[act], cis[act]
            out.append(Aggregate(act, buffer, float(iqm), (float(ci[0, 0]), float(ci[1, 0])), float(mean),
                                 (float(ci[0, 1]), float(ci[1, 1])), scores.shape[0]))
    return out


@dataclass(frozen=True)
class Profiles:
    """Performance profiles at one buffer size: `taus` ``(T,)`` thresholds on the normalised score; per
    activation the fraction of runs (tasks x seeds) scoring above each ``(T,)`` and its CI ``(2, T)``."""

    buffer_size: int
    taus: np.ndarray
    profiles: dict[str, np.ndarray]
    cis: dict[str, np.ndarray]


def performance_profiles(matrices: Mapping[int, Mapping[str, np.ndarray]], reps: int = REPS, seed: int = 0,
                         points: int = 101) -> list[Profiles]:
    """Score-distribution performance profiles (``rliable.library.create_performance_profile``, stratified-bootstrap
    95% CIs from `reps` resamples, numpy seeded with `seed`) of each buffer's score matrices, on `points`
    thresholds from ``min(0, lowest score)`` to ``max(1, highest score)``."""
    from rliable import library as rly

    out = []
    for buffer, by_act in sorted(matrices.items()):
        scores = np.concatenate([s.ravel() for s in by_act.values()])
        taus = np.linspace(min(0.0, float(scores.min())), max(1.0, float(scores.max())), points)
        with _numpy_seed(seed):
            profiles, cis = rly.create_performance_profile(dict(by_act), taus, reps=reps)
        out.append(Profiles(buffer, taus, dict(profiles), dict(cis)))
    return out


def aggregate_figure(aggs: Sequence[Aggregate]) -> Figure:
    """IQM of the normalised score against buffer size (log scale), one line per activation with its bootstrap CI
    as a band."""
    fig = Figure(figsize=(5.5, 3.8), layout="constrained")
    ax = fig.subplots()
    for act in dict.fromkeys(a.act for a in aggs):
        pts = sorted((a.buffer_size, a.iqm, *a.iqm_ci) for a in aggs if a.act == act)
        x, m, lo, hi = (np.array(v, dtype=float) for v in zip(*pts))
        n = min(a.n_seeds for a in aggs if a.act == act)
        ax.plot(x, m, marker="o", color=activation_color(act), label=f"{act} ({n} seeds per task)")
        ax.fill_between(x, lo, hi, color=activation_color(act), alpha=0.2)
    ax.set_xscale("log")
    ax.set_xlabel("replay buffer size (transitions)")
    ax.set_ylabel("IQM normalised final return")
    ax.set_title("IQM over tasks x seeds, 95% stratified-bootstrap CI", fontsize=10)
    ax.legend(fontsize=7)
    return fig


def profile_figure(profiles: Sequence[Profiles]) -> Figure:
    """One panel per buffer size: each activation's performance profile with its CI band
    (``rliable.plot_utils.plot_performance_profiles``)."""
    from rliable import plot_utils

    cols = min(3, len(profiles))
    rows = math.ceil(len(profiles) / cols)
    fig = Figure(figsize=(4.2 * cols, 3.4 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, p in zip(axes, profiles):
        plot_utils.plot_performance_profiles(p.profiles, p.taus, p.cis, ax=ax,
                                             colors={act: activation_color(act) for act in p.profiles},
                                             xlabel=r"normalised score $\tau$", ylabel=r"fraction of runs > $\tau$",
                                             labelsize="medium", ticklabelsize="small", legend=True,
                                             legendsize="x-small")
        ax.set_title(f"buffer {p.buffer_size}", fontsize=10)
    for ax in axes[len(profiles):]:
        ax.set_visible(False)
    return fig


# --- the authors' published results ------------------------------------------------------------


def late_return(run: Run, fraction: float = 0.1) -> float:
    """Mean return of the episodes that ended in the last `fraction` of the run's steps, counted as the authors'
    files count them (``step - 1 >= (1 - fraction) * n_timesteps``: their Step is the 0-based index of the episode's
    last env step, ours the number of env steps taken; the last recorded step where the config has no
    ``n_timesteps``); NaN if none did."""
    steps, values = run.scalars.get("episode_return", (np.empty(0), np.empty(0)))
    total = run.config.get("n_timesteps") or training_length(run)
    late = values[steps - 1 >= (1 - fraction) * total]
    return float(late.mean()) if len(late) else math.nan


@dataclass(frozen=True)
class Comparison:
    """One task and activation at the authors' buffer size: ``(mean, SE, n seeds)`` of the late return of ours (at
    the best learning rate; None if we have no runs there) and of the authors' (None if they published none),
    ``n_timesteps`` of each side, and the learning rates our point was selected from (the paper searched 8)."""

    env: str
    act: str
    setting: str
    ours: tuple[float, float, int] | None
    theirs: tuple[float, float, int] | None
    our_steps: int | None
    their_steps: int | None
    our_lrs: tuple[float, ...] = ()

    @property
    def difference(self) -> float:
        """Our mean minus theirs (NaN if either is missing)."""
        return self.ours[0] - self.theirs[0] if self.ours and self.theirs else math.nan


def authors_comparison(rows: Sequence[ClassicRow], authors: Mapping[str, Any] | None = None) -> list[Comparison]:
    """Per task and activation on either side (none dropped): ours at the authors' buffer size against theirs
    (``authors`` as the reference file's ``authors`` entry, by default that file's), the late return of each seed
    (:func:`late_return`, the authors' `fraction`) summarised as mean, SE (ddof=1) and n."""
    authors = reference_data()["authors"] if authors is None else authors
    fraction, buffer = float(authors["fraction"]), int(authors["buffer_size"])
    theirs = {(env, act): mean_sem(list(seeds.values())) + (len(seeds),)
              for env, by_act in authors["finals"].items() for act, seeds in by_act.items() if seeds}
    ours: dict[tuple[str, str], list[ClassicRow]] = defaultdict(list)
    for r in rows:
        if r.buffer_size == buffer:
            ours[(r.env, r.act)].append(r)
    out = []
    for env, act in sorted(set(theirs) | set(ours)):
        steps = authors["train_steps"].get(env)
        for r in ours.get((env, act)) or [None]:
            mine = None
            our_steps = None
            if r is not None:
                mine = mean_sem([late_return(run, fraction) for run in r.runs]) + (r.n_seeds,)
                our_steps = int(r.runs[0].config.get("n_timesteps") or training_length(r.runs[0]))
            out.append(Comparison(env, act, r.setting if r else "", mine, theirs.get((env, act)), our_steps,
                                  steps if (env, act) in theirs else None, r.lrs if r else ()))
    return out


# --- the page ----------------------------------------------------------------------------------


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
    parser = study_parser("python -m reports.classic", __doc__)
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


if __name__ == "__main__":
    sys.exit(main())
