"""Run a grid of configurations: expand it, skip finished runs, execute the rest in parallel.

    python -m agents.grid GRID.yml --out DIR [--workers N] [--backend local|ray] [--resume] [--dry-run] \\
        [--axis KEY=VALUES ...]

A grid file (YAML) names a command of ``agents.train``, optionally plugin modules to import (:mod:`probes.plugins`),
and one or more sub-grids whose lists are crossed::

    command: stream-sin
    import: [my_plugin]   # optional
    fixed: {steps: 200}
    grids:
      - {act: [elephant, relu], lr: [0.001, 0.0001], seed: [0, 1, 2, 3, 4]}
      - {act: [relu], srnn_lambda: [0.1, 0.01], srnn_beta: [0.05, 0.1], lr: [0.001], seed: [0, 1, 2, 3, 4]}

Every entry is validated by the command before anything runs. A run is finished when its run directory holds
``DONE.json`` (written last, with the run's summary) and its saved config (``config.yaml``, or the config in
``DONE.json`` for commands that write none) equals the grid's config for it, ignoring the keys that only change
how a run reports and saves (:data:`agents.runfolder.OUTPUT_KEYS`); a run finished or begun with another config
(its ``config.yaml`` differs) is stale and is redone afresh, never resumed. An interrupted grid re-run skips
finished runs and redoes the rest; with ``--resume`` it continues unfinished runs of commands that checkpoint (dqn,
ppo, sac) from their last checkpoint, exactly as if they had not stopped.

Ctrl-C starts no more runs; the running ones get the signal too (they share the terminal's process group) and
stop cleanly; the grid then prints what finished, was interrupted or was not started and exits with status 130.
SIGTERM does the same (exit status 143). With ``--workers`` 2 or more, a signal sent to the grid process alone
(``kill -INT PID``) lets the running runs finish. A run that fails is reported (its traceback goes to
``ERROR.txt`` in its run directory) and the others go on; the grid then exits with status 1.

``engine: population`` (``dqn`` grids only; optionally ``population_size: N``, the most members per population)
trains the runs whose configs differ only in seed, learning rate, buffer size and epsilon schedule
(:data:`agents.population.MEMBER_KEYS`) together, as one population in one process
(:func:`agents.population.run.train_population`): each member's run folder is the one the run would have alone, with
the same ``DONE.json``; a population stopped or killed continues from its checkpoint with ``--resume``.

The local backend is a process pool with one torch thread per worker; ``--backend ray`` runs the same tasks (a run,
or a population) on a Ray cluster, one CPU and one torch thread each: the cluster at ``RAY_ADDRESS``, else a local
one; as many at a time as the cluster has CPUs, or ``--workers``. Ray never retries a task (``--resume`` continues
what a dead worker left); a stop signal cancels the running tasks, which stop cleanly as on Ctrl-C.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm

from probes.plugins import PluginError, load_plugins
from runlog import RunLogWriteError

from .commands import commands, get_command
from .errors import ConfigError
from .inputs import int_range, parse_yaml_value, read_yaml
from .runfolder import comparable_config
from .population import MEMBER_KEYS
from .runlock import LOCK_NAME, run_lock
from .signals import RECEIVED, STOP_SIGNALS, handling

__all__ = ["GridRun", "PopulationEngine", "PopulationTask", "WorkerLost", "Outcome", "GridReport", "expand",
           "load_grid", "plan", "tasks", "execute", "execute_population", "run_grid", "main"]

DONE = "DONE.json"
ERROR = "ERROR.txt"


@dataclass(frozen=True)
class PopulationEngine:
    """A grid's ``engine: population``: its runs train as members of populations (at most ``size`` members each;
    None: no limit) whose run folders lie under ``out``, the grid's root folder."""

    out: Path
    size: int | None = None


@dataclass(frozen=True)
class GridRun:
    command: str
    config: dict[str, Any]
    run_dir: Path
    imports: tuple[str, ...] = ()  # plugin modules the worker imports first
    resume: bool = False  # continue from the run folder's checkpoint (a resumable command's unfinished run)
    entry: dict[str, Any] = field(default_factory=dict)  # the grid entry (flag values) the config was made from
    population: PopulationEngine | None = None  # trained as a population member (engine: population)

    @property
    def status(self) -> str:
        """``done`` (finished with this config), ``stale`` (finished or begun with another config, as its
        ``config.yaml`` says: redone afresh, never resumed) or ``todo`` (not begun, or begun with this config)."""
        done = (self.run_dir / DONE).exists()
        if not done and not (self.run_dir / "config.yaml").exists():
            return "todo"
        same = comparable_config(saved_config(self.run_dir)) == comparable_config(self.config)
        return ("done" if done else "todo") if same else "stale"


