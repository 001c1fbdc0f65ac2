"""``agents.train`` subcommands of the streaming learners: ``stream-sin`` and ``edit``.

Run folders: ``OUT/stream-sin/<method>/lr<lr>/seed<k>/run.h5`` (one HDF5 run log per seed; all seeds of a folder
train together) and ``OUT/edit/<act>/edit.h5``.

An activation's arguments are flags and config keys of their own (``--k 2``, ``slope: 0.5``): ``d``, ``a`` and ``h``
with the paper's Elephant values as defaults, the others with the activation's defaults. An argument named like
another setting keeps its default; ``learnable`` is always off (the stacked ensemble trains no activation
parameters).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from interference.activation_spec import activation_names, activation_spec
from interference.gradcov import LossFn
from probes import PROBES, ProbeContext, ProbeRunner, make_probe
from runlog import END, Field, RunLog

from ..commands import add_activation_flags, probe_list
from ..errors import ConfigError
from ..inputs import parse_seeds
from ..lifecycle import RunFolder
from .edit import EditConfig, edit
from .learner import Ensemble, StreamConfig, build_net, train_stream

__all__ = ["COMMANDS", "StreamSin", "Edit", "stream_probes", "sample_steps"]

N_PROBE_INPUTS = 201
#: the config keys of the stream's settings (the activation's arguments beyond d, a and h are keys of their own)
SETTINGS = frozenset(f.name for f in fields(StreamConfig)) - {"act_kwargs"}
#: keys an activation argument may not take over: the settings of both commands, the CLI's own, and learnable
RESERVED = SETTINGS | {f.name for f in fields(EditConfig)} | {"act_kwargs", "seed", "probe", "probe_at", "command",
                                                               "out", "import", "help", "learnable"}


def _steps(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    try:
        return tuple(sorted({int(v) for v in value}))
    except (TypeError, ValueError):
        raise ConfigError(f"probe steps must be integers, got {value!r}") from None


def _activation_keys() -> set[str]:
    """Config keys of the registered activations' arguments (those not in :data:`RESERVED`)."""
    return {a for n in activation_names() for a in activation_spec(n).arguments} - RESERVED


def _stream_config(values: Mapping[str, Any]) -> StreamConfig:
    cfg = StreamConfig(**{k: v for k, v in values.items() if k in SETTINGS - {"seeds"}})
    cfg.seeds = parse_seeds(values.get("seeds", values.get("seed", (0,))))
    if cfg.act not in activation_names():
        raise ConfigError(f"unknown activation {cfg.act!r}; choose from {', '.join(activation_names())}")
    try:
        cfg.act_kwargs = activation_spec(cfg.act).parse_arguments(
            {k: v for k, v in values.items() if k in _activation_keys()})
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for name in ("lr", "d", "a", "h"):
        v = getattr(cfg, name)
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"{'learning rate' if name == 'lr' else name} must be a positive number, got {v!r}")
    for name in ("n", "n_test", "updates", "width"):
        if not isinstance(getattr(cfg, name), int) or getattr(cfg, name) <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {getattr(cfg, name)!r}")
    if cfg.sigma_bias < 0:
        raise ConfigError(f"sigma_bias must be >= 0, got {cfg.sigma_bias!r}")
    if cfg.srnn_lambda < 0:
        raise ConfigError(f"srnn_lambda must be >= 0, got {cfg.srnn_lambda!r}")
    if not 0 < cfg.srnn_beta < 1:
        raise ConfigError(f"srnn_beta must be in (0, 1), got {cfg.srnn_beta!r}")
    try:
        Ensemble([build_net(cfg, 0)])  # the activation's width rules (e.g. Maxout's width divisible by k)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"--act {cfg.act} with width {cfg.width}: {err}") from None
    return cfg


def _config_dict(cfg: StreamConfig) -> dict[str, Any]:
    """``cfg`` as a flat config: the activation's arguments are keys of their own."""
    out = asdict(cfg)
    act_kwargs = out.pop("act_kwargs")
    return {**out, **act_kwargs, "seeds": list(cfg.seeds)}


