"""The classic-control study, reading: run logs of DQN runs -> the study's points (best learning rate per setting),
the reference numbers and the comparison with the authors' published results (numpy, dataclasses; no plotting).
Selection and statistics are described in :mod:`reports.classic`."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from runlog import Run

from ..data import config_key, config_labels, final_return, finished, mean_sem, run_end, training_length

_KEYS = ("env", "act", "buffer_size", "learning_rate")  # config keys the study needs

#: the study's reference numbers: normalisation constants and the authors' per-seed final returns
REFERENCE = Path(__file__).parent.with_name("reference") / "classic_dqn.json"


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