def saved_config(run_dir: Path) -> Any:
    """The config a run directory's files come from: its ``config.yaml``, else the one in ``DONE.json``."""
    try:
        if (run_dir / "config.yaml").exists():
            return yaml.safe_load((run_dir / "config.yaml").read_text())
        return json.loads((run_dir / DONE).read_text()).get("config")
    except (OSError, ValueError, yaml.YAMLError):
        return None  # unreadable: counts as another config


GRID_KEYS = ("command", "fixed", "grids", "import", "engine", "population_size")


def expand(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """All configurations of a grid spec (``fixed`` merged into the cross product of each sub-grid's lists)."""
    if not isinstance(spec, Mapping) or "command" not in spec:
        raise ConfigError("a grid needs a 'command' (e.g. command: stream-sin) and 'grids' (a list of mappings)")
    unknown = set(spec) - set(GRID_KEYS)
    if unknown:
        raise ConfigError(f"unknown grid keys {sorted(unknown)}; allowed: {', '.join(GRID_KEYS)}")
    fixed = spec.get("fixed") or {}
    grids = spec.get("grids") or [{}]
    if not isinstance(fixed, Mapping) or not isinstance(grids, list) or not all(isinstance(g, Mapping) for g in grids):
        raise ConfigError("'fixed' must be a mapping and 'grids' a list of mappings of lists")
    out = []
    for grid in grids:
        keys = list(grid)
        values = [v if isinstance(v, list) else [v] for v in grid.values()]
        for combo in itertools.product(*values):
            out.append({**fixed, **dict(zip(keys, combo))})
    return out


def axis_values(text: str) -> list[Any]:
    """``--axis`` values: comma-separated numbers or words, ``A-B`` an inclusive integer range (``0-9``)."""
    out: list[Any] = []
    for item in (i.strip() for i in text.split(",")):
        span = int_range(item, "--axis")
        if span is not None:
            out.extend(span)
            continue
        for kind in (int, float):
            try:
                out.append(kind(item))
                break
            except ValueError:
                pass
        else:
            out.append(parse_yaml_value(item, "--axis") if item else item)
    return out


def with_axes(spec: Mapping[str, Any], axes: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """``spec`` with each key of ``axes`` taking those values in every sub-grid (replacing the key's list there, or
    its value in ``fixed`` and its ``set`` list; ``lr`` and ``learning_rate`` name one key), sub-grids made identical
    by that dropped: how a grid file scales by flags (``--axis seed=0-9 --axis lr=1e-3,3e-4``) without an edited
    copy."""
    from agents.rl.config import ALIASES

    def same(a: str, b: str) -> bool:
        return ALIASES.get(a, a) == ALIASES.get(b, b)

    fixed = {k: v for k, v in (spec.get("fixed") or {}).items() if not any(same(k, key) for key in axes)}
    if "set" in fixed:  # (KEY=VALUE items)
        items = [fixed["set"]] if isinstance(fixed["set"], str) else list(fixed["set"])
        fixed["set"] = [i for i in items if not any(same(str(i).partition("=")[0].strip(), key) for key in axes)]
    grids: list[dict[str, Any]] = []
    for grid in spec.get("grids") or [{}]:
        grid = {**{k: v for k, v in grid.items() if not any(same(k, key) for key in axes)},
                **{key: list(values) for key, values in axes.items()}}
        if grid not in grids:
            grids.append(grid)
    return {**spec, "fixed": fixed, "grids": grids}


def load_grid(path: str | Path) -> dict[str, Any]:
    """Read a YAML grid file, with errors that name the file."""
    spec = read_yaml(path, "grid")
    if not isinstance(spec, dict):
        raise ConfigError(f"grid file {path} must hold a mapping with 'command' and 'grids'")
    return spec


def plan(spec: Mapping[str, Any], out: str | Path, imports: Sequence[str] = ()) -> list[GridRun]:
    """Validate every configuration and place it in its run directory under ``out``; plugin modules (``imports``
    and the grid's ``import`` list) are loaded first, and again by each worker."""
    listed = (spec.get("import") if isinstance(spec, Mapping) else None) or []
    listed = [listed] if isinstance(listed, str) else listed
    if not isinstance(listed, list) or not all(isinstance(m, str) for m in listed):
        raise ConfigError(f"'import' must be a module name or a list of them, got {listed!r}")
    modules = tuple(dict.fromkeys([*listed, *imports]))
    try:
        load_plugins(modules)
    except PluginError as err:
        raise ConfigError(str(err)) from None
    cmd = get_command(str(spec.get("command")))
    population = _population_engine(spec, cmd.name, Path(out))
    runs, seen = [], set()
    for i, entry in enumerate(expand(spec)):
        try:
            config = cmd.make_config(entry)
        except ConfigError as err:
            raise ConfigError(f"grid entry {i} {entry}: {err}") from None
        run_dir = cmd.run_dir(config, Path(out))
        if run_dir in seen:
            raise ConfigError(f"grid entry {i} {entry} duplicates the run directory {run_dir}")
        seen.add(run_dir)
        runs.append(GridRun(cmd.name, config, run_dir, modules, entry=dict(entry), population=population))
    return runs


def _population_engine(spec: Mapping[str, Any], command: str, out: Path) -> PopulationEngine | None:
    """The grid's ``engine`` and ``population_size``, checked."""
    engine, size = spec.get("engine"), spec.get("population_size")
    if engine is None:
        if size is not None:
            raise ConfigError("population_size is for grids with engine: population")
        return None
    if engine != "population":
        raise ConfigError(f"unknown engine {engine!r}: engine: population trains dqn runs as populations; leave "
                          "engine out to train each run in a process of its own")
    if command != "dqn":
        raise ConfigError(f"engine: population trains dqn runs only, not {command}; leave engine out for {command}")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ConfigError(f"population_size must be a positive integer (the most members per population), got "
                          f"{size!r}")
    return PopulationEngine(out, size)


@dataclass(frozen=True)
class PopulationTask:
    """Unfinished runs of an ``engine: population`` grid trained as one population: ``dqn`` runs whose configs
    differ only in :data:`MEMBER_KEYS`; ``values`` is the flag values they share."""

    runs: tuple[GridRun, ...]
    values: dict[str, Any]
    out: Path

    @property
    def resume(self) -> bool:
        """Continue the population's checkpoint (every member is an unfinished run the grid resumes)."""
        return all(r.resume for r in self.runs)


#: what a worker executes: a run, or a population of runs
Task = GridRun | PopulationTask


def _runs(task: Task) -> tuple[GridRun, ...]:
    return task.runs if isinstance(task, PopulationTask) else (task,)


def tasks(runs: Sequence[GridRun]) -> list[Task]:
    """``runs`` as tasks, in order: the runs of an ``engine: population`` grid whose configs differ only in
    :data:`MEMBER_KEYS` form population tasks (of at most ``population_size`` members), any other run is a task.
    Resumed runs that a population checkpoint holds come first, grouped as it holds them (whatever the grid's chunks
    are now): a checkpoint all of whose members are still to do is resumed, not orphaned."""

    def shared(run: GridRun) -> str:
        return json.dumps({k: v for k, v in run.config.items() if k not in (*MEMBER_KEYS, "derived")}, sort_keys=True,
                          default=str)

    out: list[GridRun | list[GridRun]] = _checkpointed(runs, shared)
    claimed = {r.run_dir for group in out for r in group}
    open_groups: dict[str, list[GridRun]] = {}
    for run in runs:
        if run.run_dir in claimed:
            continue
        if run.population is None:
            out.append(run)
            continue
        key = shared(run)
        group = open_groups.get(key)
        if group is None or len(group) == run.population.size:
            group = open_groups[key] = []
            out.append(group)
        group.append(run)
    return [t if isinstance(t, GridRun) else
            PopulationTask(tuple(t), _shared_values(t[0].entry), t[0].population.out) for t in out]


def _checkpointed(runs: Sequence[GridRun], shared: Callable[[GridRun], str]) -> list[list[GridRun]]:
    """The populations of resumed runs that have a checkpoint (:func:`agents.population.checkpointed_groups`), as
    their checkpoints hold them: every member among ``runs``, resumed, sharing the rest of the config, in the
    checkpoint's order (which makes its key), even beyond ``population_size``. A run belongs to the newest checkpoint
    that lists it: where that one cannot be resumed (another member finished or left the grid), no older one is
    resumed over its log either, and the run starts afresh in the grid's own chunks."""
    from agents.population import checkpointed_groups

    resumed = {r.run_dir: r for r in runs if r.population is not None and r.resume}
    groups: list[list[GridRun]] = []
    taken: set[Path] = set()
    for out in {r.population.out for r in resumed.values()}:
        for dirs in checkpointed_groups(out):
            members = [resumed.get(d) for d in dirs]
            if all(members) and not taken & set(dirs) and len({shared(m) for m in members}) == 1:
                groups.append(members)
            taken |= set(dirs)
    return groups


def _shared_values(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A dqn grid entry without what a member sets (:data:`MEMBER_KEYS`, under any alias, also as ``set`` items)."""
    from agents.rl.config import ALIASES

    def member(name: str) -> bool:
        return ALIASES.get(name.strip(), name.strip()) in MEMBER_KEYS

    values = {k: v for k, v in entry.items() if v is not None and not member(k)}
    if "set" in values:
        items = [values["set"]] if isinstance(values["set"], str) else list(values["set"])
        values["set"] = [i for i in items if not member(str(i).partition("=")[0])]
    return values


#: seconds an orphaned worker (its grid process died) gives its run to stop cleanly before it exits
ORPHAN_GRACE_S = 10.0


#: in a pool worker: the grid's "stopped" event (set on a stop signal), checked before each task starts
_GRID_STOPPED: Any = None


class _NotStarted(Exception):
    """The grid stopped before a worker began this task: it is left as not started."""


def _init_worker(parent: int, stopped: Any) -> None:
    """Pool worker initializer: ignore stop signals between runs (a worker stopped between runs could hold the
    pool's queue lock and hang the others; the pool ends idle workers with a message on that queue, not a signal),
    and watch the grid process: see :func:`_watch_parent`. The worker starts with stop signals blocked
    (:func:`_spawning`): a Ctrl-C during its start-up is dropped here, not a KeyboardInterrupt in its imports; the
    grid's ``stopped`` event then keeps it from starting a task."""
    global _GRID_STOPPED
    _GRID_STOPPED = stopped
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="watch-grid").start()


def _watch_parent(parent: int, poll_s: float = 0.5) -> None:
    """When the grid process dies (even by SIGKILL) the worker is re-parented: it then sends itself SIGTERM (a
    running run stops cleanly and saves, as on Ctrl-C) and exits after :data:`ORPHAN_GRACE_S` whatever happens, so
    no worker outlives its grid for long or keeps writing into run folders a re-run uses."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(ORPHAN_GRACE_S)
    os._exit(128 + signal.SIGTERM)


def _stop_run(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


#: a run in this process hit a failed write of its run log: HDF5 may then crash when its objects are freed at exit,
#: so the grid process (``--workers 1`` runs in it) leaves with ``os._exit`` once its report is out
_WRITE_FAILED = False


@contextmanager
def _writing(runs: Sequence[GridRun]) -> Iterator[list[dict[str, Any] | None]]:
    """The frame of a task: SIGINT or SIGTERM raise SystemExit(128 + signal) unless the command handles them (RL runs
    stop cleanly, then exit so); plugins loaded, one torch thread; every run folder locked (RunFolderBusy if
    another process, e.g. an earlier grid's worker, still writes there). Yields, per run, the summary in its
    ``DONE.json`` where another process (a second grid on the same folders) finished it with this config since it
    was planned, else None: the caller keeps those and trains the others, whose folders are cleared of
    ``DONE.json`` and ``ERROR.txt`` first; an error's traceback goes to their ``ERROR.txt`` (where the disk takes
    it)."""
    import torch

    with handling(STOP_SIGNALS, _stop_run), ExitStack() as locks:
        if _GRID_STOPPED is not None and _GRID_STOPPED.is_set():  # (checked once a signal would stop the run)
            raise _NotStarted
        load_plugins(runs[0].imports)
        torch.set_num_threads(1)
        for run in runs:
            run.run_dir.mkdir(parents=True, exist_ok=True)
            locks.enter_context(run_lock(run.run_dir))
        # checked under the locks: no one writes there now
        done = [json.loads((r.run_dir / DONE).read_text()).get("summary") if r.status == "done" else None
                for r in runs]
        todo = [r for r, summary in zip(runs, done) if summary is None]
        for run in todo:
            for name in (DONE, ERROR):  # a stale or failed run is redone
                (run.run_dir / name).unlink(missing_ok=True)
        try:
            yield done
        except Exception as err:
            if isinstance(err, RunLogWriteError):  # (HDF5's state, not a file of our own: see _WRITE_FAILED)
                global _WRITE_FAILED
                _WRITE_FAILED = True
            for run in todo:
                with suppress(OSError):  # (a full disk: the error itself goes on, not this one)
                    (run.run_dir / ERROR).write_text(traceback.format_exc())
            raise


def _mark_done(runs: Sequence[GridRun], summaries: Sequence[Mapping[str, Any]]) -> None:
    """Write each finished run's ``DONE.json``. A stop signal meanwhile is recorded (:data:`agents.signals.RECEIVED`:
    an in-process grid stops after this task) but does not cut the writing short: the runs are finished, and are
    reported and marked so (it made a finished run "interrupted", maybe without its DONE.json)."""
    with handling(STOP_SIGNALS, lambda signum, frame: None):
        for run, summary in zip(runs, summaries, strict=True):
            tmp = run.run_dir / (DONE + ".tmp")
            tmp.write_text(json.dumps({"config": run.config, "summary": summary}, indent=1, default=str))
            tmp.replace(run.run_dir / DONE)


def execute(run: GridRun) -> dict[str, Any]:
    """Run one configuration and mark it finished (see :func:`_writing` for signals and errors)."""
    with _writing([run]) as [finished_meanwhile]:
        if finished_meanwhile is not None:
            return finished_meanwhile
        cmd = get_command(run.command)
        summary = cmd.run(run.config, run.run_dir, resume=True) if run.resume else cmd.run(run.config, run.run_dir)
        _mark_done([run], [summary])
    return summary


def execute_population(task: PopulationTask) -> list[dict[str, Any]]:
    """Train a population task's runs as one population and mark each finished; their summaries (of runs another
    grid finished meanwhile, the saved ones: only the others are trained). An error (or a member config other than
    the grid's) fails every member, with the traceback in each trained one's ``ERROR.txt``."""
    import torch

    from agents.population.engine import Member
    from agents.population.run import member_configs, train_population

    with _writing(task.runs) as summaries:
        todo = [r for r, summary in zip(task.runs, summaries) if summary is None]
        if not todo:
            return summaries
        members = [Member(*(r.config[k] for k in MEMBER_KEYS)) for r in todo]
        for run, config in zip(todo, member_configs(task.values, members)):
            if comparable_config(config) != comparable_config(run.config):
                raise ConfigError(f"{run.run_dir}: the population resolves another config for this member than the "
                                  "grid (a bug in the grouping of agents.grid)")
        device = task.runs[0].config["device"]
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        trained = train_population(task.values, members, task.out, device=device, resume=task.resume)
        _mark_done(todo, trained)
        fresh = iter(trained)
        summaries = [next(fresh) if summary is None else summary for summary in summaries]
    return summaries


def run_task(task: Task) -> Any:
    """Execute a task (the function pool workers call): a run's summary, or a population's list of them."""
    return execute_population(task) if isinstance(task, PopulationTask) else execute(task)


def _ray_task(task: Task) -> tuple[str, Any]:
    """:func:`run_task` as a Ray task: ``("done", result)``, or ``("exit", status)`` for SystemExit (a run stopped
    by a signal; ``ray.cancel`` sends SIGINT), which must not leave the worker (Ray would report it crashed)."""
    try:
        return "done", run_task(task)
    except SystemExit as err:
        return "exit", err.code
    except KeyboardInterrupt:
        return "exit", 128 + signal.SIGINT


class _Stop:
    """Whether to start no further runs: after SIGINT / SIGTERM (``signum``, the first one) or a broken pool."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.broken = False
        self.event: Any = None  # a pool's workers' "stopped" event, set with the first signal

    def __bool__(self) -> bool:
        return self.signum is not None or self.broken

    def on_signal(self, signum: int, frame: Any = None) -> None:
        if self.signum is None:
            self.signum = signum
        if self.event is not None:
            self.event.set()


@dataclass(frozen=True)
class Outcome:
    """How one run ended: ``state`` is finished, failed or interrupted; ``detail`` the summary, the error or the
    signal."""

    run: GridRun
    state: str
    detail: Any


@dataclass(frozen=True)
class GridReport:
    outcomes: list[Outcome]
    not_started: int
    stop_signal: int | None  # the signal that stopped the grid (or a run, which stops the grid too)

    def count(self, state: str) -> int:
        return sum(o.state == state for o in self.outcomes)

    @property
    def exit_status(self) -> int:
        if self.stop_signal is not None:
            return 128 + self.stop_signal
        return 1 if self.not_started or any(o.state != "finished" for o in self.outcomes) else 0

    def summary(self) -> str:
        head = (f"grid interrupted by {signal.Signals(self.stop_signal).name}" if self.stop_signal is not None
                else "grid stopped" if self.not_started else "grid done")
        lines = [f"{head}: {self.count('finished')} finished, {self.count('failed')} failed, "
                 f"{self.count('interrupted')} interrupted, {self.not_started} not started"]
        diverged = [o for o in self.outcomes if o.state == "finished" and isinstance(o.detail, dict)
                    and o.detail.get("status") == "nan"]
        if diverged:
            lines += [f"{len(diverged)} of the finished runs diverged (a non-finite loss or network; their logs end "
                      "with run_end = nan):", *(f"  {o.run.run_dir}" for o in diverged)]
        failed = [o for o in self.outcomes if o.state == "failed"]
        if failed:
            lines += ["failed runs:", *(f"  {o.run.run_dir}: {o.detail}" for o in failed)]
        return "\n".join(lines)


def _outcomes(task: Task, call: Callable[[], Any]) -> list[Outcome]:
    """The outcomes of ``task``'s runs from ``call()`` (which runs ``task`` or fetches its result: a run's summary
    or a population's list of them); a population that fails or stops fails or stops every member."""
    runs = _runs(task)
    try:
        result = call()
    except _NotStarted:
        return []
    except KeyboardInterrupt:
        state, detail = "interrupted", signal.SIGINT
    except SystemExit as err:
        if isinstance(err.code, int) and err.code - 128 in STOP_SIGNALS:
            state, detail = "interrupted", signal.Signals(err.code - 128)
        else:
            state, detail = "failed", f"exited with status {err.code}"
    except Exception as err:
        lines = "".join(traceback.format_exception_only(err)).strip().splitlines()
        state, detail = "failed", lines[-1] if lines else type(err).__name__
    else:
        summaries = result if isinstance(task, PopulationTask) else [result]
        return [Outcome(run, "finished", summary) for run, summary in zip(runs, summaries, strict=True)]
    return [Outcome(run, state, detail) for run in runs]


def run_grid(runs: Sequence[GridRun], *, workers: int | None = None, backend: str = "local",
             progress: bool = True) -> GridReport:
    """Execute the runs that are not done as :func:`tasks`, at most ``workers`` at a time (default: one locally, as
    many as the cluster has CPUs on Ray); a failed task does not stop the others. Progress and the report count
    runs.

    After SIGINT or SIGTERM, or a run interrupted by one, no further tasks start; the running ones are waited for
    (Ray: cancelled, which stops them as the signal would).
    """
    todo = [r for r in runs if r.status != "done"]
    if backend not in ("local", "ray"):
        raise ConfigError(f"unknown backend {backend!r}; choose local or ray")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    work = tasks(todo)
    stop = _Stop()
    outcomes: list[Outcome] = []
    bar = tqdm(total=len(todo), desc="runs", disable=not progress)
    began = time.time() - 1.0  # (a file system's coarse timestamps)

    def record(outcome: Outcome) -> None:
        outcomes.append(outcome)
        bar.update()
        if outcome.state == "interrupted":
            stop.on_signal(outcome.detail)
        elif outcome.state == "failed":
            where = outcome.run.run_dir / ERROR  # (only this grid's: a busy folder keeps an older failure's)
            try:
                fresh = where.stat().st_mtime >= began
            except OSError:  # (none, or another grid on the same folders removed it just now)
                fresh = False
            bar.write(f"run failed: {outcome.run.run_dir}: {outcome.detail}"
                      + (f" (traceback in {where})" if fresh else ""), file=sys.stderr)

    def inline(running: dict[Hashable, Task]) -> list[Outcome]:
        _, task = running.popitem()
        seen = len(RECEIVED)
        outcomes = _outcomes(task, lambda: run_task(task))
        if len(RECEIVED) > seen:  # a stop signal the run took while it finished: the grid stops all the same
            stop.on_signal(RECEIVED[seen])
        if _WRITE_FAILED:  # HDF5 in this process may be left unusable by the failed file: start no more runs here
            stop.broken = True
            bar.write("a run could not write its files (full or failing disk?): no further runs start; re-run the "
                      "grid when there is space", file=sys.stderr)
        return outcomes

    with handling(STOP_SIGNALS, stop.on_signal):
        if backend == "ray":
            _run_ray(work, workers, stop, record, began)
        elif (workers or 1) == 1:
            _drive(work, 1, lambda task: _runs(task)[0].run_dir, inline, stop, record)
        else:
            _run_pool(work, int(workers), stop, record)
    bar.close()
    return GridReport(outcomes, len(todo) - len(outcomes), stop.signum)


def _drive(work: Sequence[Task], slots: int, start: Callable[[Task], Hashable],
           wait_some: Callable[[dict[Hashable, Task]], list[Outcome]], stop: _Stop,
           record: Callable[[Outcome], None]) -> None:
    """Keep up to ``slots`` tasks going until all ended, or ``stop`` is true and the running ones ended.

    ``start`` starts a task and gives its handle; ``wait_some`` waits for some to end, removes their handles and
    gives their runs' outcomes.
    """
    queue = deque(work)
    running: dict[Hashable, Task] = {}
    while queue or running:
        while queue and len(running) < slots and not stop:
            task = queue.popleft()
            running[start(task)] = task
        if not running:
            return
        for outcome in wait_some(running):
            record(outcome)


#: a run's outcome when a worker of the pool died (killed, out of memory): the pool then stops the runs in its other
#: workers too (SIGTERM: they stop cleanly, checkpointed), and which of them died it does not say
POOL_BROKEN = ("a worker of the pool died (killed, or out of memory), and the pool stopped the runs in its other "
               "workers with it; --resume continues each from its last checkpoint")


def _run_pool(work: Sequence[Task], workers: int, stop: _Stop, record: Callable[[Outcome], None]) -> None:
    stop.event = get_context("spawn").Event()
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                             initializer=_init_worker, initargs=(os.getpid(), stop.event)) as pool:
        def wait_some(running: dict[Hashable, Task]) -> list[Outcome]:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            outcomes = []
            for f in done:
                task = running.pop(f)
                if isinstance(f.exception(), BrokenProcessPool):  # the pool takes no more runs
                    stop.broken = True
                    outcomes += [Outcome(run, "failed", POOL_BROKEN) for run in _runs(task)]
                else:
                    outcomes += _outcomes(task, f.result)
            return outcomes

        def start(task: Task) -> Future:
            with _spawning():
                return pool.submit(run_task, task)

        _drive(work, workers, start, wait_some, stop, record)


@contextmanager
def _spawning() -> Iterator[None]:
    """Stop signals blocked in this thread while it may spawn pool workers, which inherit the mask and unblock in
    :func:`_init_worker` once they ignore them (a signal meanwhile stays pending here and arrives after)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class WorkerLost(RuntimeError):
    """The Ray worker (or node) running a task died: killed, out of memory, or its node lost."""


def _run_ray(work: Sequence[Task], workers: int | None, stop: _Stop, record: Callable[[Outcome], None],
             began: float) -> None:
    """Run the tasks on the Ray cluster at ``RAY_ADDRESS`` (else a local one started here), ``workers`` at a time
    (default: as many as it has CPUs), one CPU each and never retried. A stop signal cancels the running tasks
    (SIGINT in their workers: they stop as on Ctrl-C); a cancelled task that took no run lock since ``began`` (the
    grid's start) never began."""
    try:
        import ray
    except ImportError:
        raise ConfigError("the ray backend needs Ray: pip install -e '.[ray]'") from None
    cuda = [t for t in work for r in (t.runs if isinstance(t, PopulationTask) else (t,))
            if str(r.config.get("device", "cpu")).startswith("cuda")]
    if cuda:  # its tasks ask for CPUs only, and Ray hides the GPUs from such tasks
        raise ConfigError(f"the ray backend runs tasks on CPUs; {len(cuda)} of this grid's runs ask for device "
                          "cuda: run them with --backend local, or set device: cpu")
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    address = os.environ.get("RAY_ADDRESS") or None
    owned = not ray.is_initialized()
    if owned:
        if address:
            _check_reachable(address)
        try:
            if address:
                ray.init(address=address, logging_level=logging.WARNING)
            else:
                ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
        except ConnectionError as err:
            token = "InvalidAuthToken" in "".join(traceback.format_exception(err))
            hint = "; the cluster uses token authentication: set RAY_AUTH_MODE=token, with its token in " \
                   "~/.ray/auth_token or RAY_AUTH_TOKEN" if token else ""
            raise ConfigError(f"cannot connect to the Ray cluster at RAY_ADDRESS={address}: {err}{hint}") from None
    try:
        with handling(STOP_SIGNALS, stop.on_signal):  # again: ray.init sets its own SIGTERM handler
            cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
            slots = workers or cpus
            started = " (started here)" if owned and not address else ""
            limit = f", {slots} task{'s' * (slots > 1)} at a time (--workers)" if workers else ""
            tqdm.write(f"ray: the cluster at {ray.get_runtime_context().gcs_address}{started}, {cpus} CPUs{limit}",
                       file=sys.stderr)
            # max_calls=1: a fresh worker process per task. A task cancelled in the middle of an import (ray.cancel
            # raises KeyboardInterrupt wherever the task is) leaves half-initialised modules in its process, and a
            # reused worker would fail every later task there (e.g. torch's lazy import of sympy).
            remote = ray.remote(num_cpus=1, max_retries=0, max_calls=1)(_ray_task)
            cancelled: set[Hashable] = set()
            def ended(ref: Hashable, task: Task) -> list[Outcome]:
                return _outcomes(task, lambda: _ray_result(ref, lambda: _locked_since(task, began)))

            def wait_some(running: dict[Hashable, Task]) -> list[Outcome]:
                while True:
                    if stop.signum is not None:
                        # the latest first: those still waiting for a CPU, which a cancelled task's CPU would start
                        for ref in [r for r in reversed(running) if r not in cancelled]:
                            ray.cancel(ref)
                            cancelled.add(ref)
                    done, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
                    if done:
                        return [o for ref in done for o in ended(ref, running.pop(ref))]

            _drive(work, slots, remote.remote, wait_some, stop, record)
    finally:
        if owned:
            ray.shutdown()


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """ConfigError unless ``address`` (HOST:PORT; other forms are left to Ray) takes a TCP connection: Ray itself
    retries an unreachable address for minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ConfigError(f"cannot reach the Ray cluster at RAY_ADDRESS={address} ({err.strerror or err}); start it "
                          "with ray start --head, or unset RAY_ADDRESS for a local cluster") from None


def _locked_since(task: Task, t: float) -> bool:
    """Whether a worker took one of ``task``'s run locks since ``t`` (the task began: it writes the lock first)."""
    for run in _runs(task):
        try:
            if (run.run_dir / LOCK_NAME).stat().st_mtime >= t:
                return True
        except OSError:
            continue
    return False


def _ray_result(ref: Any, started: Callable[[], bool]) -> Any:
    """A Ray task's result, or what it raised: the task's own exception; SystemExit for a run a signal stopped;
    for a cancelled task (Ray does not say whether it had started), KeyboardInterrupt if ``started()``, else
    :class:`_NotStarted`; :class:`WorkerLost` when its worker or node died."""
    import ray
    from ray.exceptions import RayError, RayTaskError, TaskCancelledError

    try:
        kind, value = ray.get(ref)
    except RayTaskError as err:
        raise (err.cause if isinstance(err.cause, BaseException) else err) from None
    except TaskCancelledError:
        raise (KeyboardInterrupt if started() else _NotStarted) from None
    except RayError as err:
        raise WorkerLost(f"the Ray worker running it died ({type(err).__name__}: {' '.join(str(err).split())}); "
                         "re-run the grid with --resume to continue it from its last checkpoint") from None
    if kind == "exit":
        raise SystemExit(value)
    return value


def _dry_run(runs: Sequence[GridRun]) -> int:
    try:
        for r in runs:
            print(f"{r.status}  {r.run_dir}")
        sys.stdout.flush()
    except BrokenPipeError:  # the reader stopped early (--dry-run | head)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes at exit
        return 141  # as a program killed by SIGPIPE
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.grid", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid", type=Path, help="YAML grid file")
    parser.add_argument("--out", type=Path, required=True, help="root folder of the run directories")
    parser.add_argument("--workers", type=int, default=None,
                        help="tasks (runs or populations) at a time: local processes (default 1), or Ray tasks "
                             "(default: as many as the cluster has CPUs)")
    parser.add_argument("--backend", choices=["local", "ray"], default="local")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="plugin module to import first, here and in every worker (repeatable; or the grid "
                             "file's import: list)")
    parser.add_argument("--resume", action="store_true",
                        help="continue unfinished runs from their checkpoints (commands that checkpoint: dqn, ppo, "
                             "sac) instead of redoing them; stale runs are redone")
    parser.add_argument("--dry-run", action="store_true", help="list the runs: done, stale (finished or begun "
                                                                "with another config) or todo")
    parser.add_argument("--axis", action="append", default=[], metavar="KEY=VALUES",
                        help="give KEY these values in every sub-grid, replacing the file's (repeatable; VALUES "
                             "comma-separated, A-B an integer range): --axis seed=0-9 --axis lr=1e-3,3e-4")
    args = parser.parse_args(argv)
    try:
        spec = load_grid(args.grid)
        if args.axis:
            bad = [a for a in args.axis if not a.partition("=")[0].strip() or not a.partition("=")[2].strip()]
            if bad:
                raise ConfigError(f"--axis takes KEY=VALUES (e.g. seed=0-9 or lr=1e-3,3e-4), got {bad[0]!r}")
            spec = with_axes(spec, {a.partition("=")[0].strip(): axis_values(a.partition("=")[2])
                                    for a in args.axis})
        runs = plan(spec, args.out, args.imports)
        if args.resume:
            if runs and not getattr(get_command(runs[0].command), "resumable", False):
                raise ConfigError(f"{runs[0].command} writes no checkpoints; --resume is for "
                                  f"{', '.join(n for n in commands() if getattr(get_command(n), 'resumable', False))}")
            runs = [replace(r, resume=True) if r.status == "todo" else r for r in runs]
        if args.dry_run:
            return _dry_run(runs)
        status = Counter(r.status for r in runs)
        stale = f", {status['stale']} stale (finished or begun with another config: redone)" \
            if status["stale"] else ""
        populations = [t for t in tasks([r for r in runs if r.population and r.status != "done"])
                       if isinstance(t, PopulationTask)]
        trained = f"; {sum(len(t.runs) for t in populations)} to train in {len(populations)} population" \
            f"{'s' * (len(populations) > 1)}" if populations else ""
        print(f"{len(runs)} runs, {status['done']} already finished{stale}{trained}", file=sys.stderr)
        report = run_grid(runs, workers=args.workers, backend=args.backend)
    except ConfigError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    except KeyboardInterrupt:  # Ctrl-C before any run started
        print("grid interrupted before any run started", file=sys.stderr)
        return 130
    print(report.summary(), file=sys.stderr)
    if _WRITE_FAILED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(report.exit_status)
    return report.exit_status


if __name__ == "__main__":
    # the importable module's main: Ray and the pool then pickle its tasks and functions by reference, not __main__'s
    from agents.grid import main as _main

    sys.exit(_main())
