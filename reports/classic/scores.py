"""The classic-control study, aggregates across tasks: final returns normalised per task, IQM and mean with
stratified-bootstrap CIs and performance profiles (computed by rliable; numpy, dataclasses; no plotting)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .data import REFERENCE, ClassicRow, reference_data


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
