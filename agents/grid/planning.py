"""A grid's runs and tasks: each configuration validated and placed in its run directory, whether it is done, stale or
to do, and the unfinished runs grouped as tasks (a run, or a population of runs for ``engine: population``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from probes.plugins import PluginError, load_plugins

from ..commands import commands, get_command, population
from ..errors import ConfigError
from ..lifecycle import DONE
from ..runfolder import comparable_config
from .spec import expand


@dataclass(frozen=True)
class PopulationEngine:
    """A grid's ``engine: population``: its runs train as members of populations (at most ``size`` members each;
    None: no limit; the command's :class:`agents.commands.Population` says which runs may share one: its ``group``)
    whose run folders lie under ``out``, the grid's root folder."""

    out: Path
    size: int | None = None
    by_memory: bool = False  # population_size: auto: as many members as the engine's capacity on the device


@dataclass(frozen=True)
class GridRun:
    command: str
    config: dict[str, Any]
    run_dir: Path
    imports: tuple[str, ...] = ()  # plugin modules the worker imports first
    resume: bool = False  # continue from the run folder's checkpoint (a resumable command's unfinished run)
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
        runs.append(GridRun(cmd.name, config, run_dir, modules, population=population))
    return runs


def _population_engine(spec: Mapping[str, Any], command: str, out: Path) -> PopulationEngine | None:
    """The grid's ``engine`` and ``population_size``, checked."""
    engine, size = spec.get("engine"), spec.get("population_size")
    if engine is None:
        if size is not None:
            raise ConfigError("population_size is for grids with engine: population")
        return None
    if engine != "population":
        raise ConfigError(f"unknown engine {engine!r}: engine: population trains runs as populations; leave "
                          "engine out to train each run in a process of its own")
    members = population(get_command(command))
    if members is None:
        having = [name for name in commands() if population(get_command(name)) is not None]
        raise ConfigError(f"engine: population trains runs of {', '.join(having)} only, not {command}; leave engine "
                          f"out for {command}")
    if size == "auto":
        return PopulationEngine(out, None, by_memory=True)
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise ConfigError(f"population_size must be a positive integer (the most members per population) or auto "
                          f"(as many as the device holds), got {size!r}")
    return PopulationEngine(out, size)


@dataclass(frozen=True)
class PopulationTask:
    """Unfinished runs of an ``engine: population`` grid trained as one population: runs their population engine
    groups together (:meth:`agents.commands.Population.group`)."""

    runs: tuple[GridRun, ...]
    out: Path

    @property
    def resume(self) -> bool:
        """Continue the population's checkpoint (every member is an unfinished run the grid resumes)."""
        return all(r.resume for r in self.runs)


#: what a worker executes: a run, or a population of runs
Task = GridRun | PopulationTask


def _runs(task: Task) -> tuple[GridRun, ...]:
    return task.runs if isinstance(task, PopulationTask) else (task,)


def tasks(runs: Sequence[GridRun], at_once: int = 1) -> list[Task]:
    """``runs`` as tasks, in order: the runs of an ``engine: population`` grid that their engine groups together
    (:meth:`agents.commands.Population.group`) form population tasks (as few as hold them: of at most
    ``population_size`` members, or for ``auto`` as many as the engine's capacity on the device allows with
    ``at_once`` populations sharing the machine, a local pool's workers; their sizes differing by at most one), any
    other run is a task.
    Resumed runs that a population checkpoint holds come first, grouped as it holds them (whatever the grid's chunks
    are now): a checkpoint all of whose members are still to do is resumed, not orphaned."""

    def shared(run: GridRun) -> str:
        if run.population is None:
            return json.dumps(run.config, sort_keys=True, default=str)
        return population(get_command(run.command)).group(run.config)

    out: list[GridRun | list[GridRun]] = _checkpointed(runs, shared)
    claimed = {r.run_dir for group in out for r in group}
    kinds: dict[str, list[GridRun]] = {}
    for run in runs:
        if run.run_dir in claimed:
            continue
        if run.population is None:
            out.append(run)
            continue
        kind = kinds.get(shared(run))
        if kind is None:
            kind = kinds[shared(run)] = []
            out.append(kind)  # (split below, in place)
        kind.append(run)
    split = {id(k) for k in kinds.values()}  # (a checkpoint's group stays as it is)
    return [task for t in out for task in
            ([t] if isinstance(t, GridRun) else
             [PopulationTask(tuple(c), t[0].population.out)
              for c in (_chunks(t, at_once) if id(t) in split else [t])])]


def _chunks(kind: Sequence[GridRun], at_once: int = 1) -> list[Sequence[GridRun]]:
    """Runs of one kind (one group of their engine) split into as few populations as their limit
    allows (``population_size``, or for ``auto`` the engine's :meth:`~agents.commands.Population.capacity`), their
    sizes differing by at most one (a compiled step compiles for two shapes at most)."""
    engine = kind[0].population
    limit = engine.size
    if engine.by_memory:
        limit = population(get_command(kind[0].command)).capacity([r.config for r in kind], at_once)
    if limit is None or len(kind) <= limit:
        return [kind]
    n = -(-len(kind) // max(1, limit))
    size, extra = divmod(len(kind), n)
    bounds = [i * size + min(i, extra) for i in range(n + 1)]
    return [kind[a:b] for a, b in zip(bounds, bounds[1:])]


def _checkpointed(runs: Sequence[GridRun], shared: Callable[[GridRun], str]) -> list[list[GridRun]]:
    """The populations of resumed runs that have a checkpoint (:meth:`agents.commands.Population.checkpointed`), as
    their checkpoints hold them: every member among ``runs``, resumed, sharing the rest of the config, in the
    checkpoint's order (which makes its key), even beyond ``population_size``. A run belongs to the newest checkpoint
    that lists it: where that one cannot be resumed (another member finished or left the grid), no older one is
    resumed over its log either, and the run starts afresh in the grid's own chunks."""
    resumed = {r.run_dir: r for r in runs if r.population is not None and r.resume}
    groups: list[list[GridRun]] = []
    taken: set[Path] = set()
    for command, out in {(r.command, r.population.out) for r in resumed.values()}:
        for dirs in population(get_command(command)).checkpointed(out):
            members = [resumed.get(d) for d in dirs]
            if all(members) and not taken & set(dirs) and len({shared(m) for m in members}) == 1:
                groups.append(members)
            taken |= set(dirs)
    return groups

