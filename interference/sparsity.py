"""Function sparsity (the paper's Definition 1) and representation sparsity of hidden activations.

``S_eps,C(sigma) = |{x in [-C, C] : |sigma(x)| <= eps}| / 2C``. It is computed by locating every crossing of
``|sigma(x)| = eps`` on a grid (uniform near 0, geometric further out) and refining each with Brent's method, so
the measure is exact to ``xtol`` per crossing as long as ``|sigma| - eps`` changes sign at most once between two
neighbouring grid nodes (true for every activation here: their level sets have at most a few points).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import brentq
from torch import Tensor

__all__ = [
    "sparse_measure",
    "function_sparsity",
    "gradient_sparsity",
    "derivative",
    "SparsityLimit",
    "sparsity_limit",
    "representation_sparsity",
    "dormant_units",
    "saturated_units",
]

ScalarFn = Callable[[Tensor], Tensor]


def derivative(fn: ScalarFn) -> ScalarFn:
    """Elementwise derivative of an elementwise function, by autograd (exact, not finite differences)."""

    def d(x: Tensor) -> Tensor:
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(fn(x).sum(), x)
        return g

    return d


def _grid(c: float, points: int) -> np.ndarray:
    """Symmetric grid on [-c, c]: uniform on [-1, 1] (where activations bend) and geometric beyond."""
    inner = np.linspace(-min(c, 1.0), min(c, 1.0), points)
    if c <= 1.0:
        return inner
    outer = np.geomspace(1.0, c, points)[1:]
    return np.concatenate([-outer[::-1], inner, outer])


def sparse_measure(fn: ScalarFn, eps: float, c: float, *, points: int = 20001, xtol: float = 1e-12) -> float:
    """Lebesgue measure of ``{x in [-c, c] : |fn(x)| <= eps}`` (``fn`` elementwise, evaluated in float64)."""
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    if not c > 0:
        raise ValueError(f"C must be > 0, got {c!r}")

    def g(x: np.ndarray | float) -> np.ndarray:
        t = torch.as_tensor(np.atleast_1d(x), dtype=torch.float64)
        return fn(t).abs().detach().numpy() - eps

    xs = _grid(float(c), points)
    vals = g(xs)
    inside = vals <= 0
    widths = np.diff(xs)
    total = float(widths[inside[:-1] & inside[1:]].sum())
    for i in np.flatnonzero(inside[:-1] != inside[1:]):  # one crossing in each such interval
        lo, hi = xs[i], xs[i + 1]
        root = brentq(lambda z: float(g(z)[0]), lo, hi, xtol=xtol)
        total += (root - lo) if inside[i] else (hi - root)
    return total


def function_sparsity(fn: ScalarFn, eps: float, c: float, **kwargs: float) -> float:
    """``S_eps,C(fn)``: the fraction of ``[-c, c]`` where ``|fn| <= eps`` (Definition 1)."""
    return sparse_measure(fn, eps, c, **kwargs) / (2.0 * c)


def gradient_sparsity(fn: ScalarFn, eps: float, c: float, **kwargs: float) -> float:
    """``S_eps,C(fn')``: the same for the derivative, taken by autograd."""
    return function_sparsity(derivative(fn), eps, c, **kwargs)


@dataclass(frozen=True)
class SparsityLimit:
    """Estimate of ``S(sigma) = lim_{eps->0} lim_{C->inf} S_eps,C(sigma)`` with the values it came from."""

    estimate: float
    eps: tuple[float, ...]
    c: tuple[float, ...]
    values: tuple[tuple[float, ...], ...]  # values[i][j] = S_{eps[i], c[j]}


def sparsity_limit(
    fn: ScalarFn,
    *,
    gradient: bool = False,
    eps: tuple[float, ...] = (1e-2, 1e-3, 1e-4),
    c: tuple[float, ...] = (1e2, 1e4, 1e6),
) -> SparsityLimit:
    """Estimate ``S(fn)`` (or ``S(fn')`` with ``gradient=True``) from a table of ``S_eps,C``.

    The inner limit is read at the largest ``C``, the outer at the smallest ``eps``; ``values`` lets a caller
    check that both have converged (the error of the inner limit is O(w(eps) / C) for a near-zero set of width
    w(eps) around the origin).
    """
    f = derivative(fn) if gradient else fn
    table = tuple(tuple(function_sparsity(f, e, cc) for cc in c) for e in eps)
    return SparsityLimit(estimate=table[-1][-1], eps=tuple(eps), c=tuple(c), values=table)


def _check_units(name: str, h: Tensor) -> Tensor:
    if not isinstance(h, Tensor):
        raise TypeError(f"{name}: expected a tensor of hidden activations (N, units), got {type(h).__name__}")
    if h.dim() < 2:
        raise ValueError(f"{name}: expected shape (N, units) or (N, ..., units), got {tuple(h.shape)}")
    return h.detach().reshape(-1, h.shape[-1])


def representation_sparsity(h: Tensor, eps: float) -> float:
    """Fraction of entries of a batch of hidden activations ``h`` (N, units) with ``|h| <= eps``."""
    return float((_check_units("representation_sparsity", h).abs() <= eps).double().mean())


def dormant_units(h: Tensor, tau: float) -> Tensor:
    """Mask (units,) of dormant units: ``mean|h_i| / mean_j mean|h_j| <= tau`` over the batch (Sokar et al. 2023).

    With ``tau = 0`` this is the ReLU notion of a dead unit (zero on every input).
    """
    a = _check_units("dormant_units", h).abs().mean(0)
    scale = a.mean()
    if scale == 0:
        return torch.ones_like(a, dtype=torch.bool)
    return a / scale <= tau


def saturated_units(dphi: Tensor, eps: float, fraction: float = 1.0) -> Tensor:
    """Mask (units,) of units whose activation derivative ``|phi'(z)| <= eps`` on at least ``fraction`` of the batch.

    ``dphi`` holds ``phi'`` at each unit's pre-activation (N, units). Such a unit passes (almost) no gradient to
    the layers below it on these inputs, which covers dead ReLUs, saturated Tanh/Sigmoid and Elephant units whose
    inputs all sit on the flat tails.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    d = _check_units("saturated_units", dphi)
    return (d.abs() <= eps).double().mean(0) >= fraction
