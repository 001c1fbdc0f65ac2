"""Local editing (the paper's Figure 2b): fit sin(pi x), then change one target and see what else moves.

Each seed's net is first fitted to the ``n`` stream points by full-batch Adam (until every seed's MSE is below
``pretrain_tol``, at most ``pretrain_steps``), then the target
at ``x_edit`` changes from sin(pi x_edit) to ``target`` and the net takes plain gradient steps on that point only
until its prediction there is within ``tol`` of ``target``. Plain SGD (no momentum), so a seed that has arrived stops
moving. Its step size is ``fraction / (2 K(x_edit, x_edit))`` with ``K`` the NTK at the edit point, so every net
closes about the same fraction of the gap per step, whatever its activation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from interference import ntk

from .learner import Ensemble, StreamConfig, build_net, sine_stream

__all__ = ["EditConfig", "EditResult", "edit"]


def _s(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass
class EditConfig(StreamConfig):
    """The stream's settings (its SR-NN settings unused) and the edit's."""

    far: float = _s(0.2, "report the mean change where |x - x_edit| > far")
    fraction: float = _s(0.1, "fraction of the gap at x_edit each gradient step closes (step size fraction / 2K)")
    max_steps: int = _s(10_000, "most gradient steps of the edit")
    n_grid: int = _s(1000, "points on [0, 2] where the change is measured")
    pretrain_lr: float = _s(1e-2, "Adam learning rate fitting sin(pi x)")
    pretrain_steps: int = _s(5000, "max full-batch Adam steps fitting sin(pi x)")
    pretrain_tol: float = _s(1e-3, "fit until every seed's MSE is below this")
    target: float = _s(-1.5, "new target at x_edit")
    tol: float = _s(0.01, "stop when |f(x_edit) - target| <= tol")
    x_edit: float = _s(1.5, "input whose target changes")


@dataclass
class EditResult:
    x: np.ndarray  # (n_grid,)
    before: np.ndarray  # (S, n_grid) predictions before the edit
    after: np.ndarray  # (S, n_grid) predictions after it
    pretrain_mse: np.ndarray  # (S,)
    steps: np.ndarray  # (S,) gradient steps the edit took
    far_change: np.ndarray  # (S,) mean |after - before| over |x - x_edit| > far


def edit(cfg: EditConfig, say: Callable[[str], None] | None = None) -> EditResult:
    """Fit, edit and measure every seed of ``cfg.seeds``; ``say`` gets a line at each stage (the
    pre-training takes most of the time)."""
    say = say or (lambda line: None)
    ens = Ensemble([build_net(cfg, seed) for seed in cfg.seeds])
    x, y = sine_stream(cfg.n)
    opt = torch.optim.Adam(ens.parameters(), lr=cfg.pretrain_lr)
    say(f"pre-training {len(cfg.seeds)} {cfg.act} networks on sin(pi x) (full batch, at most {cfg.pretrain_steps:,} "
        f"Adam steps, until every MSE < {cfg.pretrain_tol:g})")
    for step in range(cfg.pretrain_steps):
        opt.zero_grad(set_to_none=True)
        mse = (ens.forward(x)[0] - y).pow(2).mean(dim=(1, 2))
        if mse.max() < cfg.pretrain_tol:
            break
        if step and step % 5000 == 0:
            say(f"  step {step:,}: worst MSE {mse.max().item():.3g}")
        mse.sum().backward()
        opt.step()
    say(f"pre-trained (worst MSE {mse.max().item():.3g}); editing f({cfg.x_edit:g}) to {cfg.target:g}")
    grid = torch.linspace(0.0, 2.0, cfg.n_grid)[:, None]
    with torch.no_grad():
        before = ens.forward(grid)[0][..., 0]
        pretrain_mse = (ens.forward(x)[0] - y).pow(2).mean(dim=(1, 2))
    xe = torch.tensor([[cfg.x_edit]])
    kernel = torch.stack([ntk(ens.module(i), xe, output="trace")[0, 0] for i in range(len(cfg.seeds))])
    lr = (cfg.fraction / (2.0 * kernel))[:, None, None]
    params = ens.parameters()
    steps = np.zeros(len(cfg.seeds), dtype=np.int64)
    for _ in range(cfg.max_steps):
        pred = ens.forward(xe)[0][:, 0, 0]
        active = ((pred - cfg.target).abs() > cfg.tol).detach()
        if not active.any():
            break
        steps += active.numpy()
        loss = ((pred - cfg.target).pow(2) * active).sum()
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= lr.reshape(-1, *[1] * (p.dim() - 1)) * g
    else:
        raise RuntimeError(f"edit did not reach the target within {cfg.max_steps} steps; raise max_steps")
    with torch.no_grad():
        after = ens.forward(grid)[0][..., 0]
    far = (grid[:, 0] - cfg.x_edit).abs() > cfg.far
    change = (after - before).abs()[:, far].mean(dim=1)
    return EditResult(x=grid[:, 0].numpy(), before=before.numpy(), after=after.numpy(),
                      pretrain_mse=pretrain_mse.numpy(), steps=steps, far_change=change.numpy())
