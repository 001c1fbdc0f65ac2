"""Function sparsity (the paper's Definition 1) and representation sparsity of hidden activations.

``S_eps,C(sigma) = |{x in [-C, C] : |sigma(x)| <= eps}| / 2C``.

The measure is found cell by cell with a local bound on ``|sigma'|`` and vectorised root finding; the
method, when its bound holds and the error that remains are in :mod:`interference.level_set`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
import torch
from torch import Tensor

from .level_set import ScalarFn, derivative, measures

__all__ = [
    "sparse_measure",
    "function_sparsity",
    "gradient_sparsity",
    "derivative",
    "SparsityLimit",
    "sparsity_limit",
    "representation_sparsity",
    "dormant_scores",
    "dormant_units",
    "saturated_units",
]

def _check_fn(func: str, fn: object) -> None:
    if not callable(fn):
        raise TypeError(f"{func}: fn must be an elementwise callable Tensor -> Tensor, got {type(fn).__name__}")


def _check_number(func: str, name: str, value: object, *, zero_ok: bool = False) -> float:
    """``value`` as a float; a clear error naming ``func`` and the argument ``name`` unless it is a finite real
    number > 0 (``>= 0`` with ``zero_ok``)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{func}: {name} must be a real number, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) and (v >= 0 if zero_ok else v > 0)):
        raise ValueError(f"{func}: {name} must be {'>= 0' if zero_ok else '> 0'} and finite, got {value!r}")
    return v


def _check_points(func: str, points: object) -> int:
    if isinstance(points, bool) or not isinstance(points, Integral):
        raise TypeError(f"{func}: points must be an int >= 3, got {points!r}")
    if points < 3:
        raise ValueError(f"{func}: points must be an int >= 3, got {points!r}")
    return int(points)


def _checked(func: str, fn: object, eps: object, c: object, points: object,
             xtol: object) -> tuple[float, float, int, float]:
    """The arguments of :func:`sparse_measure` and friends, checked: (eps, c, points, xtol)."""
    _check_fn(func, fn)
    return (_check_number(func, "eps", eps), _check_number(func, "c", c), _check_points(func, points),
            _check_number(func, "xtol", xtol))


def sparse_measure(fn: ScalarFn, eps: float, c: float, *, points: int = 20001, xtol: float = 1e-12) -> float:
    """Lebesgue measure of ``{x in [-c, c] : |fn(x)| <= eps}`` (``fn`` elementwise, evaluated in float64; ``c``
    is the paper's ``C``).

    ``points``: samples per piece ([-c, -1], [-1, 1], [1, c]) before refinement; ``xtol``: the tolerance of each
    crossing (never below 4 ulp of x), and times ``max(1, c)`` the narrowest cell refined. The method, the local
    derivative bound it relies on and the error that remains are in the module docstring.
    """
    e, cc, n, tol = _checked("sparse_measure", fn, eps, c, points, xtol)
    return measures("sparse_measure", fn, [e], cc, n, tol)[0]


def function_sparsity(fn: ScalarFn, eps: float, c: float, *, points: int = 20001, xtol: float = 1e-12) -> float:
    """``S_eps,C(fn)``: the fraction of ``[-c, c]`` where ``|fn| <= eps`` (Definition 1); see :func:`sparse_measure`."""
    e, cc, n, tol = _checked("function_sparsity", fn, eps, c, points, xtol)
    return measures("function_sparsity", fn, [e], cc, n, tol)[0] / (2.0 * cc)


