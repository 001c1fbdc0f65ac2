"""Streaming regression reports, reading: run logs of ``stream-sin`` and ``edit`` runs -> numbers (numpy,
dataclasses; no plotting). Selection follows the paper's appendix (see :mod:`reports.stream`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from runlog import Run

from .. import data as run_data
from .. import paper

STREAM_ALGO = "stream-sin"
EDIT_ALGO = "edit"


def seeds_phrase(n_seeds: Iterable[int]) -> str:
    """``"3 seeds"``, ``"1 seed"``, ``"2–5 seeds (per method: the Seeds column)"``; ``"seeds"`` if none given."""
    counts = sorted(set(int(n) for n in n_seeds))
    if not counts:
        return "seeds"
    if len(counts) == 1:
        return f"{counts[0]} seed{'s' * (counts[0] != 1)}"
    return f"{counts[0]}–{counts[-1]} seeds (per method: the Seeds column)"


def table_caption(n_seeds: Iterable[int] = ()) -> str:
    """The caption of Table tb:sin, naming how many seeds the statistics are over (`n_seeds`: the seed count of
    each row; none given: "over seeds")."""
    counts = sorted(set(int(n) for n in n_seeds))
    if counts == [1]:
        stat = "the value of 1 seed (no standard error with one seed)"
    else:
        stat = (f"mean ± standard error (std with ddof=1 / sqrt(n), n the number of seeds) over "
                f"{seeds_phrase(counts)}" + ("; none for a method with one seed" if 1 in counts else ""))
    return (f"Final test MSE on sin(pi x) (test MSE after the last sample of the stream), {stat}, at the "
            "learning rate with the lowest mean final test MSE; for SR-NN the best over activation × lambda (> 0) × "
            "beta × learning rate. Paper (tb:sin): 5 runs, standard errors.")


#: :func:`table_caption` without a seed count
TABLE_CAPTION = table_caption()
_METHOD_ORDER = tuple(paper.METHOD_NAMES)
# Config keys that are not settings of the experiment as a whole: the sweep axes and bookkeeping.
_SWEPT = {"seed", "seeds", "lr", "act", "srnn_lambda", "srnn_beta", "command", "probe", "probe_at"}
_ELEPHANT_KEYS = {"d", "a", "h", "sigma_bias"}  # only matter for Elephant runs
_FIG2A_METHODS = ("elephant", "relu", "srnn")


def is_stream_run(run: Run) -> bool:
    """Whether `run` is a ``stream-sin`` run log."""
    return run.config.get("algo") == STREAM_ALGO


def is_edit_run(run: Run) -> bool:
    """Whether `run` is an ``edit`` run log."""
    return run.config.get("algo") == EDIT_ALGO


def _lambda(run: Run) -> float:
    return float(run.config.get("srnn_lambda") or 0.0)


def method_of(run: Run) -> str:
    """``"srnn"`` for a classical activation with Set-KL weight lambda > 0, ``"elephant-srnn"`` for Elephant with
    lambda > 0 (not in the paper), otherwise the activation (``"relu"``, ``"elephant"``, ...)."""
    act = str(run.config.get("act"))
    if _lambda(run) > 0:
        return "elephant-srnn" if act == "elephant" else "srnn"
    return act


def config_label(run: Run) -> str:
    """The setting apart from the learning rate: ``"relu"`` or ``"tanh lambda=0.1 beta=0.05"``."""
    act = str(run.config.get("act"))
    if _lambda(run) > 0:
        return f"{act} lambda={_lambda(run):g} beta={float(run.config.get('srnn_beta', math.nan)):g}"
    return act


def final_mse(run: Run) -> float | None:
    """Test MSE at the last step of the stream; None if the run has no ``test_mse`` or has not reached step
    ``config["n"]`` (still running or cut off)."""
    steps, values = run.scalars.get("test_mse", (np.empty(0), np.empty(0)))
    if len(steps) == 0:
        return None
    n = run.config.get("n")
    if isinstance(n, int) and int(steps.max()) < n:
        return None
    return float(values[int(np.argmax(steps))])


def incomplete_runs(runs: Iterable[Run]) -> list[str]:
    """Paths of the stream runs without a final test MSE (see `final_mse`); the tables leave them out."""
    return [r.path for r in runs if is_stream_run(r) and final_mse(r) is None]


def _differing(runs: Sequence[Run], keys: Iterable[str]) -> dict[str, list]:
    """``{key: distinct values}`` for the `keys` whose values differ between `runs`."""
    out = {}
    for key in keys:
        values = {json.dumps(r.config.get(key), sort_keys=True, default=str) for r in runs}
        if len(values) > 1:
            out[key] = sorted(values)
    return out


def _check_settings(runs: Sequence[Run], what: str, ignore: set[str], per_act: set[str] = frozenset()) -> None:
    """ValueError if `runs` differ in a config key outside `ignore` (keys in `per_act` only within an
    activation): they would belong to different experiments."""
    keys = {k for r in runs for k in r.config} - set(ignore)
    diff = _differing(runs, keys - set(per_act))
    for act in sorted({str(r.config.get("act")) for r in runs}):
        for key, values in _differing([r for r in runs if str(r.config.get("act")) == act],
                                      keys & set(per_act)).items():
            diff[f"{key} ({act})"] = values
    if diff:
        detail = "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(diff.items()))
        raise ValueError(f"{what} runs from different experiments (settings differ: {detail}); "
                         "pass the directories of one experiment")


def _lr(run: Run) -> float:
    return float(run.config.get("lr", math.nan))


def _key(run: Run) -> tuple[str, str, float]:
    return method_of(run), config_label(run), _lr(run)


def _method_rank(method: str) -> tuple[int, str]:
    return (_METHOD_ORDER.index(method), "") if method in _METHOD_ORDER else (len(_METHOD_ORDER), method)


def _mean_sem(values: Sequence[float]) -> tuple[float, float]:
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return math.nan, math.nan
    sem = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else math.nan
    return float(v.mean()), sem


@dataclass(frozen=True)
class SweepRow:
    """Final test MSE of one setting (method config, learning rate) over its seeds."""

    method: str
    config_label: str
    lr: float
    mean: float
    sem: float  # std(ddof=1) / sqrt(n); NaN with one seed
    n_seeds: int
    seeds: tuple[int, ...]
    values: tuple[float, ...]  # final test MSE of each seed, in `seeds` order


@dataclass(frozen=True)
class StreamRow:
    """One row of Table tb:sin: a method at its selected setting, and the paper's value (None if it has none)."""

    method: str
    config_label: str
    best_lr: float
    mean: float
    sem: float
    n_seeds: int
    paper_mean: float | None
    paper_sem: float | None


