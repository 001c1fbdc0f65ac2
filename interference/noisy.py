"""Factorised Gaussian noisy linear layers (Fortunato et al. 2018, "Noisy Networks for Exploration"), with an NTK rule.

``y = (W_mu + W_sigma * (f(e_out) f(e_in)^T)) x + b_mu + b_sigma * f(e_out)``, ``f(e) = sign(e) sqrt(|e|)``, ``e ~ N(0, 1)``.

The layer holds its current noise ``(eps_in, eps_out)`` (buffers, already passed through ``f``) and a switch
``noise``: on, the forward pass uses the noisy weights; off, the mean weights ``W_mu, b_mu`` (what the probes see by
default). :func:`resample_noise` draws fresh noise for every noisy layer of a module, :func:`set_noise` switches them.

The NTK rule: the per-sample gradient of an output ``g`` (at the layer's output) with respect to ``W_mu`` is
``g x^T`` as for a Linear, and with respect to ``W_sigma`` it is ``(g * eps_out) (x * eps_in)^T``, with respect to
``b_sigma`` ``g * eps_out``: a Linear's factor again, on inputs scaled by ``eps_in`` and output gradients scaled by
``eps_out``. Without noise, ``W_sigma`` and ``b_sigma`` do not reach the output (zero gradients).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .rules import Factor, register_rule

__all__ = ["NoisyLinear", "noisy_layers", "resample_noise", "set_noise", "factorised_noise"]


def _scaled(e: Tensor) -> Tensor:
    return e.sign() * e.abs().sqrt()


class NoisyLinear(nn.Module):
    """A factorised-noise linear layer ``(n, in) -> (n, out)``.

    Initialisation as the paper's: ``W_mu, b_mu ~ U(-1/sqrt(in), 1/sqrt(in))``, ``W_sigma = b_sigma = std_init / sqrt(in)``.
    ``noise`` (attribute): whether the forward pass adds the current noise (default on).
    """

    def __init__(self, in_features: int, out_features: int, std_init: float = 0.5) -> None:
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(f"NoisyLinear needs positive widths, got ({in_features}, {out_features})")
        if not math.isfinite(std_init) or std_init < 0:
            raise ValueError(f"std_init must be a finite number >= 0, got {std_init!r}")
        self.in_features, self.out_features, self.std_init = in_features, out_features, float(std_init)
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features))
        self.weight_sigma = nn.Parameter(torch.empty(out_features, in_features))
        self.bias_mu = nn.Parameter(torch.empty(out_features))
        self.bias_sigma = nn.Parameter(torch.empty(out_features))
        self.register_buffer("eps_in", torch.zeros(in_features))
        self.register_buffer("eps_out", torch.zeros(out_features))
        self.noise = True
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.weight_mu.uniform_(-bound, bound)
            self.bias_mu.uniform_(-bound, bound)
            self.weight_sigma.fill_(self.std_init * bound)
            self.bias_sigma.fill_(self.std_init * bound)

    def resample(self, generator: torch.Generator | None = None) -> None:
        """Draw new factorised noise (from ``generator``, else torch's global RNG)."""
        with torch.no_grad():
            eps_in, eps_out = factorised_noise(self.in_features, self.out_features, generator, self.eps_in.device)
            self.eps_in.copy_(eps_in)
            self.eps_out.copy_(eps_out)

    def forward(self, x: Tensor) -> Tensor:
        if not self.noise:
            return F.linear(x, self.weight_mu, self.bias_mu)
        weight = torch.addcmul(self.weight_mu, self.weight_sigma, torch.outer(self.eps_out, self.eps_in))
        return F.linear(x, weight, torch.addcmul(self.bias_mu, self.bias_sigma, self.eps_out))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, std_init={self.std_init}"


def factorised_noise(in_features: int, out_features: int, generator: torch.Generator | None = None,
                     device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """A noisy layer's new ``(eps_in, eps_out)`` ``(in,), (out,)`` (float32, through ``f``), drawn in this order from
    ``generator`` (else torch's global RNG): what :meth:`NoisyLinear.resample` draws."""
    eps_in = _scaled(torch.randn(in_features, generator=generator, device=device))
    return eps_in, _scaled(torch.randn(out_features, generator=generator, device=device))


def noisy_layers(module: nn.Module) -> Iterator[NoisyLinear]:
    return (m for m in module.modules() if isinstance(m, NoisyLinear))


def resample_noise(module: nn.Module, generator: torch.Generator | None = None) -> None:
    """New noise in every :class:`NoisyLinear` of ``module``."""
    for m in noisy_layers(module):
        m.resample(generator)


def set_noise(module: nn.Module, on: bool) -> list[bool]:
    """Switch the noise of every :class:`NoisyLinear` of ``module``; returns the previous switches (in order)."""
    layers = list(noisy_layers(module))
    before = [m.noise for m in layers]
    for m in layers:
        m.noise = bool(on)
    return before


def _noisy_rule(mod: NoisyLinear, inp: Tensor, gout: Tensor, use: frozenset[str]) -> list[Factor]:
    """Per-sample gradients of ``mod``'s parameters in ``use`` as Linear factors (module docstring)."""
    out = []
    if {"weight_mu", "bias_mu"} & use:
        out.append(Factor.linear(inp if "weight_mu" in use else None, gout, "bias_mu" in use))
    if mod.noise and {"weight_sigma", "bias_sigma"} & use:
        a = inp * mod.eps_in if "weight_sigma" in use else None
        out.append(Factor.linear(a, gout * mod.eps_out, "bias_sigma" in use))
    return out


def _two_dims(mod: nn.Module, inp: Tensor) -> str | None:
    return None if inp.dim() == 2 else f"input of {inp.dim()} dimensions (needs (n, in_features))"


register_rule(NoisyLinear, _noisy_rule, ("weight_mu", "weight_sigma", "bias_mu", "bias_sigma"),
              refuse_input=_two_dims)
