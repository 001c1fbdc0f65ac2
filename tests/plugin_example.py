"""A plugin module as a user would write one (tests import it with ``--import plugin_example``): a test-only
activation, a test-only probe with a schema and a toy algorithm with its own loop, each registered once."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from agents.algorithm import Algorithm
from agents.commands import register_command
from agents.lifecycle import RunFolder
from interference import ActArg, ActivationSpec, register_activation
from probes import Probe, ProbeContext, ProbeRunner, register_probe
from runlog import Field, FieldDoc, ProbeSchema


class ScaledCReLU(nn.Module):
    """``scale * [relu(x), gamma * relu(-x)]``: twice as many outputs as inputs."""

    def __init__(self, scale: float = 1.0, gamma: float = 1.0) -> None:
        super().__init__()
        self.scale, self.gamma = float(scale), float(gamma)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * torch.cat([torch.relu(x), self.gamma * torch.relu(-x)], dim=-1)


register_activation(ActivationSpec(
    "test_crelu", ScaledCReLU, {"scale": ActArg(float, "CReLU output scale"),
                                # named like an RL setting: set with --set act_kwargs=..., never shadows --set gamma
                                "gamma": ActArg(float, "CReLU weight of the negative half")},
    layer_norm=True, sigma_bias=0.1,
    width_rule=lambda module, width: 2 * width))


@register_probe
class MeanAbsOutput(Probe):
    """Mean |output| of the model on the probe inputs, overall and per output."""

    name = "mean_abs_output"
    schema = ProbeSchema("Output magnitude", {
        "overall": FieldDoc("mean |f(x)| over probe inputs and outputs", "|f|", plot="curve"),
        "per_output": FieldDoc("mean |f(x)| per output", "|f|", ("output",), plot="per_layer"),
    })

    def fields(self, ctx: ProbeContext) -> dict[str, Field]:
        with torch.no_grad():
            n_out = ctx.model(ctx.inputs[:1]).reshape(1, -1).shape[1]
        return {"overall": Field(()), "per_output": Field((n_out,))}

    def compute(self, ctx: ProbeContext) -> dict[str, np.ndarray]:
        with torch.no_grad():
            y = ctx.model(ctx.inputs).reshape(len(ctx.inputs), -1).abs()
        return {"overall": np.float32(y.mean()), "per_output": y.mean(dim=0).numpy().astype(np.float32)}


@dataclass
class ToyConfig:
    seed: int = 0
    steps: int = field(default=60, metadata={"help": "SGD updates on a fixed regression task"})
    lr: float = field(default=0.05, metadata={"help": "learning rate"})
    act: str = "tanh"
    probe: list[str] = field(default_factory=lambda: ["mean_abs_output"])

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")


def train_toy(run: RunFolder, cfg: ToyConfig) -> dict:
    """A 2-16-1 MLP fitting y = sum(x) by SGD, its loss logged and probed every 10 updates."""
    from interference import mlp
    from probes import make_probe

    torch.manual_seed(cfg.seed)
    model = mlp(2, [16], 1, cfg.act)
    x = torch.randn(64, 2)
    y = x.sum(dim=1, keepdim=True)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    ctx = ProbeContext(step=0, model=model, inputs=x[:8])
    probes = [make_probe(name, every=10) for name in cfg.probe]
    config = {"algo": "toy", **cfg.__dict__}
    with ProbeRunner(probes, run.path / "run.h5", example=ctx, config=config, seed=cfg.seed,
                     scalars=("loss",), overwrite=True) as runner:
        for step in range(1, cfg.steps + 1):
            loss = (model(x) - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            runner.scalar("loss", step, loss.item())
            ctx.step = step
            runner.on_step(ctx)
    return {"final_loss": loss.item()}


register_command(Algorithm("toy", "toy regression learner (test plugin)", ToyConfig, train_toy, folder=("act",)))