def _grouped(runs: Iterable[Run]) -> dict[tuple[str, str, float], list[Run]]:
    """Complete stream runs by setting, seeds sorted; ValueError on mixed experiments or a repeated seed."""
    stream = [r for r in runs if is_stream_run(r)]
    _check_settings(stream, "stream-sin", _SWEPT | {"algo"}, _ELEPHANT_KEYS)
    groups: dict[tuple[str, str, float], list[Run]] = {}
    for run in stream:
        if final_mse(run) is None:
            continue
        group = groups.setdefault(_key(run), [])
        twin = next((r for r in group if r.seed == run.seed), None)
        if twin is not None:
            raise ValueError(f"seed {run.seed} of {config_label(run)} lr={_lr(run):g} appears twice: "
                             f"{twin.path} and {run.path}")
        group.append(run)
    order = sorted(groups, key=lambda k: (_method_rank(k[0]), k[1], -k[2]))
    return {k: sorted(groups[k], key=lambda r: r.seed) for k in order}


def lr_sweep(runs: Iterable[Run]) -> list[SweepRow]:
    """Mean final test MSE per (method config, learning rate), over the seeds of each; for a sensitivity table.

    Rows in the paper's method order, then by config label, then learning rate from large to small. Only
    ``stream-sin`` runs that reached the end of the stream count. Raises ValueError if the runs come from
    different experiments (e.g. different stream lengths or widths) or a seed appears twice in a setting.
    """
    rows = []
    for (method, label, lr), group in _grouped(runs).items():
        values = tuple(final_mse(r) for r in group)
        mean, sem = _mean_sem(values)
        rows.append(SweepRow(method, label, lr, mean, sem, len(group), tuple(r.seed for r in group), values))
    return rows


def _best(rows: Iterable[SweepRow]) -> SweepRow:
    """The row with the lowest mean (NaN/inf count as worst; ties: the first)."""
    return min(rows, key=lambda r: r.mean if math.isfinite(r.mean) else math.inf)