def gradient_sparsity(fn: ScalarFn, eps: float, c: float, *, points: int = 20001, xtol: float = 1e-12) -> float:
    """``S_eps,C(fn')``: the same for the derivative, taken by autograd (its bound uses ``fn''``)."""
    e, cc, n, tol = _checked("gradient_sparsity", fn, eps, c, points, xtol)
    return measures("gradient_sparsity", derivative(fn), [e], cc, n, tol)[0] / (2.0 * cc)


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
    eps: Sequence[float] = (1e-2, 1e-3, 1e-4),
    c: Sequence[float] = (1e2, 1e4, 1e6),
) -> SparsityLimit:
    """Estimate ``S(fn)`` (or ``S(fn')`` with ``gradient=True``) from a table of ``S_eps,C``.

    The inner limit is read at the last ``c``, the outer at the last ``eps`` (give them in increasing ``c`` and
    decreasing ``eps``); ``values`` lets a caller check that both have converged (the error of the inner limit is
    O(w(eps) / C) for a near-zero set of width w(eps) around the origin). [-1, 1] is sampled once for all ``c``.
    """
    func = "sparsity_limit"
    _check_fn(func, fn)
    if not isinstance(gradient, bool):
        raise TypeError(f"{func}: gradient must be a bool, got {gradient!r}")
    checked = {}
    for name, seq in (("eps", eps), ("c", c)):
        if (isinstance(seq, (str, bytes)) or not isinstance(seq, (Sequence, np.ndarray)) or np.ndim(seq) != 1
                or len(seq) == 0):
            raise ValueError(f"{func}: {name} must be a non-empty sequence of numbers, got {seq!r}")
        checked[name] = tuple(_check_number(func, f"{name}[{i}]", v) for i, v in enumerate(seq))
    f = derivative(fn) if gradient else fn
    shared: dict = {}  # first cells per piece of [-c, c], shared by every c
    columns = [measures(func, f, checked["eps"], cc, 20001, 1e-12, shared) for cc in checked["c"]]
    table = tuple(tuple(col[i] / (2.0 * cc) for col, cc in zip(columns, checked["c"]))
                  for i in range(len(checked["eps"])))
    return SparsityLimit(estimate=table[-1][-1], eps=checked["eps"], c=checked["c"], values=table)


def _check_units(name: str, h: Tensor) -> Tensor:
    """``h`` (N, ..., units) as a detached (N * ..., units) matrix, or a clear error naming the function ``name``."""
    if not isinstance(h, Tensor):
        raise TypeError(f"{name}: expected a tensor of hidden activations (N, units), got {type(h).__name__}")
    if h.dim() < 2:
        raise ValueError(f"{name}: expected shape (N, units) or (N, ..., units), got {tuple(h.shape)}")
    if h.numel() == 0:
        what = "the batch is empty" if h.shape[-1] else "there are no units"
        raise ValueError(f"{name}: {what} (shape {tuple(h.shape)}); it needs at least one sample and one unit")
    return h.detach().reshape(-1, h.shape[-1])


def representation_sparsity(h: Tensor, eps: float) -> float:
    """Fraction of entries of a batch of hidden activations ``h`` (N, units) with ``|h| <= eps`` (``eps >= 0``)."""
    e = _check_number("representation_sparsity", "eps", eps, zero_ok=True)
    return float((_check_units("representation_sparsity", h).abs() <= e).double().mean())


def dormant_scores(h: Tensor) -> Tensor:
    """ReDo scores (units,) of activations ``h`` (N, units): ``mean|h_i| / mean_j mean|h_j|`` over the batch (Sokar
    et al. 2023); all 0 when the whole layer is zero."""
    a = _check_units("dormant_scores", h).abs().mean(0)
    scale = a.mean()
    return torch.zeros_like(a) if scale == 0 else a / scale


def dormant_units(h: Tensor, tau: float) -> Tensor:
    """Mask (units,) of ReDo-dormant units: :func:`dormant_scores` ``<= tau`` (0.025 and 0.1 are the usual values).

    With ``tau = 0`` this is the ReLU notion of a dead unit (zero on every input). Compare :func:`saturated_units`,
    which looks at the derivative (see :mod:`interference.plasticity` for the two side by side).
    """
    t = _check_number("dormant_units", "tau", tau, zero_ok=True)
    _check_units("dormant_units", h)
    return dormant_scores(h) <= t


def saturated_units(dphi: Tensor, eps: float, fraction: float = 1.0) -> Tensor:
    """Mask (units,) of units whose activation derivative ``|phi'(z)| <= eps`` on at least ``fraction`` of the batch.

    ``dphi`` holds ``phi'`` at each unit's pre-activation (N, units). Such a unit passes (almost) no gradient to
    the layers below it on these inputs, which covers dead ReLUs, saturated Tanh/Sigmoid and Elephant units whose
    inputs all sit on the flat tails.
    """
    e = _check_number("saturated_units", "eps", eps, zero_ok=True)
    if isinstance(fraction, bool) or not isinstance(fraction, Real) or not 0.0 < fraction <= 1.0:
        raise ValueError(f"saturated_units: fraction must be in (0, 1], got {fraction!r}")
    d = _check_units("saturated_units", dphi)
    return (d.abs() <= e).double().mean(0) >= fraction
