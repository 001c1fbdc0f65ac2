"""Class-incremental reports, reading: run logs of ``class-inc`` runs -> numbers (numpy, dataclasses; no plotting).
Selection, statistics and the accuracy matrix are described in :mod:`reports.classinc`."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from runlog import Run

from .. import data as run_data

ALGO = "class-inc"
#: what makes the runs: named in the error when a folder holds none
MAKE_RUNS = "python -m agents.train class-inc --data split-digits --seeds 0,1,2 --out RUNS_DIR"
#: the paper's numbers (tb:mnist, tb:cifar), kept with the project: users do not have the paper's source
REFERENCE = Path(__file__).resolve().parent.parent / "reference" / "class_inc.json"
TABLE_CAPTION = (
    "Test accuracy over all classes after one pass through the class-incremental stream (final_acc), mean ± "
    "standard error over seeds (std with ddof=1 / sqrt(n), n the number of seeds), per method at the setting with "
    "the highest mean final accuracy (among the settings with the most common number of seeds). The paper's numbers "
    "are for Split MNIST (tb:mnist) and Split CIFAR-10 (tb:cifar): where our dataset is another one (e.g. "
    "split-digits, split-fashion) they are beside ours for orientation only, not a like-for-like comparison.")

#: the paper's display names of the methods ``<model>-<act>[-ewc]``, in the paper's table order
METHOD_NAMES = {"mlp-relu": "MLP", "mlp-relu-ewc": "MLP+Streaming EWC", "mlp-elephant": "EMLP",
                "cnn-relu": "CNN", "cnn-relu-ewc": "CNN+Streaming EWC", "cnn-elephant": "ECNN"}
#: the paper's dataset whose numbers stand beside ours (None: no comparable table)
PAPER_DATASET = {"split-mnist": "split-mnist", "split-digits": "split-mnist", "split-fashion": "split-mnist",
                 "split-cifar10": "split-cifar10"}
#: config keys that are not part of a setting: the seed, what only says where or how the run was written, and the
#: task list (drawn by the seed when ``class_order`` is random)
NOT_SETTING = ("seed", "seeds", "device", "probe", "probe_at", "command", "tasks")
#: the hyper-parameters the tables show in their own columns (config key, column name)
HYPER_COLUMNS = (("lr", "lr"), ("updates", "E"), ("a", "a"), ("sigma_bias", "sigma_bias"),
                 ("layer_norm", "layer_norm"), ("ewc_lambda", "EWC lambda"), ("ewc_gamma", "EWC gamma"))
_GROUP_KEYS = ("algo", "data", "width", "model", "act")


def is_classinc_run(run: Run) -> bool:
    """Whether `run` is a ``class-inc`` run log."""
    return run.config.get("algo") == ALGO


def method_of(config: Mapping[str, Any]) -> str:
    """``<model>-<act>[-ewc]`` (as the run folders): ``mlp-elephant``, ``cnn-relu-ewc``."""
    ewc = float(config.get("ewc_lambda") or 0.0) > 0
    return f"{config.get('model')}-{config.get('act')}" + ("-ewc" if ewc else "")


def method_name(method: str) -> str:
    """The paper's name of a method (``mlp-elephant`` -> ``EMLP``); others ``<model>-<act>[+Streaming EWC]``."""
    if method in METHOD_NAMES:
        return METHOD_NAMES[method]
    return method[:-4] + "+Streaming EWC" if method.endswith("-ewc") else method


def _method_rank(method: str) -> tuple[int, str]:
    order = list(METHOD_NAMES)
    return (order.index(method), "") if method in order else (len(order), method)


def setting_key(config: Mapping[str, Any]) -> str:
    """The config without :data:`NOT_SETTING`, as sorted JSON: equal for the seeds of one setting."""
    return run_data.config_key(config, NOT_SETTING)


# --- which runs count ---------------------------------------------------------------


def final_acc(run: Run) -> float | None:
    """The run's ``final_acc`` (all classes, after the stream); None if it has none or it is not finite."""
    steps, values = run.scalars.get("final_acc", (np.empty(0), np.empty(0)))
    if len(values) == 0:
        return None
    value = float(values[int(np.argmax(steps))])
    return value if math.isfinite(value) else None