def stream_table(runs: Iterable[Run]) -> list[StreamRow]:
    """Table tb:sin from run logs: per method its best setting (lowest mean final test MSE over seeds) with mean
    ± standard error over seeds there, next to the paper's value.

    Methods: each plain activation (``srnn_lambda == 0``) with the learning rate selected, and ``"srnn"`` with
    activation, lambda, beta and learning rate selected together. In the paper's order (ReLU, Sigmoid, Tanh, ELU,
    SR-NN, Elephant), methods without a paper value after them.
    """
    by_method: dict[str, list[SweepRow]] = {}
    for row in lr_sweep(runs):
        by_method.setdefault(row.method, []).append(row)
    out = []
    for method, rows in by_method.items():
        best = _best(rows)
        ref = paper.SIN_TABLE.get(method)
        out.append(StreamRow(method, best.config_label, best.lr, best.mean, best.sem, best.n_seeds,
                             None if ref is None else ref[0], None if ref is None else ref[1]))
    return out


def best_runs(runs: Iterable[Run], methods: Sequence[str] | None = None) -> dict[str, Run]:
    """``{label: run}``: per method the lowest seed at its selected setting, labelled e.g. ``"Elephant (lr
    0.0003)"`` or ``"SR-NN (tanh lambda=0.1 beta=0.1, lr 0.001)"``. `methods` default: Elephant, ReLU and SR-NN
    (Figure 2a), those present; all methods if none of them is."""
    runs = list(runs)
    groups = _grouped(runs)
    table = {row.method: row for row in stream_table(runs)}
    wanted = list(methods) if methods is not None else ([m for m in _FIG2A_METHODS if m in table] or list(table))
    out = {}
    for method in wanted:
        row = table.get(method)
        if row is None:
            continue
        out[_row_label(row)] = groups[(method, row.config_label, row.best_lr)][0]
    return out


def _row_label(row: StreamRow) -> str:
    setting = "" if row.config_label == row.method else f"{row.config_label}, "
    return f"{paper.method_name(row.method)} ({setting}lr {row.best_lr:g})"


@dataclass(frozen=True)
class SineSnapshot:
    """The learned function and the NTK against the current sample at one probe step of a stream run.

    x: ``(N,)`` probe inputs, increasing; f: ``(N,)`` learned f(x); ntk: ``(N,)`` normalised NTK(x, x_t) or None;
    x_t: the sample being learned (None if not logged).
    """

    step: int
    seed: int
    x: np.ndarray
    f: np.ndarray
    ntk: np.ndarray | None
    x_t: float | None


def _record_steps(run: Run, probe: str) -> list[int]:
    columns = run.probes.get(probe, {})
    return sorted({int(s) for s in columns.get("step", ())})


def _spread(steps: list[int], k: int) -> list[int]:
    """At most `k` of `steps`, evenly spaced, first and last kept."""
    if len(steps) <= k:
        return steps
    return [steps[i] for i in sorted({round(j * (len(steps) - 1) / (k - 1)) for j in range(k)})]


def sine_snapshots(run: Run, steps: Sequence[int] | None = None, max_steps: int = 6) -> list[SineSnapshot]:
    """Snapshots at the ``outputs`` records nearest to `steps` (default: the recorded steps, at most
    `max_steps` of them evenly spaced). Empty if the run has no ``outputs`` records or no probe inputs."""
    inputs = run_data.probe_inputs(run)
    if inputs is None or "y" not in run.probes.get("outputs", {}):
        return []
    x = np.asarray(inputs, dtype=float).reshape(len(inputs), -1)[:, 0]
    order = np.argsort(x, kind="stable")
    targets = _spread(_record_steps(run, "outputs"), max_steps) if steps is None else list(steps)
    out: list[SineSnapshot] = []
    for target in targets:
        rec = run_data.nearest_record(run, "outputs", "y", target)
        if rec is None or any(s.step == rec.step for s in out):
            continue
        f = np.asarray(rec.value, dtype=float).reshape(len(x), -1)[:, 0]
        kernel = run_data.nearest_record(run, "ntk", "kernel", rec.step)
        x_t = run_data.nearest_record(run, "ntk", "x_t", rec.step)
        kernel = kernel if kernel is not None and kernel.step == rec.step else None
        x_t = x_t if x_t is not None and x_t.step == rec.step else None
        out.append(SineSnapshot(step=rec.step, seed=run.seed, x=x[order], f=f[order],
                                ntk=None if kernel is None else np.asarray(kernel.value, dtype=float)[order],
                                x_t=None if x_t is None else float(np.asarray(x_t.value).reshape(-1)[0])))
    return out


