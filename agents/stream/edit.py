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
from dataclasses import dataclass

import numpy as np
import torch

from interference import ntk

from .learner import Ensemble, StreamConfig, build_net, sine_stream

__all__ = ["EditConfig", "EditResult", "edit"]


@dataclass
class EditConfig:
    stream: StreamConfig
    pretrain_steps: int = 5000
    pretrain_lr: float = 1e-2
    pretrain_tol: float = 1e-3
    x_edit: float = 1.5
    target: float = -1.5
    tol: float = 0.01
    fraction: float = 0.1
    max_steps: int = 10_000
    far: float = 0.2
    n_grid: int = 1000


@dataclass
class EditResult:
    x: np.ndarray  # (n_grid,)
    before: np.ndarray  # (S, n_grid) predictions before the edit
    after: np.ndarray  # (S, n_grid) predictions after it
    pretrain_mse: np.ndarray  # (S,)
    steps: np.ndarray  # (S,) gradient steps the edit took
    far_change: np.ndarray  # (S,) mean |after - before| over |x - x_edit| > far


def edit(cfg: EditConfig, say: Callable[[str], None] | None = None) -> EditResult:
    """Fit, edit and measure every seed of ``cfg.stream.seeds``; ``say`` gets a line at each stage (the
    pre-training takes most of the time)."""
    s = cfg.stream
    say = say or (lambda line: None)
    ens = Ensemble([build_net(s, seed) for seed in s.seeds])
    x, y = sine_stream(s.n)
    opt = torch.optim.Adam(ens.parameters(), lr=cfg.pretrain_lr)
    say(f"pre-training {len(s.seeds)} {s.act} networks on sin(pi x) (full batch, at most {cfg.pretrain_steps:,} "
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
    kernel = torch.stack([ntk(ens.module(i), xe, output="trace")[0, 0] for i in range(len(s.seeds))])
    lr = (cfg.fraction / (2.0 * kernel))[:, None, None]
    params = ens.parameters()
    steps = np.zeros(len(s.seeds), dtype=np.int64)
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
