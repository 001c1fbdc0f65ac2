"""Run a grid of configurations: expand it, skip finished runs, execute the rest in parallel.

    python -m agents.grid GRID.yml --out DIR [--workers N] [--backend local|ray] [--dry-run]

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
how a run reports and saves (:data:`agents.commands.OUTPUT_KEYS`); a finished run with another config is stale and is redone. An
interrupted grid re-run skips finished runs and redoes the rest; with ``--resume`` it continues unfinished runs of
commands that checkpoint (dqn, ppo, sac) from their last checkpoint, exactly as if they had not stopped.

Ctrl-C starts no more runs; the running ones get the signal too (they share the terminal's process group) and
stop cleanly; the grid then prints what finished, was interrupted or was not started and exits with status 130.
SIGTERM does the same (exit status 143). With ``--workers`` 2 or more, a signal sent to the grid process alone
(``kill -INT PID``) lets the running runs finish. A run that fails is reported (its traceback goes to
``ERROR.txt`` in its run directory) and the others go on; the grid then exits with status 1.

The local backend is a process pool with one torch thread per worker; ``--backend ray`` submits the same function
to a Ray cluster (``pip install -e .[ray]``; connect with ``RAY_ADDRESS``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm

from probes.plugins import PluginError, load_plugins
from probes.runlog import RunLogWriteError

from .commands import OUTPUT_KEYS, ConfigError, RunWriteError, commands, get_command, read_yaml
from .runlock import run_lock
from .signals import STOP_SIGNALS, handling

__all__ = ["GridRun", "Outcome", "GridReport", "expand", "load_grid", "plan", "run_grid", "main"]

DONE = "DONE.json"
ERROR = "ERROR.txt"
#: config keys that do not change a run's results: a change in them does not make a finished run stale
IGNORED_KEYS = OUTPUT_KEYS


@dataclass(frozen=True)
class GridRun:
    command: str
    config: dict[str, Any]
    run_dir: Path
    imports: tuple[str, ...] = ()  # plugin modules the worker imports first
    resume: bool = False  # continue from the run folder's checkpoint (a resumable command's unfinished run)

    @property
    def status(self) -> str:
        """``done`` (finished with this config), ``stale`` (finished with another config) or ``todo``."""
        if not (self.run_dir / DONE).exists():
            return "todo"
        return "done" if _comparable(saved_config(self.run_dir)) == _comparable(self.config) else "stale"


def saved_config(run_dir: Path) -> Any:
    """The config a run directory's files come from: its ``config.yaml``, else the one in ``DONE.json``."""
    try:
        if (run_dir / "config.yaml").exists():
            return yaml.safe_load((run_dir / "config.yaml").read_text())
        return json.loads((run_dir / DONE).read_text()).get("config")
    except (OSError, ValueError, yaml.YAMLError):
        return None  # unreadable: counts as another config


def _comparable(config: Any) -> Any:
    """``config`` as it reads back from JSON (tuples become lists), without :data:`IGNORED_KEYS`."""
    plain = json.loads(json.dumps(config, default=str))
    return {k: v for k, v in plain.items() if k not in IGNORED_KEYS} if isinstance(plain, dict) else plain