@dataclass(frozen=True)
class EditRecord:
    """One seed's edit: predictions on the grid `x` before and after moving the target at ``x_edit``."""

    act: str
    seed: int
    x: np.ndarray
    before: np.ndarray
    after: np.ndarray
    far_change: float  # mean |after - before| where |x - x_edit| > far
    steps: int  # gradient steps the edit took
    pretrain_mse: float
    x_edit: float
    target: float
    far: float


@dataclass(frozen=True)
class EditRow:
    """Far change of one activation over its seeds (mean ± standard error), and the edit's gradient steps."""

    act: str
    mean_far_change: float
    sem_far_change: float
    mean_steps: float
    min_steps: int
    max_steps: int
    mean_pretrain_mse: float
    n_seeds: int


@dataclass(frozen=True)
class EditTable:
    """Rows per activation (Elephant, ReLU first) and ``ratio`` = ReLU mean far change / Elephant's (None
    unless both are present)."""

    rows: list[EditRow]
    ratio: float | None
    x_edit: float
    target: float
    far: float


def edit_records(edit_runs: Iterable[Run]) -> dict[str, list[EditRecord]]:
    """``{act: [record per seed]}`` of the ``edit`` run logs (others and logs without an ``edit`` record are left
    out), Elephant and ReLU first, seeds sorted. ValueError if the runs differ in settings other than the
    activation, or a seed of an activation appears twice."""
    runs = [r for r in edit_runs if is_edit_run(r) and len(r.probes.get("edit", {}).get("step", ()))]
    _check_settings(runs, "edit", {"act", "seed", "seeds", "command", "lr"}, _ELEPHANT_KEYS)
    out: dict[str, list[EditRecord]] = {}
    for run in runs:
        c = run.probes["edit"]
        act = str(run.config.get("act"))
        rec = EditRecord(act=act, seed=run.seed, x=np.asarray(c["x"][0], dtype=float),
                         before=np.asarray(c["before"][0], dtype=float), after=np.asarray(c["after"][0], dtype=float),
                         far_change=float(c["far_change"][0]), steps=int(c["steps"][0]),
                         pretrain_mse=float(c["pretrain_mse"][0]), x_edit=float(run.config.get("x_edit", math.nan)),
                         target=float(run.config.get("target", math.nan)), far=float(run.config.get("far", math.nan)))
        if any(r.seed == rec.seed for r in out.get(act, [])):
            raise ValueError(f"edit: seed {rec.seed} of {act} appears twice ({run.path})")
        out.setdefault(act, []).append(rec)
    first = ("elephant", "relu")
    acts = sorted(out, key=lambda a: (first.index(a) if a in first else 2, _method_rank(a)))
    return {a: sorted(out[a], key=lambda r: r.seed) for a in acts}


def edit_table(edit_runs: Iterable[Run]) -> EditTable:
    """Mean far change ± standard error over seeds and the edit's gradient steps per activation, and the
    ReLU / Elephant ratio of mean far changes. ValueError if there are no edit records."""
    records = edit_records(edit_runs)
    if not records:
        raise ValueError("edit_table: no edit run logs")
    return _table_of(records)


def _table_of(records: Mapping[str, list[EditRecord]]) -> EditTable:
    rows = []
    for act, recs in records.items():
        mean, sem = _mean_sem([r.far_change for r in recs])
        steps = [r.steps for r in recs]
        rows.append(EditRow(act, mean, sem, float(np.mean(steps)), min(steps), max(steps),
                            float(np.mean([r.pretrain_mse for r in recs])), len(recs)))
    by_act = {r.act: r for r in rows}
    ratio = None
    if "relu" in by_act and "elephant" in by_act and by_act["elephant"].mean_far_change > 0:
        ratio = by_act["relu"].mean_far_change / by_act["elephant"].mean_far_change
    one = next(iter(records.values()))[0]
    return EditTable(rows, ratio, one.x_edit, one.target, one.far)
