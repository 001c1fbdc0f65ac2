"""``agents.train`` subcommands of the streaming learners, ``stream-sin`` and ``edit``, declared as
:class:`agents.algorithm.Algorithm` declarations.

Run folders: ``OUT/stream-sin/<method>/lr<lr>/seed<k>/run.h5`` (one HDF5 run log per seed; all seeds of a folder
train together) and ``OUT/edit/<act>/seed<k>/edit.h5``.

An activation's arguments are flags and config keys of their own (``--k 2``, ``slope: 0.5``): ``d``, ``a`` and ``h``
with the paper's Elephant values as defaults, the others with the activation's defaults. ``learnable`` stays off
(the seeds' stacked ensemble trains no activation parameters).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from interference.gradcov import LossFn
from probes import ProbeContext, ProbeRunner, make_probe
from runlog import END, Field, RunLog

from ..algorithm import Algorithm
from ..lifecycle import RunFolder
from .edit import EditConfig, edit
from .learner import Ensemble, StreamConfig, build_net, train_stream

__all__ = ["COMMANDS", "StreamSinSettings", "EditSettings", "stream_probes", "sample_steps"]

N_PROBE_INPUTS = 201


def _check_stream(cfg: StreamConfig) -> None:
    """ValueError naming a stream setting out of range (or a width the activation's rules refuse)."""
    for name in ("lr", "d", "a", "h"):
        v = getattr(cfg, name)
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"{'learning rate' if name == 'lr' else name} must be a positive number, got {v!r}")
    for name in ("n", "n_test", "updates", "width"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"{name} must be a positive integer, got {getattr(cfg, name)!r}")
    if not cfg.sigma_bias >= 0:
        raise ValueError(f"sigma_bias must be >= 0, got {cfg.sigma_bias!r}")
    if not cfg.srnn_lambda >= 0:
        raise ValueError(f"srnn_lambda must be >= 0, got {cfg.srnn_lambda!r}")
    if not 0 < cfg.srnn_beta < 1:
        raise ValueError(f"srnn_beta must be in (0, 1), got {cfg.srnn_beta!r}")
    try:
        Ensemble([build_net(cfg, 0)])  # the activation's width rules (e.g. Maxout's width divisible by k)
    except (ValueError, TypeError) as err:
        raise ValueError(f"--act {cfg.act} with width {cfg.width}: {err}") from None


@dataclass
class StreamSinSettings(StreamConfig):
    """stream-sin's settings: the stream's and its probes'."""

    probe: list[str] = field(default_factory=lambda: ["ntk", "outputs", "sparsity"],
                             metadata={"help": "comma-separated probes of the list above (empty: none)"})
    probe_at: list[int] | None = field(default=None, metadata={
        "help": "samples seen at which probes run (gradcov, which draws k=32 distinct samples of those seen, runs "
                "from the 32nd sample on)", "default_text": "1,25,50,100,150 and n"})

    def __post_init__(self) -> None:
        _check_stream(self)
        self.probe_at = sorted({int(s) for s in (self.probe_at or (1, 25, 50, 100, 150, self.n))})


@dataclass
class EditSettings(EditConfig):
    """edit's settings (no SR-NN: its two settings stay in the config, at their defaults)."""

    srnn_lambda: float = field(default=0.0, metadata={"flag": False})
    srnn_beta: float = field(default=0.1, metadata={"flag": False})

    def __post_init__(self) -> None:
        _check_stream(self)
        if self.srnn_lambda:
            raise ValueError("edit trains no SR-NN: srnn_lambda must be 0")
        if self.tol <= 0 or self.far < 0 or self.pretrain_steps <= 0 or self.max_steps <= 0 or self.n_grid <= 0:
            raise ValueError("tol must be > 0, far >= 0 and pretrain_steps, max_steps and n_grid > 0")


def _stream_folder(config: Mapping[str, Any]) -> str:
    """``<method>/lr<lr>``: the activation with its arguments (those not settings of their own), SR-NN's settings
    where it is on."""
    method = config["act"] + "".join(f"-{k}{_text(config[k])}" for k in sorted(set(config) - _KEYS))
    if config["srnn_lambda"] > 0:
        method += f"-srnn-l{config['srnn_lambda']:g}-b{config['srnn_beta']:g}"
    return f"{method}/lr{config['lr']:g}"


def train_stream_sin(run: RunFolder, cfg: StreamSinSettings) -> dict[str, Any]:
    """Train every seed of ``cfg`` side by side, each seed's probes and test MSE into its own run log."""
    runners = [stream_probes(cfg, seed, cfg.probe, cfg.probe_at, run.path / f"seed{seed}" / "run.h5")
               for seed in cfg.seeds]
    x_seen, y_seen = [], []

    def on_sample(t: int, ens: Ensemble, xt, yt, mse) -> None:
        x_seen.append(xt)
        y_seen.append(yt)
        for i, (runner, ctx) in enumerate(runners):
            runner.scalar("test_mse", t, float(mse[i]))
            if runner.due(t):
                ctx.step, ctx.model, ctx.current = t, ens.module(i), xt
                ctx.sample = _sampler(torch.cat(x_seen), torch.cat(y_seen), np.random.default_rng([cfg.seeds[i], t]))
                runner.on_step(ctx)

    try:
        result = train_stream(cfg, on_sample)
        for runner, _ in runners:  # reports read "finished" from here (a log without it is still running)
            runner.log.end(cfg.n, "finished")
    finally:
        for runner, _ in runners:
            runner.close()
    return {"final_mse": dict(zip(map(str, cfg.seeds), result.final_mse.tolist())),
            "mean_final_mse": float(result.final_mse.mean())}