def expand(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """All configurations of a grid spec (``fixed`` merged into the cross product of each sub-grid's lists)."""
    if not isinstance(spec, Mapping) or "command" not in spec:
        raise ConfigError("a grid needs a 'command' (e.g. command: stream-sin) and 'grids' (a list of mappings)")
    unknown = set(spec) - {"command", "fixed", "grids", "import"}
    if unknown:
        raise ConfigError(f"unknown grid keys {sorted(unknown)}; allowed: command, fixed, grids, import")
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
        runs.append(GridRun(cmd.name, config, run_dir, modules))
    return runs


#: seconds an orphaned worker (its grid process died) gives its run to stop cleanly before it exits
ORPHAN_GRACE_S = 10.0


def _init_worker(parent: int) -> None:
    """Pool worker initializer: ignore stop signals between runs (a worker stopped between runs could hold the
    pool's queue lock and hang the others; the pool ends idle workers with a message on that queue, not a signal),
    and watch the grid process: see :func:`_watch_parent`."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
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


#: a run in this process hit a failed write: HDF5 may then crash when its objects are freed at exit, so the grid
#: process (``--workers 1`` runs in it) leaves with ``os._exit`` once its report is out
_WRITE_FAILED = False


def execute(run: GridRun) -> dict[str, Any]:
    """Run one configuration and mark it finished (the function workers and Ray tasks call).

    SIGINT or SIGTERM raises SystemExit(128 + signal) unless the command handles it (RL runs stop cleanly, then
    exit so); an error's traceback is written to the run directory's ``ERROR.txt``.
    """
    import torch

    with handling(STOP_SIGNALS, _stop_run):
        load_plugins(run.imports)
        torch.set_num_threads(1)
        run.run_dir.mkdir(parents=True, exist_ok=True)
        with run_lock(run.run_dir):  # RunFolderBusy if another process (an earlier grid's worker) still writes here
            for name in (DONE, ERROR):  # a stale or failed run is redone
                (run.run_dir / name).unlink(missing_ok=True)
            try:
                cmd = get_command(run.command)
                summary = cmd.run(run.config, run.run_dir, resume=True) if run.resume else \
                    cmd.run(run.config, run.run_dir)
            except Exception as err:
                (run.run_dir / ERROR).write_text(traceback.format_exc())
                if isinstance(err, (RunLogWriteError, RunWriteError)):
                    global _WRITE_FAILED
                    _WRITE_FAILED = True
                raise
            tmp = run.run_dir / (DONE + ".tmp")
            tmp.write_text(json.dumps({"config": run.config, "summary": summary}, indent=1, default=str))
            tmp.replace(run.run_dir / DONE)
    return summary


class _Stop:
    """Whether to start no further runs: after SIGINT / SIGTERM (``signum``, the first one) or a broken pool."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.broken = False

    def __bool__(self) -> bool:
        return self.signum is not None or self.broken

    def on_signal(self, signum: int, frame: Any = None) -> None:
        if self.signum is None:
            self.signum = signum


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


def _outcome(run: GridRun, call: Callable[[], dict[str, Any]]) -> Outcome:
    """The outcome of ``call()`` (which runs ``run`` or fetches its result)."""
    try:
        return Outcome(run, "finished", call())
    except KeyboardInterrupt:
        return Outcome(run, "interrupted", signal.SIGINT)
    except SystemExit as err:
        if isinstance(err.code, int) and err.code - 128 in STOP_SIGNALS:
            return Outcome(run, "interrupted", signal.Signals(err.code - 128))
        return Outcome(run, "failed", f"exited with status {err.code}")
    except Exception as err:
        lines = "".join(traceback.format_exception_only(err)).strip().splitlines()
        return Outcome(run, "failed", lines[-1] if lines else type(err).__name__)


def run_grid(runs: Sequence[GridRun], *, workers: int = 1, backend: str = "local",
             progress: bool = True) -> GridReport:
    """Execute the runs that are not done, at most ``workers`` at a time; a failed run does not stop the others.

    After SIGINT or SIGTERM, or a run interrupted by one, no further runs start; the running ones are waited for.
    """
    todo = [r for r in runs if r.status != "done"]
    if backend not in ("local", "ray"):
        raise ConfigError(f"unknown backend {backend!r}; choose local or ray")
    stop = _Stop()
    outcomes: list[Outcome] = []
    bar = tqdm(total=len(todo), desc="runs", disable=not progress)

    def record(outcome: Outcome) -> None:
        outcomes.append(outcome)
        bar.update()
        if outcome.state == "interrupted":
            stop.on_signal(outcome.detail)
        elif outcome.state == "failed":
            where = outcome.run.run_dir / ERROR
            bar.write(f"run failed: {outcome.run.run_dir}: {outcome.detail}"
                      + (f" (traceback in {where})" if where.exists() else ""), file=sys.stderr)

    def inline(running: dict[Hashable, GridRun]) -> list[Outcome]:
        _, run = running.popitem()
        outcome = _outcome(run, lambda: execute(run))
        if _WRITE_FAILED:  # HDF5 in this process may be left unusable by the failed file: start no more runs here
            stop.broken = True
            bar.write("a run could not write its files (full or failing disk?): no further runs start; re-run the "
                      "grid when there is space", file=sys.stderr)
        return [outcome]

    with handling(STOP_SIGNALS, stop.on_signal):
        if backend == "ray":
            _run_ray(todo, stop, record)
        elif workers <= 1:
            _drive(todo, 1, lambda run: run.run_dir, inline, stop, record)
        else:
            _run_pool(todo, workers, stop, record)
    bar.close()
    return GridReport(outcomes, len(todo) - len(outcomes), stop.signum)


def _drive(todo: Sequence[GridRun], slots: int, start: Callable[[GridRun], Hashable],
           wait_some: Callable[[dict[Hashable, GridRun]], list[Outcome]], stop: _Stop,
           record: Callable[[Outcome], None]) -> None:
    """Keep up to ``slots`` runs going until all ended, or ``stop`` is true and the running ones ended.

    ``start`` starts a run and gives its handle; ``wait_some`` waits for some to end, removes their handles and
    gives their outcomes.
    """
    queue = deque(todo)
    running: dict[Hashable, GridRun] = {}
    while queue or running:
        while queue and len(running) < slots and not stop:
            run = queue.popleft()
            running[start(run)] = run
        if not running:
            return
        for outcome in wait_some(running):
            record(outcome)


def _run_pool(todo: Sequence[GridRun], workers: int, stop: _Stop, record: Callable[[Outcome], None]) -> None:
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"),
                             initializer=_init_worker, initargs=(os.getpid(),)) as pool:
        def wait_some(running: dict[Hashable, GridRun]) -> list[Outcome]:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            outcomes = [_outcome(running.pop(f), f.result) for f in done]
            if any(isinstance(f.exception(), BrokenProcessPool) for f in done):
                stop.broken = True  # a worker died (out of memory?): the pool takes no more runs
            return outcomes

        _drive(todo, workers, lambda run: pool.submit(execute, run), wait_some, stop, record)