def _add_stream_arguments(p: argparse.ArgumentParser) -> None:
    d = StreamConfig()
    p.add_argument("--act", choices=activation_names(), help=f"hidden activation (default {d.act})")
    p.add_argument("--lr", type=float, help=f"Adam learning rate (default {d.lr:g}; the paper's grid is "
                                            "3e-3, 1e-3, 3e-4, 1e-4, 3e-5, 1e-5)")
    p.add_argument("--seeds", help="comma-separated seeds trained side by side (default 0)")
    p.add_argument("--n", type=int, help=f"stream length (default {d.n})")
    p.add_argument("--n-test", dest="n_test", type=int, help=f"test points on [0, 2] (default {d.n_test})")
    p.add_argument("--updates", type=int, help=f"Adam updates per arriving sample (default {d.updates})")
    p.add_argument("--width", type=int, help=f"hidden units (default {d.width})")
    p.add_argument("--d", type=float, help=f"Elephant slope d (default {d.d:g}; any activation's argument d)")
    p.add_argument("--a", type=float, help=f"Elephant width a (default {d.a:g}; any activation's argument a)")
    p.add_argument("--h", type=float, help=f"Elephant height h (default {d.h:g}; any activation's argument h)")
    p.add_argument("--sigma-bias", dest="sigma_bias", type=float,
                   help=f"bias spread sigma_bias of activations that spread their biases, e.g. Elephant "
                        f"(default {d.sigma_bias:g})")
    add_activation_flags(p, RESERVED)


