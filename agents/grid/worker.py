"""What runs inside a worker: a task (a run, or a population) in its locked run folders, marked done when it
finishes, with stop signals, the pool worker's set-up and the watch on the grid process."""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from typing import Any

from probes.plugins import load_plugins
from runlog import RunLogWriteError

from ..commands import get_command, population
from ..lifecycle import DONE, ERROR, RunFolder, open_runs, read_done, stopped
from ..signals import STOP_SIGNALS, handling
from .planning import GridRun, PopulationTask, Task


#: an orphaned worker (its grid process died) exits within this many seconds of its grid's death, its run stopped
#: cleanly meanwhile where it can
ORPHAN_EXIT_S = 10.0


#: in a pool worker: the grid's "stopped" event (set on a stop signal), checked before each task starts
_GRID_STOPPED: Any = None


class _NotStarted(Exception):
    """The grid stopped before a worker began this task: it is left as not started."""


def _init_worker(parent: int, stopped: Any, started: Any = None) -> None:
    """Pool worker initializer: ignore stop signals between runs (a worker stopped between runs could hold the
    pool's queue lock and hang the others; the pool ends idle workers with a message on that queue, not a signal),
    and watch the grid process: see :func:`_watch_parent`. The worker starts with stop signals blocked
    (:func:`agents.grid.local._spawning`): a Ctrl-C during its start-up is dropped here, not a KeyboardInterrupt in
    its imports; the grid's ``stopped`` event then keeps it from starting a task. Last it releases ``started``: the
    grid waits for every worker's start before it may shut the pool down."""
    global _GRID_STOPPED
    _GRID_STOPPED = stopped
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="watch-grid").start()
    if started is not None:
        started.release()


def _watch_parent(parent: int, poll_s: float = 0.5) -> None:
    """When the grid process dies (even by SIGKILL) the worker is re-parented: it then sends itself SIGTERM (a
    running run stops cleanly and saves, as on Ctrl-C) and exits whatever happens within :data:`ORPHAN_EXIT_S` of
    the grid's death (which it notices within ``poll_s``), so no worker outlives its grid for long or keeps writing
    into run folders a re-run uses."""
    while os.getppid() == parent:
        time.sleep(poll_s)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(ORPHAN_EXIT_S - poll_s - 0.5)  # (half a second left for the exit itself)
    os._exit(128 + signal.SIGTERM)


#: a run in this process hit a failed write of its run log: HDF5 may then crash when its objects are freed at exit,
#: so the grid process (``--workers 1`` runs in it) leaves with ``os._exit`` once its report is out
_WRITE_FAILED = False


@contextmanager
def _writing(runs: Sequence[GridRun]) -> Iterator[tuple[list[dict[str, Any] | None], list[RunFolder]]]:
    """The frame of a task: SIGINT or SIGTERM raise SystemExit(128 + signal) unless the command handles them (RL runs
    stop cleanly, then exit so); plugins loaded, one torch thread; every run folder opened and locked
    (:func:`agents.lifecycle.open_runs`: RunFolderBusy if another process, e.g. an earlier grid's worker, still
    writes there). Yields, per run, the summary in its ``DONE.json`` where another process (a second grid on the same
    folders) finished it with this config since it was planned, else None (the caller keeps those and trains the
    others, whose folders are cleared of ``DONE.json`` and ``ERROR.txt`` first), and the runs' folders; an error's
    traceback goes to their ``ERROR.txt`` (where the disk takes it)."""
    import torch

    with handling(STOP_SIGNALS, stopped), ExitStack() as stack:
        if _GRID_STOPPED is not None and _GRID_STOPPED.is_set():  # (checked once a signal would stop the run)
            raise _NotStarted
        load_plugins(runs[0].imports)
        torch.set_num_threads(1)
        folders = stack.enter_context(open_runs([r.run_dir for r in runs], [r.config for r in runs],
                                                resume=all(r.resume for r in runs)))
        # checked under the locks: no one writes there now
        done = [(read_done(r.run_dir) or {}).get("summary") if r.status == "done" else None for r in runs]
        todo = [r for r, summary in zip(runs, done) if summary is None]
        for run in todo:
            for name in (DONE, ERROR):  # a stale or failed run is redone
                (run.run_dir / name).unlink(missing_ok=True)
        try:
            yield done, folders
        except Exception as err:
            if isinstance(err, RunLogWriteError):  # (HDF5's state, not a file of our own: see _WRITE_FAILED)
                global _WRITE_FAILED
                _WRITE_FAILED = True
            for run in todo:
                with suppress(OSError):  # (a full disk: the error itself goes on, not this one)
                    (run.run_dir / ERROR).write_text(traceback.format_exc())
            raise


def execute(run: GridRun) -> dict[str, Any]:
    """Run one configuration in its folder (:meth:`agents.commands.Command.train`, which marks it done; see
    :func:`_writing` for signals and errors)."""
    with _writing([run]) as ([finished_meanwhile], [folder]):
        if finished_meanwhile is not None:
            return finished_meanwhile
        return get_command(run.command).train(folder)


def execute_population(task: PopulationTask) -> list[dict[str, Any]]:
    """Train a population task's runs as one population (the command's :class:`agents.commands.Population`); their
    summaries (of runs another grid finished meanwhile, the saved ones: only the others are trained). An error fails
    every member, with the traceback in each trained one's ``ERROR.txt``."""
    with _writing(task.runs) as (summaries, folders):
        todo = [folder for folder, summary in zip(folders, summaries) if summary is None]
        if not todo:
            return summaries
        trained = iter(population(get_command(task.runs[0].command)).train(todo, task.out))
        return [next(trained) if summary is None else summary for summary in summaries]


def run_task(task: Task) -> Any:
    """Execute a task (the function pool workers call): a run's summary, or a population's list of them."""
    return execute_population(task) if isinstance(task, PopulationTask) else execute(task)