def exclusion(run: Run) -> str | None:
    """Why a class-inc run is left out of the tables, or None if it counts: it ended other than ``finished``
    (``run_end``: diverged, interrupted, a failed write) or has no final accuracy (still running or killed)."""
    end = run_data.run_end(run)
    last = run_data.training_length(run)
    if end == "nan":
        return f"diverged (non-finite training loss; last record at step {last})"
    if end is not None and end != "finished":
        return f"{end} (last record at step {last})"
    if final_acc(run) is None:
        return f"unfinished: no final_acc record (still running or killed; last record at step {last})"
    return None


@dataclass(frozen=True)
class LeftOut:
    """A class-inc run log the tables leave out, and why."""

    path: str
    reason: str


def usable_runs(runs: Iterable[Run]) -> tuple[list[Run], list[LeftOut]]:
    """The class-inc runs that count (one per setting and seed, the first by path), and those left out: incomplete or
    diverged (:func:`exclusion`), or a second log of a setting and seed already counted. Other runs are ignored."""
    kept: dict[tuple[str, int], Run] = {}
    left: list[LeftOut] = []
    for run in sorted((r for r in runs if is_classinc_run(r)), key=lambda r: r.path):
        reason = exclusion(run)
        key = (setting_key(run.config), int(run.seed))
        if reason is None and key in kept:
            reason = f"same setting and seed {run.seed} as {kept[key].path}; counted once"
        if reason is None:
            kept[key] = run
        else:
            left.append(LeftOut(run.path, reason))
    return list(kept.values()), left


# --- settings and their selection ---------------------------------------------------


def _mean_sem(values: Sequence[float]) -> tuple[float, float]:
    return run_data.mean_sem(values) if len(values) else (math.nan, math.nan)


@dataclass(frozen=True)
class SettingRow:
    """Final accuracy of one setting (config except the seed) over its seeds.

    `hyper` ``{config key: value}`` of :data:`HYPER_COLUMNS` where they apply (no ``a`` without Elephant, no EWC
    settings without EWC; None for ``sigma_bias``/``layer_norm``: the activation's convention); `other` names the
    further settings that set it apart from the other settings of its data and width (e.g. ``batch_size=10``), empty
    if none. `flagged`: fewer seeds than the most common number among the settings of its data and width
    (`expected_seeds`); such settings are listed but not selected while a method has a setting with enough seeds.
    `values` are the seeds' final accuracies in `seeds` order, `runs` their run logs.
    """

    data: str
    width: int
    method: str
    key: str
    hyper: Mapping[str, Any]
    other: str
    mean: float
    sem: float
    n_seeds: int
    seeds: tuple[int, ...]
    values: tuple[float, ...]
    expected_seeds: int
    runs: tuple[Run, ...] = field(default=(), repr=False, compare=False)

    @property
    def flagged(self) -> bool:
        return self.n_seeds < self.expected_seeds

    @property
    def name(self) -> str:
        return method_name(self.method)


def _hyper(config: Mapping[str, Any]) -> dict[str, Any]:
    out = {key: config.get(key) for key, _ in HYPER_COLUMNS}
    if config.get("act") != "elephant":  # the only activation here with a swept `a`
        del out["a"]
    if not float(config.get("ewc_lambda") or 0.0) > 0:
        del out["ewc_lambda"], out["ewc_gamma"]
    return out


def sweep(runs: Iterable[Run]) -> list[SettingRow]:
    """One row per setting of the usable class-inc runs (:func:`usable_runs`): mean ± standard error of the final
    accuracy over its seeds. Rows by data, width, the paper's method order, then mean final accuracy (highest first)
    and setting (a deterministic order for ties)."""
    usable, _ = usable_runs(runs)
    groups: dict[str, list[Run]] = {}
    for run in usable:
        groups.setdefault(setting_key(run.config), []).append(run)
    configs = {key: group[0].config for key, group in groups.items()}
    by_section: dict[tuple[str, int], list[str]] = {}
    for key, c in configs.items():
        by_section.setdefault((str(c["data"]), int(c["width"])), []).append(key)
    rows = []
    for (data, width), keys in by_section.items():
        counts = Counter(len(groups[k]) for k in keys)
        expected = max(counts, key=lambda n: (counts[n], n))  # the most common number of seeds (ties: the larger)
        shown = [k for k, _ in HYPER_COLUMNS]
        labels = run_data.config_labels([configs[k] for k in keys],
                                        skip=(*NOT_SETTING, *shown, *_GROUP_KEYS, "derived"))
        for key, other in zip(keys, labels):
            group = sorted(groups[key], key=lambda r: r.seed)
            values = tuple(final_acc(r) for r in group)
            mean, sem = _mean_sem(values)
            rows.append(SettingRow(data, width, method_of(configs[key]), key, _hyper(configs[key]), other, mean, sem,
                                   len(group), tuple(int(r.seed) for r in group), values, expected, tuple(group)))
    return sorted(rows, key=lambda r: (r.data, r.width, _method_rank(r.method), -r.mean, r.key))


