"""The local backend: a process pool of spawned workers, one task each at a time."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from multiprocessing import get_context
from typing import Any

from ..signals import STOP_SIGNALS
from .drive import Outcome, _drive, _outcomes, _Stop
from .planning import Task, _runs
from .worker import _init_worker, run_task


#: a run's outcome when a worker of the pool died (killed, out of memory): the pool then stops the runs in its other
#: workers too (SIGTERM: they stop cleanly, checkpointed), and which of them died it does not say
POOL_BROKEN = ("a worker of the pool died (killed, or out of memory), and the pool stopped the runs in its other "
               "workers with it; --resume continues each from its last checkpoint")


#: seconds the grid waits for its workers to start before it goes on regardless (a worker that cannot start breaks
#: the pool, which the grid reports)
START_WAIT_S = 300.0


def _run_pool(work: Sequence[Task], workers: int, stop: _Stop, record: Callable[[Outcome], None]) -> None:
    spawn = get_context("spawn")
    stop.event, started = spawn.Event(), spawn.Semaphore(0)
    with ProcessPoolExecutor(max_workers=workers, mp_context=spawn, initializer=_init_worker,
                             initargs=(os.getpid(), stop.event, started)) as pool:
        # every worker started now, before the pool's manager thread: a worker spawned on demand by a later submit
        # may start after that thread began waiting on the workers it knew (submit wakes it first, then spawns),
        # and if that worker is killed the pool never notices and waits forever (CPython 3.11's
        # ProcessPoolExecutor.submit); _launch_processes is what the pool itself calls for fork contexts
        with _spawning():
            pool._launch_processes()
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

        try:
            _drive(work, workers, start, wait_some, stop, record)
        finally:
            # before the pool shuts down: every worker started (a worker still unpickling its start-up state when
            # the pool goes finds its semaphores removed and prints a traceback), and the pool's manager thread
            # running, which tells the workers to exit (with no task ever submitted, as after an early Ctrl-C,
            # nothing would, and the interpreter's exit would wait for them forever)
            _await_start(started, pool, workers)
            if pool._executor_manager_thread is None:
                pool._start_executor_manager_thread()


def _await_start(started: Any, pool: ProcessPoolExecutor, workers: int) -> None:
    """Wait until ``workers`` pool workers have run their initializer (each releases ``started``), a worker has
    died, or :data:`START_WAIT_S` has passed."""
    deadline = time.monotonic() + START_WAIT_S
    waiting = workers
    while waiting and time.monotonic() < deadline:
        if started.acquire(timeout=0.2):
            waiting -= 1
        elif any(p.exitcode is not None for p in list((pool._processes or {}).values())):
            return


@contextmanager
def _spawning() -> Iterator[None]:
    """Stop signals blocked in this thread while it may spawn pool workers, which inherit the mask and unblock in
    :func:`_init_worker` once they ignore them (a signal meanwhile stays pending here and arrives after)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
