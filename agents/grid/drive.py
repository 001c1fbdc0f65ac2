"""What every backend shares: the loop that keeps tasks going until all ended or the grid stops, and the outcomes of
a task's runs."""

from __future__ import annotations

import signal
import traceback
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from ..signals import STOP_SIGNALS
from .planning import GridRun, PopulationTask, Task, _runs
from .worker import _NotStarted


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
