"""The training-run callback: progress bar, episode returns, duration estimates, Ctrl-C / SIGTERM and NaN stops.

The run log (episode returns, losses, probes) is :class:`probes.sb3.ProbeCallback`'s; this callback keeps the
returns for the summary and decides when a run stops early.

A run's duration is estimated from one model throughout: the start-of-run :class:`agents.rl.budget.Estimate`
(Q-learning runs) is measured again on the run itself after :data:`ESTIMATE_AFTER_S` s of training (its time spent
acting and updating against what the model said for those steps) and printed as the updated estimate that replaces
the first one; later progress lines use the model measured on the steps since the previous line. Runs without an
estimate (PPO, SAC, short runs) extrapolate their pace.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import signal
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from tqdm import tqdm

from agents.signals import STOP_SIGNALS, handling

if TYPE_CHECKING:
    from .budget import Estimate

__all__ = ["RunCallback", "stop_on_signals", "final_return", "duration", "finish_time"]

#: seconds of training before a long run says how long it will take
ESTIMATE_AFTER_S = 30.0
#: runs expected to take at least this long (seconds) say so
LONG_S = 600.0
#: progress lines per run when there is no progress bar (output redirected to a file)
LINES = 10


def duration(seconds: float) -> str:
    """``2 h 05 min``, ``7 min``, ``40 s``."""
    if not math.isfinite(seconds):
        return "an unknown time"
    minutes = round(seconds / 60)
    if minutes >= 60:
        return f"{minutes // 60} h {minutes % 60:02d} min"
    return f"{minutes} min" if minutes else f"{seconds:.0f} s"


def finish_time(seconds: float, now: float | None = None) -> str:
    """When a run that takes ``seconds`` more from ``now`` (default: now) ends, with its date: ``Thu 3 Dec 07:38``
    (and the year when it is not this year's); a weekday alone would be ambiguous past six days."""
    now = time.time() if now is None else now
    start = datetime.datetime.fromtimestamp(now)
    end = datetime.datetime.fromtimestamp(now + seconds) if math.isfinite(seconds) else None
    if end is None:
        return "at an unknown time"
    year = f" {end.year}" if end.year != start.year else ""
    return f"{end:%a} {end.day} {end:%b}{year} {end:%H:%M}"


def final_return(returns: list[float], fraction: float = 0.1) -> float:
    """Mean over the last ``ceil(fraction * n)`` episodes (at least one); NaN without episodes."""
    if not returns:
        return math.nan
    k = max(1, math.ceil(round(fraction * len(returns), 9)))
    return float(sum(returns[-k:]) / k)


class RunCallback(BaseCallback):
    """Progress bar, episode bookkeeping and the two ways a run stops early.

    Args:
        total: the run's env steps (for the bar).
        progress: show a tqdm bar on stderr.
        lines: without a bar, print a progress line per tenth of the run and, for a long run, its expected
            duration after :data:`ESTIMATE_AFTER_S` s (False in grid workers, whose output is the grid's).
        desc: the bar's label.
        resume: :meth:`state` from a checkpoint: the episodes and wall time so far.
        estimate: the run's duration model from the start (:func:`agents.rl.budget.calibrate`), which the
            updated estimate and the progress lines measure again on the run (module docstring); None: the pace.

    A stop by signal waits while ``defer_stop`` is set (a :class:`agents.rl.checkpoint.Checkpointer` sets it until
    it has checkpointed at the next rollout start). After ``learn`` returns, ``stop_reason`` is ``None``
    (finished), ``"interrupted"`` (Ctrl-C or SIGTERM; the
    signal number is ``stop_signal``) or ``"nan"`` (a non-finite loss; ``stop_message`` says which).
    """

    def __init__(self, total: int, *, progress: bool = True, lines: bool = False, desc: str = "",
                 resume: dict[str, Any] | None = None, estimate: Estimate | None = None) -> None:
        super().__init__()
        self.total, self.progress, self.desc = int(total), progress, desc
        self.estimate = estimate
        self.lines = lines and not progress
        resume = resume or {}
        self.returns: list[float] = list(resume.get("returns", []))
        self.lengths: list[int] = list(resume.get("lengths", []))
        self._wall_before = float(resume.get("wall_seconds", 0.0))
        self.stop_requested = False
        self.defer_stop = False
        self.stop_signal = signal.SIGINT
        self.stop_reason: str | None = None
        self.stop_message = ""
        self.wall_seconds = 0.0
        self.bar: tqdm | None = None
        self._t0 = 0.0
        self._shown = 0
        self._last_postfix = 0.0
        self._start = 0  # the step training (re)started at
        self._estimated = False
        self._next_line = 0  # without a bar: the step of the next progress line
        self._mark = (0, 0.0)  # (step, time) of the last progress line
        # time spent in rollouts (acting) and between them (updates), and the step, at the last rollout start
        self._acting = self._updating = 0.0
        self._rollout_start: float | None = None
        self._rollout_end: float | None = None
        self._first: tuple[int, float, float] | None = None  # (step, acting, updating) at the first rollout start
        self._counted: tuple[int, float, float] | None = None  # ... at the latest rollout start
        self._line_counted: tuple[int, float, float] | None = None  # ... at the last progress line
        self.updated: float | None = None  # the updated estimate: seconds left when it was printed

    # -- SB3 hooks -------------------------------------------------------------------------------------------
    def _on_training_start(self) -> None:
        self._t0 = time.perf_counter()
        self._shown = self._start = self.num_timesteps
        self._next_line = self._after(self.num_timesteps)
        self._mark = (self.num_timesteps, self._t0)
        # with a duration model the bar shows its estimate (postfix "left") instead of tqdm's extrapolated pace
        fmt = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]" if self.estimate else None
        self.bar = tqdm(total=self.total, initial=self.num_timesteps, unit="step", desc=self.desc,
                        disable=not self.progress, dynamic_ncols=True, mininterval=0.5, file=sys.stderr,
                        bar_format=fmt)

    def _on_rollout_start(self) -> None:
        now = time.perf_counter()
        if self._rollout_end is not None:
            self._updating += now - self._rollout_end
        self._rollout_start, self._rollout_end = now, None
        self._counted = (self.num_timesteps, self._acting, self._updating)
        if self._first is None:
            self._first = self._line_counted = self._counted

    def _on_rollout_end(self) -> None:
        now = time.perf_counter()
        if self._rollout_start is not None:
            self._acting += now - self._rollout_start
        self._rollout_end = now

    def _on_step(self) -> bool:
        step = self.num_timesteps
        for info in self.locals.get("infos", ()):
            episode = info.get("episode")
            if episode is not None:
                self.returns.append(float(episode["r"]))
                self.lengths.append(int(episode["l"]))
        if self.bar is not None:
            self.bar.update(step - self._shown)
            self._shown = step
            now = time.perf_counter()
            if self.progress and now - self._last_postfix > 1.0 and (self.returns or self.estimate is not None):
                self._last_postfix = now
                postfix: dict[str, Any] = {}
                if self.returns:
                    recent = self.returns[-10:]
                    postfix.update(episodes=len(self.returns), ret=f"{sum(recent) / len(recent):.1f}")
                if self.estimate is not None:  # the first estimate, then the one measured on the run
                    left = self.seconds_left(step, self._first) if self.updated is not None else math.nan
                    postfix["left"] = duration(left if math.isfinite(left) else self.estimate.seconds(step))
                self.bar.set_postfix(postfix, refresh=False)
        self._pace(step)
        if self._check_nonfinite(step):
            return False
        if self.stop_requested and not self.defer_stop:
            self.stop_reason = "interrupted"
            self.stop_message = f"interrupted at step {step}"
            return False
        return True

    def _on_training_end(self) -> None:
        self.wall_seconds = self._wall_before + time.perf_counter() - self._t0
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (see ``resume``)."""
        return {"returns": list(self.returns), "lengths": list(self.lengths),
                "wall_seconds": self._wall_before + time.perf_counter() - self._t0}

    # -- helpers ---------------------------------------------------------------------------------------------
    def _after(self, step: int) -> int:
        tenth = max(1, self.total // LINES)
        return (step // tenth + 1) * tenth

    def seconds_left(self, step: int, since: tuple[int, float, float] | None = None) -> float:
        """Seconds from ``step`` to the end of the run by the duration model fitted to the run since ``since`` (a
        rollout start's (step, acting, updating); :meth:`agents.rl.budget.Estimate.measured`). NaN without a model
        or a measurement."""
        now = self._counted
        if self.estimate is None or since is None or now is None or now[0] <= since[0]:
            return math.nan
        (a, acting0, updating0), (b, acting1, updating1) = since, now
        return self.estimate.measured(a, b, acting1 - acting0, updating1 - updating0).seconds(step)

    def _pace(self, step: int) -> None:
        """Once, after :data:`ESTIMATE_AFTER_S` s of training, the updated estimate of the time left (if the run is
        long); without a progress bar, a line per tenth of the run."""
        if self._estimated and (not self.lines or step < self._next_line):
            return
        elapsed = time.perf_counter() - self._t0
        rate = (step - self._start) / elapsed if elapsed > 0 else 0.0
        if not self._estimated and elapsed >= ESTIMATE_AFTER_S:
            self._estimated = True
            self._updated_estimate(step, rate)
        if self.lines and self._next_line <= step < self.total:
            self._next_line = self._after(step)
            now, (last_step, last_time) = time.perf_counter(), self._mark
            if now > last_time and step > last_step:  # the recent pace (after learning_starts, say)
                rate = (step - last_step) / (now - last_time)
            self._mark = (step, now)
            left = self.seconds_left(step, self._line_counted)
            self._line_counted = self._counted
            if not math.isfinite(left):
                left = (self.total - step) / rate if rate > 0 else math.inf
            left_text = f", about {duration(left)} left" if math.isfinite(left) else ""
            print(f"{self.desc}: step {step:,} of {self.total:,} ({100 * step / self.total:.0f}%), "
                  f"{rate:,.0f} steps/s{left_text}", file=sys.stderr, flush=True)

    def _updated_estimate(self, step: int, rate: float) -> None:
        """The estimate measured on the first :data:`ESTIMATE_AFTER_S` s of training, printed if the run is long
        (or the first estimate said so): with a duration model, in the first estimate's place; without, the pace
        extrapolated."""
        show = self.progress or self.lines
        elapsed = time.perf_counter() - self._t0
        left = self.seconds_left(step, self._first)
        if self.estimate is not None and math.isfinite(left):
            self.updated = left
            first = self.estimate.seconds(self._start)  # what the run's plan said, for the same steps
            if show and max(left, first) >= LONG_S:
                average = (self.total - step) / left if left > 0 else math.inf
                pace = (f"; {rate:,.0f} steps/s now, {average:,.0f} on average from here on"
                        + (" as epsilon decays" if average < rate else "")
                        if math.isfinite(average) and abs(average - rate) > 0.1 * rate else "")
                self._say(f"{self.desc}: updated estimate from the first {elapsed:.0f} s of training: about "
                          f"{duration(elapsed + left)} (replaces the first estimate, {duration(first)}), done around "
                          f"{finish_time(left)}{pace}")
            return
        left = (self.total - step) / rate if rate > 0 else math.inf
        if show and left >= LONG_S:
            self._say(f"{self.desc}: {rate:,.0f} steps/s here, so the run takes about {duration(left)} more (done "
                      f"around {finish_time(left)})")

    def _say(self, line: str) -> None:
        """A line on stderr, above the progress bar if there is one."""
        if self.bar is not None and self.progress:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def _check_nonfinite(self, step: int) -> bool:
        bad = getattr(self.model, "nonfinite_loss", None)
        key = "train/loss" if bad is not None else None
        if bad is None:
            for k, v in self.model.logger.name_to_value.items():
                if k.startswith("train/") and "loss" in k and isinstance(v, (int, float, np.floating)) \
                        and not math.isfinite(v):
                    key, bad = k, v
                    break
        if bad is None:
            return False
        self.stop_reason = "nan"
        self.stop_message = (f"the training loss became {bad} ({key}) at step {step}; stopping the run "
                             f"(try a smaller learning rate)")
        return True


@contextlib.contextmanager
def stop_on_signals(callback: RunCallback) -> Iterator[None]:
    """While training: the first Ctrl-C (SIGINT) or SIGTERM (what cluster schedulers send before killing a job)
    asks ``callback`` to stop after the current step, or with checkpoints at the next rollout start, after one
    (model and log are then saved); a second one interrupts at once. A no-op outside the main thread."""

    def handler(signum: int, frame: Any) -> None:
        if callback.stop_requested:
            raise KeyboardInterrupt
        callback.stop_requested = True
        callback.stop_signal = signal.Signals(signum)
        when = "at the next rollout start, with a checkpoint," if callback.defer_stop else "after this step"
        print(f"\n{callback.stop_signal.name}: stopping {when} and saving the model and the log (send it again to "
              "abort)", file=sys.stderr, flush=True)

    with handling(STOP_SIGNALS, handler):
        yield