def _run_ray(todo: Sequence[GridRun], stop: _Stop, record: Callable[[Outcome], None]) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError("the ray backend needs Ray: pip install -e '.[ray]'") from None
    ray.init(ignore_reinit_error=True)
    task = ray.remote(num_cpus=1)(execute)

    def wait_some(running: dict[Hashable, GridRun]) -> list[Outcome]:
        done, _ = ray.wait(list(running), num_returns=1)
        return [_outcome(running.pop(ref), lambda: ray.get(ref)) for ref in done]

    _drive(todo, max(1, int(ray.cluster_resources().get("CPU", 1))), task.remote, wait_some, stop, record)


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
    parser.add_argument("--workers", type=int, default=1, help="parallel local processes")
    parser.add_argument("--backend", choices=["local", "ray"], default="local")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="plugin module to import first, here and in every worker (repeatable; or the grid "
                             "file's import: list)")
    parser.add_argument("--resume", action="store_true",
                        help="continue unfinished runs from their checkpoints (commands that checkpoint: dqn, ppo, "
                             "sac) instead of redoing them; stale runs are redone")
    parser.add_argument("--dry-run", action="store_true", help="list the runs: done, stale (finished with another "
                                                                "config) or todo")
    args = parser.parse_args(argv)
    try:
        runs = plan(load_grid(args.grid), args.out, args.imports)
        if args.resume:
            if runs and not getattr(get_command(runs[0].command), "resumable", False):
                raise ConfigError(f"{runs[0].command} writes no checkpoints; --resume is for "
                                  f"{', '.join(n for n in commands() if getattr(get_command(n), 'resumable', False))}")
            runs = [replace(r, resume=True) if r.status == "todo" else r for r in runs]
        if args.dry_run:
            return _dry_run(runs)
        status = Counter(r.status for r in runs)
        stale = f", {status['stale']} stale (finished with another config: redone)" if status["stale"] else ""
        print(f"{len(runs)} runs, {status['done']} already finished{stale}", file=sys.stderr)
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
    sys.exit(main())
