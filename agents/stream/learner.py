"""Streaming regression on sin(pi x): the paper's section 6.1, with several seeds trained as one ensemble.

The stream holds ``n`` samples with x evenly spaced on [0, 2] (``linspace``, as the authors' loader) and
y = sin(pi x), presented once in increasing x. For each arriving sample the learner makes ``updates`` Adam steps
on ``(f(x_t) - y_t)^2`` (plus the SR-NN penalty if asked) and then measures the test MSE on ``n_test`` evenly
spaced points of [0, 2]. The net is 1-``width``-1 without output bias, built by :func:`interference.mlp`.

Seeds run side by side: each seed's net is built exactly as a lone run would build it, their parameters are
stacked on a leading "seed" dimension, the loss is the sum over seeds and Adam (elementwise) updates each seed's
slice as it would alone. One Python loop then trains all seeds, which is what makes the full table cheap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from agents.allocator import retain_freed_memory
from interference import activation_spec, mlp
from interference.activation_spec import activation_names

from .srnn import set_kl_penalty

__all__ = ["StreamConfig", "StreamResult", "Ensemble", "sine_stream", "train_stream"]


@dataclass
class StreamConfig:
    """Everything that defines one streaming run (per seed)."""

    act: str = field(default="elephant", metadata={"help": "hidden activation", "choices": activation_names})
    lr: float = field(default=3e-4, metadata={"help": "Adam learning rate (the paper's grid is 3e-3, 1e-3, 3e-4, "
                                                      "1e-4, 3e-5, 1e-5)"})
    seeds: tuple[int, ...] = field(default=(0,), metadata={"help": "seeds trained side by side (e.g. 0-4 or 0,2)"})
    n: int = field(default=200, metadata={"help": "stream length"})
    n_test: int = field(default=1000, metadata={"help": "test points on [0, 2]"})
    updates: int = field(default=10, metadata={"help": "Adam updates per arriving sample"})
    width: int = field(default=1000, metadata={"help": "hidden units"})
    d: float = field(default=8.0, metadata={"help": "Elephant slope d (any activation's argument d)"})
    a: float = field(default=0.08, metadata={"help": "Elephant width a (any activation's argument a)"})
    h: float = field(default=1.0, metadata={"help": "Elephant height h (any activation's argument h)"})
    sigma_bias: float = field(default=1.28, metadata={"help": "bias spread of activations that spread their biases, "
                                                              "e.g. Elephant"})
    srnn_lambda: float = field(default=0.0, metadata={"help": "SR-NN Set-KL weight lambda (0 = plain activation; "
                                                              "paper: 0.1, 0.01, 0.001)"})
    srnn_beta: float = field(default=0.1, metadata={"help": "SR-NN target sparsity beta (0.05, 0.1, 0.2)"})
    act_kwargs: dict[str, Any] = field(default_factory=dict)  # the activation's other arguments, where set


@dataclass
class StreamResult:
    test_mse: np.ndarray  # (n_seeds, n): test MSE after each sample
    final_mse: np.ndarray  # (n_seeds,)
    seeds: tuple[int, ...] = field(default=())


def sine_stream(n: int, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """``x`` (n, 1) evenly spaced on [0, 2] and ``y = sin(pi x)`` (n, 1)."""
    x = torch.linspace(0.0, 2.0, n, dtype=dtype)[:, None]
    return x, torch.sin(math.pi * x)


def build_net(cfg: StreamConfig, seed: int) -> nn.Sequential:
    """The paper's 1-width-1 net for one seed, without LayerNorm (the streaming task's setting).

    The activation takes the config's ``d``, ``a`` and ``h`` where its spec has arguments of those names and
    ``act_kwargs``, fixed (``learnable=False`` where it has that argument); the hidden biases are spread with the
    config's ``sigma_bias`` where the spec's convention spreads them (Elephant), zero otherwise.
    """
    torch.manual_seed(seed)
    spec = activation_spec(cfg.act)
    kwargs: dict[str, Any] = {k: getattr(cfg, k) for k in ("d", "a", "h") if k in spec.arguments}
    kwargs.update(cfg.act_kwargs)
    if "learnable" in spec.arguments:
        kwargs["learnable"] = False
    sigma = cfg.sigma_bias if spec.sigma_bias is not None else None
    return mlp(1, [cfg.width], 1, spec.name, kwargs, layer_norm=False, sigma_bias=sigma, output_bias=False)


class Ensemble:
    """One-hidden-layer nets of several seeds with stacked parameters ``(S, ...)``.

    ``forward(x)`` maps ``(B, 1)`` to outputs ``(S, B, 1)`` and hidden features ``(S, B, width)``.
    ``module(i)`` returns seed ``i``'s net as an ordinary ``nn.Module`` holding the current values (for probes).
    """

    def __init__(self, nets: Sequence[nn.Sequential]) -> None:
        self.nets = list(nets)
        first, act, head = self.nets[0]
        if not (isinstance(first, nn.Linear) and isinstance(head, nn.Linear) and head.bias is None):
            raise ValueError("Ensemble expects Linear -> activation -> Linear(bias=False) nets")
        if any(p.requires_grad for p in act.parameters()):
            raise ValueError("Ensemble needs activations without learnable parameters")
        self.act = act
        self.w1 = torch.stack([n[0].weight.detach() for n in self.nets]).requires_grad_()  # (S, W, 1)
        self.b1 = torch.stack([n[0].bias.detach() for n in self.nets]).requires_grad_()  # (S, W)
        self.w2 = torch.stack([n[2].weight.detach() for n in self.nets]).requires_grad_()  # (S, 1, W)

    def parameters(self) -> list[Tensor]:
        return [self.w1, self.b1, self.w2]

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        z = torch.baddbmm(self.b1[:, None, :], x.expand(self.w1.shape[0], *x.shape), self.w1.transpose(1, 2))
        hidden = self.act(z)
        return torch.bmm(hidden, self.w2.transpose(1, 2)), hidden

    def module(self, i: int) -> nn.Sequential:
        net = self.nets[i]
        with torch.no_grad():
            net[0].weight.copy_(self.w1[i])
            net[0].bias.copy_(self.b1[i])
            net[2].weight.copy_(self.w2[i])
        return net


def test_mse(ens: Ensemble, x: Tensor, y: Tensor, chunk: int = 200) -> Tensor:
    """Per-seed MSE ``(S,)`` on ``x`` (N, 1), ``y`` (N, 1), in chunks that stay in cache (3-4x faster than one go)."""
    total = torch.zeros(len(ens.nets))
    with torch.no_grad():
        for i in range(0, len(x), chunk):
            total += (ens.forward(x[i:i + chunk])[0] - y[i:i + chunk]).pow(2).sum(dim=(1, 2))
    return total / len(x)


def train_stream(cfg: StreamConfig, on_sample: Callable[[int, Ensemble, Tensor, Tensor, Tensor], None] | None = None
                 ) -> StreamResult:
    """Run the stream for every seed in ``cfg.seeds``.

    ``on_sample(t, ensemble, x_t, y_t, test_mse)`` is called after the updates on sample ``t`` (1-based count of
    samples seen), with ``test_mse`` of shape ``(S,)``; probes and logging hang off it. Sets the process's allocator
    for training (:func:`agents.allocator.retain_freed_memory`).
    """
    retain_freed_memory()
    x, y = sine_stream(cfg.n)
    x_test, y_test = sine_stream(cfg.n_test)
    ens = Ensemble([build_net(cfg, s) for s in cfg.seeds])
    opt = torch.optim.Adam(ens.parameters(), lr=cfg.lr)
    curves = np.empty((len(cfg.seeds), cfg.n))
    for t in range(cfg.n):
        xt, yt = x[t:t + 1], y[t:t + 1]
        for _ in range(cfg.updates):
            opt.zero_grad(set_to_none=True)
            out, hidden = ens.forward(xt)
            loss = (out - yt).pow(2).sum()  # sum over seeds: each seed's gradient is its own
            if cfg.srnn_lambda > 0:
                loss = loss + cfg.srnn_lambda * set_kl_penalty(hidden, cfg.srnn_beta).sum()
            loss.backward()
            opt.step()
        mse = test_mse(ens, x_test, y_test)
        curves[:, t] = mse.numpy()
        if on_sample is not None:
            on_sample(t + 1, ens, xt, yt, mse)
    return StreamResult(test_mse=curves, final_mse=curves[:, -1], seeds=tuple(cfg.seeds))

