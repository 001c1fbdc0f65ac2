"""The command line: ``python -m agents.grid GRID.yml --out DIR ...`` (the options are in :mod:`agents.grid`)."""

from __future__ import annotations

import argparse
import heapq
import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..commands import commands, get_command, population
from ..errors import ConfigError
from . import worker  # (its _WRITE_FAILED, read once the report is out)
from .planning import GridRun, PopulationTask, plan, tasks
from .run import run_grid
from .spec import axis_values, load_grid, with_axes


def _dry_run(runs: Sequence[GridRun]) -> int:
    try:
        for r in runs:
            print(f"{r.status}  {r.run_dir}")
        sys.stdout.flush()
    except BrokenPipeError:  # the reader stopped early (--dry-run | head)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes at exit
        return 141  # as a program killed by SIGPIPE
    return 0


def _population_plan(populations: Sequence[PopulationTask], workers: int | None = None) -> str:
    """One line: the populations' sizes, their agent-steps, the largest one's memory and, for grids of at least
    :data:`ESTIMATE_FROM` agent-steps, the estimated time (each population's step timed here; their engine's
    estimates)."""
    sizes = sorted(len(t.runs) for t in populations)
    steps = sum(int(r.config.get("n_timesteps", 0)) for t in populations for r in t.runs)
    largest = max(populations, key=lambda t: len(t.runs))
    engine = population(get_command(largest.runs[0].command))
    about = engine.describe([r.config for r in largest.runs]) if hasattr(engine, "describe") else ""
    span = f"{sizes[0]}" if sizes[0] == sizes[-1] else f"{sizes[0]}-{sizes[-1]}"
    line = (f"plan: {len(populations)} population{'s' * (len(populations) > 1)} of {span} members, {steps:,} "
            f"agent-steps" + (f"; the largest ~{about}" if about else ""))
    if steps >= ESTIMATE_FROM:
        line += _estimate(populations, workers)
    return line


#: agent-steps from which a grid's plan times its populations' steps to estimate its duration
ESTIMATE_FROM = 10_000_000


def _estimate(populations: Sequence[PopulationTask], workers: int | None) -> str:
    seconds = []
    for t in populations:
        engine = population(get_command(t.runs[0].command))
        s = engine.seconds([r.config for r in t.runs]) if hasattr(engine, "seconds") else None
        if s is None:
            return "; no time estimate (its device is not on this machine)"
        seconds.append(s)
    at_once = ""
    if workers and workers > 1:  # the grid's order, each population to the first free worker
        free = [0.0] * workers
        for s in seconds:
            heapq.heapreplace(free, free[0] + s)
        at_once = f", {max(free) / 3600:.1f} h with {workers} at a time on separate cores or GPUs"
    return f"; ~{sum(seconds) / 3600:.1f} h one population at a time{at_once} (steps timed here, compiles not counted)"


def main(argv: list[str] | None = None) -> int:
    from agents import grid  # (imported here: the package imports this module)

    parser = argparse.ArgumentParser(prog="python -m agents.grid", description=grid.__doc__,
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
                                                                "with another config) or todo; then, for populations, "
                                                                "the plan (on stderr)")
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
        at_once = (args.workers or 1) if args.backend == "local" else 1
        populations = [t for t in tasks([r for r in runs if r.population and r.status != "done"], at_once)
                       if isinstance(t, PopulationTask)]
        if args.dry_run:
            status = _dry_run(runs)
            if populations and status == 0:
                print(_population_plan(populations, args.workers), file=sys.stderr)
            return status
        status = Counter(r.status for r in runs)
        stale = f", {status['stale']} stale (finished or begun with another config: redone)" \
            if status["stale"] else ""
        trained = f"; {sum(len(t.runs) for t in populations)} to train in {len(populations)} population" \
            f"{'s' * (len(populations) > 1)}" if populations else ""
        print(f"{len(runs)} runs, {status['done']} already finished{stale}{trained}", file=sys.stderr)
        if populations:
            print(_population_plan(populations, args.workers), file=sys.stderr)
        report = run_grid(runs, workers=args.workers, backend=args.backend)
    except ConfigError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    except KeyboardInterrupt:  # Ctrl-C before any run started
        print("grid interrupted before any run started", file=sys.stderr)
        return 130
    print(report.summary(), file=sys.stderr)
    if worker._WRITE_FAILED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(report.exit_status)
    return report.exit_status