class StreamSin:
    name = "stream-sin"
    help = "streaming regression on sin(pi x) (the paper's section 6.1), several seeds side by side"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        _add_stream_arguments(p)
        p.add_argument("--srnn-lambda", dest="srnn_lambda", type=float,
                       help="SR-NN Set-KL weight lambda (0 = plain activation; paper: 0.1, 0.01, 0.001)")
        p.add_argument("--srnn-beta", dest="srnn_beta", type=float, help="SR-NN target sparsity beta (0.05, 0.1, 0.2)")
        p.formatter_class = argparse.RawDescriptionHelpFormatter
        g = p.add_argument_group("probes (logged to each seed's run log)",
                                 f"probes for --probe (--import MODULE adds a plugin's):\n{probe_list()}")
        g.add_argument("--probe", metavar="NAMES",
                       help="comma-separated probes of the list above (default ntk,outputs,sparsity)")
        g.add_argument("--probe-at", dest="probe_at",
                       help="samples seen at which probes run (default 1,25,50,100,150,200; gradcov, which draws k=32 "
                            "distinct samples of those seen, runs from the 32nd sample on)")

    def make_config(self, values: Mapping[str, Any]) -> dict[str, Any]:
        cfg = _stream_config(values)
        probes = values.get("probe", "ntk,outputs,sparsity")
        probes = [p for p in (probes.split(",") if isinstance(probes, str) else probes) if p]
        unknown = [p for p in probes if p not in PROBES]
        if unknown:
            raise ConfigError(f"unknown probe {unknown[0]!r}; choose from {', '.join(sorted(PROBES))}")
        at = _steps(values.get("probe_at", (1, 25, 50, 100, 150, cfg.n)))
        extra = set(values) - SETTINGS - set(cfg.act_kwargs) - {"seed", "probe", "probe_at"}
        if extra:
            raise ConfigError(f"stream-sin does not take {', '.join(sorted(extra))}")
        return {"command": self.name, **_config_dict(cfg), "probe": probes, "probe_at": list(at)}

    def run_dir(self, config: Mapping[str, Any], out: Path) -> Path:
        method = config["act"]
        method += "".join(f"-{k}{_text(config[k])}" for k in sorted(_activation_keys() & set(config)))
        if config["srnn_lambda"] > 0:
            method += f"-srnn-l{config['srnn_lambda']:g}-b{config['srnn_beta']:g}"
        return Path(out) / self.name / method / f"lr{config['lr']:g}"

    def train(self, run: RunFolder) -> dict[str, Any]:
        config, run_dir = run.config, run.path
        cfg = _stream_config(config)
        run.start()
        runners = [stream_probes(cfg, seed, config["probe"], config["probe_at"], run_dir / f"seed{seed}" / "run.h5")
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
        return run.finish({"final_mse": dict(zip(map(str, cfg.seeds), result.final_mse.tolist())),
                           "mean_final_mse": float(result.final_mse.mean())})


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
    config = {"algo": "stream-sin", **_config_dict(cfg), "seeds": None, "seed": seed}
    runner = ProbeRunner(probes, path, example=ctx, config=config, seed=seed, scalars=("test_mse", END), overwrite=True)
    return runner, ctx


class Edit:
    name = "edit"
    help = "local editing (the paper's Figure 2b): fit sin(pi x), move the target at x=1.5 from -1 to -1.5"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        _add_stream_arguments(p)
        d = EditConfig(StreamConfig())
        p.add_argument("--x-edit", dest="x_edit", type=float, help=f"input whose target changes (default {d.x_edit:g})")
        p.add_argument("--target", type=float, help=f"new target there (default {d.target:g})")
        p.add_argument("--tol", type=float, help=f"stop when |f(x_edit) - target| <= tol (default {d.tol:g})")
        p.add_argument("--pretrain-steps", dest="pretrain_steps", type=int,
                       help=f"max full-batch Adam steps fitting sin(pi x) (default {d.pretrain_steps})")
        p.add_argument("--far", type=float, help=f"report the mean change where |x - x_edit| > far (default {d.far:g})")

    def make_config(self, values: Mapping[str, Any]) -> dict[str, Any]:
        cfg = _stream_config(values)
        edit_keys = {f.name for f in fields(EditConfig)} - {"stream"}
        extra = set(values) - SETTINGS - set(cfg.act_kwargs) - edit_keys - {"seed"}
        if extra:
            raise ConfigError(f"edit does not take {', '.join(sorted(extra))}")
        e = EditConfig(cfg, **{k: v for k, v in values.items() if k in edit_keys})
        if e.tol <= 0 or e.far < 0 or e.pretrain_steps <= 0:
            raise ConfigError("tol must be > 0, far >= 0 and pretrain_steps > 0")
        return {"command": self.name, **_config_dict(cfg), **{k: getattr(e, k) for k in sorted(edit_keys)}}

    def run_dir(self, config: Mapping[str, Any], out: Path) -> Path:
        return Path(out) / self.name / config["act"]

    def train(self, run: RunFolder) -> dict[str, Any]:
        config, run_dir = run.config, run.path
        cfg = _stream_config(config)
        run.start()
        edit_keys = {f.name for f in fields(EditConfig)} - {"stream"}
        result = edit(EditConfig(cfg, **{k: config[k] for k in edit_keys}),
                      say=lambda line: print(f"edit {config['act']}: {line}", file=sys.stderr, flush=True))
        n_grid = len(result.x)
        schema = {"edit": {"x": Field((n_grid,)), "before": Field((n_grid,)), "after": Field((n_grid,)),
                           "far_change": Field(()), "steps": Field((), "int64"), "pretrain_mse": Field(())}}
        for i, seed in enumerate(cfg.seeds):
            with RunLog(run_dir / f"seed{seed}" / "edit.h5", config={"algo": "edit", **dict(config), "seeds": None,
                                                                     "seed": seed},
                        seed=seed, probes=schema, overwrite=True) as log:
                log.append("edit", 0, x=result.x, before=result.before[i], after=result.after[i],
                           far_change=result.far_change[i], steps=result.steps[i], pretrain_mse=result.pretrain_mse[i])
        return run.finish({"far_change": dict(zip(map(str, cfg.seeds), result.far_change.tolist())),
                           "mean_far_change": float(result.far_change.mean()),
                           "edit_steps": result.steps.tolist(), "pretrain_mse": result.pretrain_mse.tolist()})


COMMANDS = {"stream-sin": StreamSin(), "edit": Edit()}
