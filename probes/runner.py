"""The plain-loop adapter: a learner we write ourselves calls ``runner.on_step(ctx)`` after each update."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from .probe import Probe, ProbeContext
from runlog import Field, RunLog
from runlog.schema import FieldDoc, ProbeSchema

__all__ = ["ProbeRunner", "frozen_noise", "INPUTS"]

INPUTS = "inputs"  # the probe group holding the run's fixed probe inputs (one record)


@contextlib.contextmanager
def frozen_noise(model: nn.Module) -> Iterator[None]:
    """Probe without touching training: torch RNG state restored afterwards, dropout off, noise held fixed.

    Noisy layers keep their current noise sample (nothing resamples it during a probe); dropout modules are put in
    eval mode so every forward pass of one probe sees the same (mask-free) function.
    """
    devices = [p.device for p in model.parameters() if p.device.type == "cuda"][:1]
    dropouts = [m for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.training]
    with torch.random.fork_rng(devices=devices):
        for m in dropouts:
            m.eval()
        try:
            yield
        finally:
            for m in dropouts:
                m.train()


INPUTS_SCHEMA = ProbeSchema("Probe inputs", {"x": FieldDoc("the fixed probe inputs, logged once", plot="none")})


class ProbeRunner:
    """Owns a run's probes and its :class:`~runlog.RunLog`.

    Args:
        probes: the probes to run.
        path: the run's HDF5 file (appended to if it exists).
        example: a context with the model, losses, sample source and probe inputs, used to declare fields.
        config: the run's configuration, stored (as JSON) in the run log's attributes.
        seed: the run's seed, stored in the run log's attributes.
        scalars: names of scalar series the learner will log (episode returns, losses, ...).
        overwrite: start the file afresh instead of appending to an existing run.
        device: the device the run trains on, stored in the run log's attributes.
        extra_attrs: more root attributes to store (JSON-serialisable values).
        keep: resume at a checkpoint: the record counts to keep (:meth:`RunLog.counts` when it was taken).
    """

    def __init__(self, probes: Sequence[Probe], path: str | os.PathLike, *, example: ProbeContext,
                 config: Mapping[str, Any], seed: int, scalars: Sequence[str] = (), device: str = "cpu",
                 extra_attrs: Mapping[str, Any] | None = None, overwrite: bool = False,
                 keep: Mapping[str, int] | None = None) -> None:
        names = [p.name for p in probes]
        if len(set(names)) != len(names):
            raise ValueError(f"probe names must be unique, got {names}")
        self.probes = list(probes)
        schema = {p.name: p.fields(example) for p in self.probes}
        if example.inputs is not None:
            schema[INPUTS] = {"x": Field(tuple(example.inputs.shape), "float32")}
        docs = {p.name: p.schema.to_json() for p in self.probes if p.schema is not None}
        docs[INPUTS] = INPUTS_SCHEMA.to_json()
        self.log = RunLog(path, config=config, seed=seed, probes=schema, scalars=scalars, device=device,
                          probe_settings={p.name: p.settings() for p in self.probes},
                          extra_attrs={"probe_schema": docs, **dict(extra_attrs or {})}, overwrite=overwrite,
                          keep=keep)
        self._inputs_logged = self.log.counts().get(f"probes/{INPUTS}", 0) > 0

    def due(self, step: int) -> bool:
        """Whether any probe has a record due at ``step``."""
        return any(p.due(step) for p in self.probes)

    def on_step(self, ctx: ProbeContext) -> None:
        """Run every probe due at ``ctx.step`` (cheap when none is)."""
        if not self.due(ctx.step):
            return
        if ctx.inputs is not None and not self._inputs_logged:
            self.log.append(INPUTS, ctx.step, x=ctx.inputs.detach().to("cpu", torch.float32).numpy())
            self._inputs_logged = True
        with frozen_noise(ctx.model):
            for p in self.probes:
                p.on_step(ctx, self.log)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the runner: each probe's :meth:`Probe.state` and the log's record counts."""
        return {"probes": {p.name: p.state() for p in self.probes}, "counts": self.log.counts()}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Resume the probes' cadence from :meth:`state` (the log is resumed with ``keep=state["counts"]``)."""
        for p in self.probes:
            if p.name in state["probes"]:
                p.restore(state["probes"][p.name])

    def scalar(self, name: str, step: int, value: float) -> None:
        """Log one value of the scalar series ``name`` (declared in ``scalars``) at ``step``, flushed to disk."""
        self.log.scalar(name, step, float(np.asarray(value)))

    def close(self) -> None:
        """Close the run log (also on leaving a ``with`` block)."""
        self.log.close()

    def __enter__(self) -> ProbeRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
