"""Running a grid: its unfinished runs as tasks on the chosen backend (in this process, a process pool, or Ray),
with progress, stop signals and the grid's report."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from tqdm import tqdm

from ..errors import ConfigError
from ..lifecycle import ERROR
from ..signals import RECEIVED, STOP_SIGNALS, handling
from . import worker  # (its _WRITE_FAILED, read when a run ended)
from .drive import Outcome, _drive, _outcomes, _Stop
from .local import _run_pool
from .planning import GridRun, Task, _runs, tasks
from .ray_backend import _run_ray
from .worker import run_task


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
    work = tasks(todo, at_once=(workers or 1) if backend == "local" else 1)  # (Ray places by resources)
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
        # HDF5 in this process may be left unusable by the failed file: start no more runs here
        if worker._WRITE_FAILED:
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