def best_settings(rows: Iterable[SettingRow]) -> list[SettingRow]:
    """Per (data, width, method) the setting with the highest mean final accuracy, among the settings not flagged
    (all of them if every one is flagged); ties: the first in :func:`sweep`'s order. Same order as `rows`."""
    candidates: dict[tuple[str, int, str], list[SettingRow]] = {}
    for row in rows:
        candidates.setdefault((row.data, row.width, row.method), []).append(row)
    best = []
    for group in candidates.values():
        pool = [r for r in group if not r.flagged] or group
        best.append(min(pool, key=lambda r: (-r.mean, r.key)))
    return best


def sections(rows: Iterable[SettingRow]) -> list[tuple[str, int]]:
    """The (data, width) pairs of `rows`, sorted."""
    return sorted({(r.data, r.width) for r in rows})


# --- the paper's numbers ------------------------------------------------------------


@cache
def _read_reference(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: cannot read the paper's class-incremental numbers: {err}") from None


def reference_data(path: str | Path = REFERENCE) -> dict[str, Any]:
    """The reference file (:data:`REFERENCE`): ``{"split-mnist" | "split-cifar10": {"1000" | "10000": {paper method
    name: [mean, standard error or None]}}}`` with its source and notes."""
    return _read_reference(Path(path))


def paper_dataset(data: str) -> str | None:
    """The paper's dataset whose table stands beside runs on `data` (:data:`PAPER_DATASET`), or None."""
    return PAPER_DATASET.get(data)


def paper_rows(dataset: str | None, width: int) -> dict[str, tuple[float, float | None]]:
    """``{paper method name: (mean, standard error or None)}`` of the paper's table of `dataset` at `width` feature
    units; empty where the paper has none."""
    table = reference_data().get(dataset or "", {}).get(str(width), {})
    return {name: (float(v[0]), None if v[1] is None else float(v[1])) for name, v in table.items()}


def paper_value(data: str, width: int, method: str) -> tuple[float, float | None] | None:
    """The paper's (mean, standard error) of `method` at `width` on the paper's dataset for `data`, or None."""
    return paper_rows(paper_dataset(data), width).get(method_name(method))


# --- the accuracy matrix and forgetting ---------------------------------------------


def n_tasks(run: Run) -> int:
    """Number of tasks: the config's task list, else the ``task_acc_<j>`` scalars."""
    tasks = run.config.get("tasks")
    if isinstance(tasks, list) and tasks:
        return len(tasks)
    return sum(1 for name in run.scalars if name.startswith("task_acc_"))


def accuracy_matrix(run: Run) -> np.ndarray:
    """``A`` ``(K, K)``: ``A[k, j]`` the test accuracy on task j's classes after the k-th task (the k-th record of
    ``task_acc_<j>``, records in step order); NaN where a record is missing."""
    k = n_tasks(run)
    out = np.full((k, k), np.nan)
    for j in range(k):
        steps, values = run.scalars.get(f"task_acc_{j}", (np.empty(0), np.empty(0)))
        values = np.asarray(values, dtype=float)[np.argsort(steps, kind="stable")][:k]
        out[: len(values), j] = values
    return out


def task_ends(run: Run) -> np.ndarray:
    """The steps (training samples seen) of the task ends: those of the ``task_acc_0`` records."""
    steps = run.scalars.get("task_acc_0", (np.empty(0), np.empty(0)))[0]
    return np.sort(np.asarray(steps, dtype=np.int64))


def forgetting(matrix: np.ndarray) -> tuple[float, np.ndarray]:
    """Average forgetting of an accuracy matrix ``(K, K)``, and per task ``(K - 1,)``: for each task ``j < K - 1``,
    ``max_{k < K-1} A[k, j] - A[K-1, j]`` (best accuracy on it before the last task minus the final one); the
    average is their mean. NaN for fewer than two tasks."""
    a = np.asarray(matrix, dtype=float)
    if a.shape[0] < 2:
        return math.nan, np.empty(0)
    last = a.shape[0] - 1
    per_task = a[:last, :last].max(axis=0) - a[last, :last]
    return float(per_task.mean()), per_task


@dataclass(frozen=True)
class Forgetting:
    """The accuracy matrix and forgetting of a method at its selected setting, over its seeds.

    matrices: ``(R, K, K)`` each seed's :func:`accuracy_matrix`; mean: ``(K, K)`` their mean; per_seed: ``(R,)``
    each seed's average forgetting; per_task: ``(K - 1,)`` mean over seeds of each task's forgetting;
    forgetting/forgetting_sem: mean ± standard error over seeds of the average forgetting.
    """

    row: SettingRow
    matrices: np.ndarray
    mean: np.ndarray
    per_seed: np.ndarray
    per_task: np.ndarray
    forgetting: float
    forgetting_sem: float


def _complete(matrix: np.ndarray) -> bool:
    """Whether every entry on and below the diagonal was recorded (a record at every task end)."""
    return matrix.size > 0 and bool(np.isfinite(np.tril(matrix)).all())


def incomplete_matrices(best: Iterable[SettingRow]) -> list[tuple[SettingRow, int, int]]:
    """``(row, task-end records, tasks)`` of the settings whose finished runs lack accuracy-matrix records (fewer
    ``task_acc_<j>`` records than tasks, or none): :func:`forgetting_table` leaves them out rather than shift rows."""
    out = []
    for row in best:
        mats = [accuracy_matrix(r) for r in row.runs]
        if not mats or not all(_complete(m) for m in mats) or len({m.shape for m in mats}) != 1:
            out.append((row, min(len(task_ends(r)) for r in row.runs), max(n_tasks(r) for r in row.runs)))
    return out


def forgetting_table(best: Iterable[SettingRow]) -> list[Forgetting]:
    """:class:`Forgetting` of each selected setting whose runs all have complete accuracy matrices of one size (a
    ``task_acc_<j>`` record at every task end; see :func:`incomplete_matrices` for the others)."""
    out = []
    for row in best:
        mats = [accuracy_matrix(r) for r in row.runs]
        if not mats or not all(_complete(m) for m in mats) or len({m.shape for m in mats}) != 1:
            continue
        stack = np.stack(mats)
        each = [forgetting(m) for m in mats]
        per_seed = np.array([f for f, _ in each])
        per_task = np.mean([t for _, t in each], axis=0)
        mean, sem = _mean_sem(per_seed)
        out.append(Forgetting(row, stack, stack.mean(axis=0), per_seed, per_task, mean, sem))
    return out


# --- curves and probes --------------------------------------------------------------


def accuracy_curve(runs: Sequence[Run], num: int | None = None) -> run_data.Curve | None:
    """``test_acc`` of `runs` on a common grid of training samples seen (default: as many points as the run with
    the most records has, at most 1000); None if no run has it."""
    if num is None:
        num = max((len(r.scalars["test_acc"][0]) for r in runs if "test_acc" in r.scalars), default=0)
        num = min(max(num, 2), 1000)
    return run_data.learning_curve(runs, "test_acc", num=num)


def mean_task_ends(runs: Iterable[Run]) -> np.ndarray:
    """Per task index the mean over `runs` of its end step (they differ by seed when the class order is random)."""
    ends = [task_ends(r) for r in runs]
    ends = [e for e in ends if len(e)]
    if not ends:
        return np.empty(0)
    k = min(len(e) for e in ends)
    return np.mean([e[:k] for e in ends], axis=0)


#: the probes between tasks the report plots: (probe, field, what it shows)
TASK_PROBES = (("gradcov", "nll_negative_mass", "gradient interference: negative share of the off-diagonal "
                                                 "gradient covariance mass"),
               ("sparsity", "activation_sparsity", "activation sparsity of the last activation layer"))


def task_probe(runs: Sequence[Run], probe: str, name: str) -> run_data.Series | None:
    """Probe field `name` at the task ends (records in step order; per-layer vectors: the last layer) as a
    :class:`reports.data.Series` over the runs, ``steps`` the task index 1..K (the k-th record is after task k, so
    seeds with different task lengths line up); NaN where a run has fewer records. None if no run has the field."""
    series = []
    for run in runs:
        columns = run.probes.get(probe, {})
        if name not in columns or len(columns["step"]) == 0:
            continue
        values = np.asarray(columns[name], dtype=float)[np.argsort(columns["step"], kind="stable")]
        series.append(values.reshape(len(values), -1)[:, -1])
    if not series:
        return None
    k = max(len(s) for s in series)
    values = np.full((len(series), k), np.nan)
    for i, s in enumerate(series):
        values[i, : len(s)] = s
    return run_data.Series(steps=np.arange(1, k + 1), values=values)