def train_edit(run: RunFolder, cfg: EditSettings) -> dict[str, Any]:
    """Fit, edit and measure every seed of ``cfg`` side by side; each seed's before/after curves into its log."""
    config = run.config
    result = edit(cfg, say=lambda line: print(f"edit {cfg.act}: {line}", file=sys.stderr, flush=True))
    n_grid = len(result.x)
    schema = {"edit": {"x": Field((n_grid,)), "before": Field((n_grid,)), "after": Field((n_grid,)),
                       "far_change": Field(()), "steps": Field((), "int64"), "pretrain_mse": Field(())}}
    for i, seed in enumerate(cfg.seeds):
        with RunLog(run.path / f"seed{seed}" / "edit.h5", config={"algo": "edit", **dict(config), "seeds": None,
                                                                  "seed": seed},
                    seed=seed, probes=schema, overwrite=True) as log:
            log.append("edit", 0, x=result.x, before=result.before[i], after=result.after[i],
                       far_change=result.far_change[i], steps=result.steps[i], pretrain_mse=result.pretrain_mse[i])
    return {"far_change": dict(zip(map(str, cfg.seeds), result.far_change.tolist())),
            "mean_far_change": float(result.far_change.mean()),
            "edit_steps": result.steps.tolist(), "pretrain_mse": result.pretrain_mse.tolist()}


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _mse(model: torch.nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return (model(x) - y).pow(2).flatten()


def _sampler(x: torch.Tensor, y: torch.Tensor, rng: np.random.Generator):
    """``sample(k)``: ``k`` distinct samples of those seen so far (drawn without replacement), in stream order
    (increasing x); ValueError if fewer than ``k`` have been seen."""

    def sample(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if k > len(x):
            raise ValueError(f"cannot draw {k} distinct samples from the {len(x)} seen so far")
        idx = torch.as_tensor(np.sort(rng.choice(len(x), size=k, replace=False)))
        return x[idx], y[idx]

    return sample


def sample_steps(at: Sequence[int], k: int, n: int) -> list[int]:
    """Probe steps for a probe that draws ``k`` distinct samples of those seen: the steps of `at` from ``k`` on,
    and ``k`` itself in place of earlier ones (the first step with ``k`` distinct samples); none if the stream
    has fewer than ``k`` samples (``n < k``)."""
    if n < k:
        return []
    return sorted({max(int(s), k) for s in at})


def stream_probes(cfg: StreamConfig, seed: int, names: list[str], at: list[int],
                  path: Path) -> tuple[ProbeRunner, ProbeContext]:
    """The probe runner of one seed's run log and a context to fill in at each probe step.

    Probe inputs are ``N_PROBE_INPUTS`` points evenly spaced on [0, 2]; the NTK is taken against the sample being
    learned and normalised to [-1, 1] (the paper's Figure 2a).
    """
    from .learner import build_net

    kwargs = {"every": None, "at": at}
    probes = [make_probe(n, **kwargs, **({"against": "current", "normalized": True} if n == "ntk" else {}))
              for n in names]
    # gradcov draws k distinct samples of those seen so far: it waits until k have been seen
    probes = [make_probe(p.name, every=None, at=sample_steps(at, p.k, cfg.n)) if p.name == "gradcov" else p
              for p in probes]
    inputs = torch.linspace(0.0, 2.0, N_PROBE_INPUTS)[:, None]
    losses: dict[str, LossFn] = {"mse": _mse}
    ctx = ProbeContext(step=0, model=build_net(cfg, seed), losses=losses, inputs=inputs,
                       current=inputs[:1], sample=_sampler(inputs, torch.sin(math.pi * inputs), np.random.default_rng(0)))
    settings = {k: v for k, v in STREAM_SIN.config_dict(cfg).items() if k not in ("probe", "probe_at")}
    config = {"algo": "stream-sin", **settings, "seeds": None, "seed": seed}
    runner = ProbeRunner(probes, path, example=ctx, config=config, seed=seed, scalars=("test_mse", END), overwrite=True)
    return runner, ctx


STREAM_SIN = Algorithm("stream-sin", "streaming regression on sin(pi x) (the paper's section 6.1), several seeds side "
                       "by side", StreamSinSettings, train_stream_sin, folder=_stream_folder, activation="act",
                       fixed_arguments=("learnable",), key="command")
EDIT = Algorithm("edit", "local editing (the paper's Figure 2b): fit sin(pi x), move the target at x=1.5 from -1 to -1.5",
                 EditSettings, train_edit, folder=lambda config: config["act"], activation="act",
                 fixed_arguments=("learnable",), key="command")
#: the settings of the stream (the activation's other arguments are keys beside them)
_KEYS = frozenset(STREAM_SIN.fields) | {"command"}

COMMANDS = {"stream-sin": STREAM_SIN, "edit": EDIT}
