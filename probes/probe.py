"""The probe API: what a probe declares, when it runs, and what it computes from.

A probe has a name, a schema (what its fields mean, :mod:`runlog.schema`), a cadence (``every`` N steps and/or chosen steps ``at``), declares its fields (dataset
names, per-record shapes, dtypes) before the run starts, and computes one record from a :class:`ProbeContext`.
:meth:`Probe.on_step` does the bookkeeping; subclasses implement :meth:`Probe.fields` and :meth:`Probe.compute`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import Tensor, nn

from interference.gradcov import LossFn
from interference.gram import Batch

from runlog import Field, RunLog
from runlog.schema import ProbeSchema

__all__ = ["ProbeContext", "Probe"]


@dataclass
class ProbeContext:
    """What a probe may look at, at one training step.

    Attributes:
        step: the learner's step counter (env steps for RL, samples seen for streaming learners).
        model: the network whose interference is measured (e.g. a DQN's Q-network, a PPO policy).
        losses: named per-sample training losses ``loss_fn(model, batch) -> (k,)`` (e.g. ``{"td": ...}`` or
            ``{"actor": ..., "critic": ...}``).
        sample: ``sample(k)`` draws ``k`` training samples (a batch for ``losses``) from the probe's own RNG.
        inputs: fixed probe inputs ``(N, *obs_shape)``, chosen once at the start of the run.
        current: the sample being learned now, if the learner has one (streaming: ``x_t`` as ``(1, *features)``).
        forward: ``forward(model, x)`` -> the outputs an NTK is taken of; default ``model(x)``.
        loss_params: per loss, the parameter names its gradient is taken over (default: all trainable), e.g.
            only the actor's parameters for SAC's actor loss.
    """

    step: int
    model: nn.Module
    losses: Mapping[str, LossFn] = field(default_factory=dict)
    sample: Callable[[int], Batch] | None = None
    inputs: Tensor | None = None
    current: Tensor | None = None
    forward: Callable[[nn.Module, Tensor], Tensor] | None = None
    loss_params: Mapping[str, Sequence[str]] = field(default_factory=dict)


class Probe:
    """Base class. Runs at the first step at or past each multiple of ``every`` (``None``: no cadence) and at or
    past each step in ``at`` (e.g. the paper's midpoint and end), so coarse callers (once per PPO rollout) never
    miss a record."""

    name: str = "probe"
    #: what the fields mean and how reports plot them (undeclared fields are plotted by their shape)
    schema: ProbeSchema | None = None

    def __init__(self, every: int | None = 1000, at: Sequence[int] = ()) -> None:
        if every is not None and (not isinstance(every, int) or every <= 0):
            raise ValueError(f"{self.name}: every must be a positive int or None, got {every!r}")
        self.every = every
        self.at = tuple(sorted({int(s) for s in at}))
        self._next = every
        self._pending = list(self.at)

    def settings(self) -> dict[str, Any]:
        """Everything that determines what this probe computes; stored in the run log's attributes."""
        return {"every": self.every, "at": list(self.at)}

    def due(self, step: int) -> bool:
        """Whether a record is due at ``step``."""
        return (self._next is not None and step >= self._next) or bool(self._pending and step >= self._pending[0])

    def _advance(self, step: int) -> None:
        if self.every is not None:
            self._next = (step // self.every + 1) * self.every
        while self._pending and self._pending[0] <= step:
            self._pending.pop(0)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps to resume this probe exactly: its cadence (a probe that remembers more, e.g. an
        earlier record to compare with, extends both this and :meth:`restore`; values must pickle)."""
        return {"next": self._next, "pending": list(self._pending)}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state`."""
        self._next, self._pending = state["next"], list(state["pending"])

    def fields(self, ctx: ProbeContext) -> dict[str, Field]:
        """Datasets this probe writes, with per-record shapes; called once before the run log is created."""
        raise NotImplementedError

    def compute(self, ctx: ProbeContext) -> dict[str, np.ndarray]:
        """One record: a value for every declared field."""
        raise NotImplementedError

    def on_step(self, ctx: ProbeContext, log: RunLog) -> bool:
        """Compute and log a record if the probe is due at ``ctx.step``; returns whether it ran."""
        if not self.due(ctx.step):
            return False
        self._advance(ctx.step)
        log.append(self.name, ctx.step, **self.compute(ctx))
        return True
