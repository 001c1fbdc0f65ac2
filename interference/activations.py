"""Activation functions of the paper and its baselines, and one registry to build them by name.

All modules act on the last dimension of their input, which holds the hidden units:
``(..., units) -> (..., units_out)``. ``units_out == units`` except for ``Maxout`` (``units / k``) and
``FTA`` (``units * k``); ``output_width(module, units)`` tells the width a module produces.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = [
    "Elephant",
    "Maxout",
    "LWTA",
    "FTA",
    "elephant",
    "make_activation",
    "activation_names",
    "output_width",
]


def _int_pow(u: Tensor, n: int, inplace: bool) -> Tensor:
    """``u ** n`` for an integer ``n >= 1``: squaring, then multiplying by ``u``; a fresh tensor.

    ``inplace=True`` reuses one buffer (allocation dominates these elementwise kernels on CPU); ``False`` keeps
    every step differentiable (for double backward and nested ``torch.func`` transforms).
    """
    if n == 1:
        return u.clone()
    r, k = u * u, 2
    while 2 * k <= n:
        r = r.mul_(r) if inplace else r * r
        k *= 2
    for _ in range(n - k):
        r = r.mul_(u) if inplace else r * u
    return r


def _is_small_int(d: float) -> bool:
    return float(d).is_integer() and 1 <= d <= 64


def _abs_pow(u: Tensor, d: float, inplace: bool) -> Tensor:
    """``|u|^d`` as a fresh tensor; repeated squaring for integer ``d``, ``pow`` otherwise."""
    if _is_small_int(d):
        r = _int_pow(u, int(d), inplace)
        return r if int(d) % 2 == 0 else r.abs()
    return u.abs().pow(d)


def _one_plus_abs_pow(u: Tensor, d: float) -> Tensor:
    """``1 + |u|^d`` as a fresh tensor, computed in place (call without grad); for ``d`` a multiple of 4 the last
    squaring and the ``1 +`` are one ``addcmul``."""
    if _is_small_int(d) and int(d) % 4 == 0:
        r = _int_pow(u, int(d) // 2, inplace=True)
        return torch.addcmul(r.new_ones(()), r, r)
    return _abs_pow(u, d, inplace=True).add_(1.0)


def _value_and_slope(x: Tensor, h: Tensor, a: Tensor, d: float) -> tuple[Tensor, Tensor, Tensor]:
    """``y = h s``, ``s = 1 / (1 + |u|^d)`` and ``dy/dx = -d y s sign(u)|u|^(d-1) / a`` with ``u = x / a``.

    In-place kernels on fresh tensors (call without grad); for the paper's ``d = 4`` nine full-size kernels for
    all three: ``u``, ``u^2``, ``1 + u^4`` (one ``addcmul``), ``s``, ``y``, and ``u^3 s y (-d/a)``.
    """
    u = x / a
    if _is_small_int(d) and int(d) % 4 == 0:
        m = int(d) // 2
        r = _int_pow(u, m, inplace=True)  # u^(d/2)
        s = torch.addcmul(r.new_ones(()), r, r).reciprocal_()
        q = r.mul_(u) if m == 2 else r.mul_(_int_pow(u, m - 1, inplace=True))  # u^(d-1) = sign(u)|u|^(d-1)
    else:
        s = _one_plus_abs_pow(u, d).reciprocal_()
        if _is_small_int(d) and int(d) % 2 == 0:
            q = _int_pow(u, int(d) - 1, inplace=True)
        else:
            q = torch.sign(u) if d == 1 else u.abs().pow_(d - 1).mul_(torch.sign(u))
    y = s * h  # may be wider than x / a (h broadcast to more dims): the slope grows with it
    slope = q.mul_(s).mul_(y) if y.shape == q.shape else q.mul_(s) * y
    return y, s, slope.mul_(a.reciprocal().mul_(-d))


class _ElephantFunction(torch.autograd.Function):
    """y = h / (1 + |x/a|^d) with fused first-order derivatives, taking ``(h, a)`` or, with ``log=True``, the
    module's ``(log h, log a)``. The forward keeps ``s = dy/dh`` and ``dy/dx``, so the backward is
    ``dL/dx = g dy/dx``, ``dL/dh = sum(g s)`` (times ``h`` for ``log h``) and ``dL/dlog a = a dL/da = -sum(dL/dx x)``
    (``y`` depends on ``x / a`` only); ``jvp`` (forward-mode AD) uses the same factors. Under ``create_graph=True``
    the backward differentiates the plain formula instead, so higher derivatives are exact. The output itself is not
    saved, so in-place ops on it stay legal. Written without ``setup_context``: its per-call argument binding costs
    ~40 us, as much as the kernels at RL batch sizes; in exchange it cannot run under ``torch.func`` transforms (see
    :func:`elephant`).
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, h: Tensor, a: Tensor, d: float, log: bool) -> Tensor:  # type: ignore[override]
        y, s, slope = _value_and_slope(x, h.exp() if log else h, a.exp() if log else a, d)
        ctx.save_for_backward(x, h, a, s, slope)
        ctx.save_for_forward(x, h, a, s, slope)
        ctx.d, ctx.log = d, log
        return y

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, h, a, s, slope = ctx.saved_tensors
        needs = ctx.needs_input_grad[:3]
        if torch.is_grad_enabled():  # double backward: the gradient of the differentiable formula
            wanted = [t for t, n in zip((x, h, a), needs) if n]
            y = _elephant_autograd(x, h.exp(), a.exp(), ctx.d) if ctx.log else _elephant_autograd(x, h, a, ctx.d)
            grads = iter(torch.autograd.grad(y, wanted, grad, create_graph=True))
            return tuple(next(grads) if n else None for n in needs) + (None, None)
        need_x, need_h, need_a = needs
        # grad may be batched (is_grads_batched): it enters out of place, in-place ops act on fresh tensors only
        gx = grad * slope if need_x or need_a else None
        gh = _sum_to(grad * s, h.shape) if need_h else None
        ga = _sum_to(gx * x, a.shape).neg_() if need_a else None
        if ctx.log:
            gh = gh.mul_(h.exp()) if gh is not None else None
        elif ga is not None:
            ga = ga.div_(a)
        return (gx if need_x else None), gh, ga, None, None

    @staticmethod
    def jvp(ctx: Any, dx: Tensor | None, dh: Tensor | None, da: Tensor | None, *_: Any) -> Tensor:
        x, h, a, s, slope = ctx.saved_tensors
        dy = torch.zeros_like(slope)
        if dx is not None:
            dy = dy + dx * slope
        if dh is not None:
            dy = dy + dh * (s * h.exp() if ctx.log else s)
        if da is not None:  # dy/da = -(x / a) dy/dx, dy/dlog a = -x dy/dx
            dy = dy - da * (x * slope if ctx.log else x / a * slope)
        return dy


def _sum_to(t: Tensor, shape: torch.Size) -> Tensor:
    """Sum a broadcast gradient back to ``shape`` (the shape of a per-unit parameter); ``t`` itself if it has it."""
    if t.shape == shape:
        return t
    lead = t.dim() - len(shape)
    t = t.sum(dim=tuple(range(lead))) if lead > 0 else t
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and t.shape[i] != 1)
    return t.sum(dim=dims, keepdim=True) if dims else t


def _elephant_autograd(x: Tensor, h: Tensor, a: Tensor, d: float) -> Tensor:
    """The formula in plain differentiable torch ops (repeated squaring for integer ``d``)."""
    return h / (1.0 + _abs_pow(x / a, d, inplace=False))


def elephant(x: Tensor, h: Tensor | float = 1.0, a: Tensor | float = 1.0, d: float = 4.0,
             implementation: str = "auto") -> Tensor:
    """Elephant(x) = h / (1 + |x/a|^d), elementwise; ``h`` and ``a`` broadcast against ``x``.

    ``implementation``: ``"fused"`` (custom autograd function: for ``d = 4`` nine full-size kernels forward, which
    keep ``dy/dx``, then three products and two sums backward), ``"autograd"`` (the same repeated-squaring formula
    in plain torch ops) or ``"auto"`` (fused). Under ``torch.func`` transforms (``vmap``, ``grad``, ``jacrev``,
    ...) both run the plain ops; without grad (acting, target networks) both compute the power in place. All are
    exact and support double backward and forward-mode AD.
    """
    h = torch.as_tensor(h, dtype=x.dtype, device=x.device)
    a = torch.as_tensor(a, dtype=x.dtype, device=x.device)
    return _elephant(x, h, a, float(d), implementation, log=False)


def _elephant(x: Tensor, h: Tensor, a: Tensor, d: float, implementation: str, log: bool) -> Tensor:
    """:func:`elephant` on tensors ``h`` and ``a``, or on ``log h`` and ``log a`` with ``log=True``."""
    if implementation not in ("auto", "fused", "autograd"):
        raise ValueError(f"implementation must be 'auto', 'fused' or 'autograd', got {implementation!r}")
    if not torch.is_grad_enabled():
        if log:
            h, a = h.exp(), a.exp()
        return h / _one_plus_abs_pow(x / a, d)
    # private, but what torch's own autograd.Function.apply asks to choose its path (torch is pinned)
    if implementation == "autograd" or torch._C._are_functorch_transforms_active():
        return _elephant_autograd(x, h.exp(), a.exp(), d) if log else _elephant_autograd(x, h, a, d)
    return _ElephantFunction.apply(x, h, a, d, log)


class Elephant(nn.Module):
    """Elephant activation with one learnable ``h`` and ``a`` per unit (stored as logs, so both stay > 0).

    Args:
        d: slope exponent, fixed (> 0; even integers are fastest).
        h: initial height (> 0).
        a: initial half-width (> 0).
        num_units: number of units on the last input dimension; ``None`` shares one ``h`` and ``a``.
        learnable: ``False`` freezes ``h`` and ``a`` (kept as buffers, not parameters).

    Shape: ``(..., num_units) -> (..., num_units)``.
    """

    def __init__(
        self,
        d: float = 4.0,
        h: float = 1.0,
        a: float = 0.2,
        num_units: int | None = None,
        learnable: bool = True,
    ) -> None:
        super().__init__()
        for name, value in (("d", d), ("h", h), ("a", a)):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"Elephant: {name} must be a positive finite number, got {value!r}")
        if num_units is not None and (not isinstance(num_units, int) or num_units <= 0):
            raise ValueError(f"Elephant: num_units must be a positive int or None, got {num_units!r}")
        self.d = float(d)
        self.num_units = num_units
        self.learnable = learnable
        shape = (num_units,) if num_units is not None else ()
        log_h = torch.full(shape, math.log(h))
        log_a = torch.full(shape, math.log(a))
        if learnable:
            self.log_h = nn.Parameter(log_h)
            self.log_a = nn.Parameter(log_a)
        else:
            self.register_buffer("log_h", log_h)
            self.register_buffer("log_a", log_a)

    @property
    def h(self) -> Tensor:
        """Per-unit height, shape ``(num_units,)`` or ``()``."""
        return self.log_h.exp()

    @property
    def a(self) -> Tensor:
        """Per-unit half-width, shape ``(num_units,)`` or ``()``."""
        return self.log_a.exp()

    def forward(self, x: Tensor) -> Tensor:
        if self.num_units is not None and x.shape[-1] != self.num_units:
            raise ValueError(f"Elephant: expected last input dimension {self.num_units}, got shape {tuple(x.shape)}")
        return _elephant(x, self.log_h, self.log_a, self.d, "auto", log=True)

    def extra_repr(self) -> str:
        return f"d={self.d:g}, num_units={self.num_units}, learnable={self.learnable}"


def _check_group(name: str, k: Any) -> int:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"{name}: k must be a positive int, got {k!r}")
    return k


def _check_divisible(name: str, x: Tensor, k: int) -> None:
    if x.shape[-1] % k:
        raise ValueError(f"{name}(k={k}): input width {x.shape[-1]} is not divisible by k")


class Maxout(nn.Module):
    """Maxout (Goodfellow et al. 2013): the max over each group of ``k`` consecutive units.

    Shape: ``(..., units) -> (..., units // k)``; ``units`` must be divisible by ``k``.
    """

    def __init__(self, k: int = 5) -> None:
        super().__init__()
        self.k = _check_group("Maxout", k)

    def forward(self, x: Tensor) -> Tensor:
        _check_divisible("Maxout", x, self.k)
        return x.unflatten(-1, (-1, self.k)).amax(dim=-1)

    def extra_repr(self) -> str:
        return f"k={self.k}"


class LWTA(nn.Module):
    """Local winner-take-all (Srivastava et al. 2013): in each group of ``k`` units only the largest passes.

    Shape: ``(..., units) -> (..., units)``; ``units`` must be divisible by ``k``. Ties pass together.
    """

    def __init__(self, k: int = 5) -> None:
        super().__init__()
        self.k = _check_group("LWTA", k)

    def forward(self, x: Tensor) -> Tensor:
        _check_divisible("LWTA", x, self.k)
        groups = x.unflatten(-1, (-1, self.k))
        winners = groups == groups.amax(dim=-1, keepdim=True)
        return (groups * winners).flatten(-2)

    def extra_repr(self) -> str:
        return f"k={self.k}"


class FTA(nn.Module):
    """Fuzzy tiling activation (Pan et al. 2020) with ``k`` tiles on ``[-bound, bound]``.

    Each scalar z becomes ``k`` features ``1 - I_eta(max(c - z, 0) + max(z - delta - c, 0))`` with tile starts
    ``c = -bound + i * delta``, ``delta = 2 bound / k`` and fuzziness ``eta`` (default ``delta``), where
    ``I_eta(v) = v`` if ``v <= eta`` else 1. Shape: ``(..., units) -> (..., units * k)``.
    """

    def __init__(self, k: int = 20, bound: float = 20.0, eta: float | None = None) -> None:
        super().__init__()
        self.k = _check_group("FTA", k)
        if not isinstance(bound, (int, float)) or not math.isfinite(bound) or bound <= 0:
            raise ValueError(f"FTA: bound must be a positive finite number, got {bound!r}")
        delta = 2.0 * bound / k
        if eta is None:
            eta = delta
        if not isinstance(eta, (int, float)) or eta < 0:
            raise ValueError(f"FTA: eta must be a non-negative number, got {eta!r}")
        self.bound, self.delta, self.eta = float(bound), delta, float(eta)
        self.register_buffer("tiles", torch.linspace(-bound, bound - delta, k), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        z = x.unsqueeze(-1)
        c = self.tiles.to(dtype=x.dtype)
        v = F.relu(c - z) + F.relu(z - self.delta - c)
        fuzzy = torch.where(v <= self.eta, v, torch.ones_like(v))
        return (1.0 - fuzzy).flatten(-2)

    def extra_repr(self) -> str:
        return f"k={self.k}, bound={self.bound:g}, eta={self.eta:g}"


_Factory = Callable[..., nn.Module]

_REGISTRY: dict[str, tuple[_Factory, tuple[str, ...]]] = {
    "relu": (nn.ReLU, ()),
    "tanh": (nn.Tanh, ()),
    "sigmoid": (nn.Sigmoid, ()),
    "elu": (nn.ELU, ("alpha",)),
    "elephant": (Elephant, ("d", "h", "a", "num_units", "learnable")),
    "maxout": (Maxout, ("k",)),
    "lwta": (LWTA, ("k",)),
    "fta": (FTA, ("k", "bound", "eta")),
}


def activation_names() -> list[str]:
    """Names accepted by :func:`make_activation`."""
    return sorted(_REGISTRY)


def activation_arguments(name: str) -> tuple[str, ...]:
    """Keyword arguments the activation ``name`` takes."""
    return _REGISTRY[_canonical(name)][1]


def _canonical(name: str) -> str:
    key = str(name).lower()
    if key not in _REGISTRY:
        raise ValueError(f"unknown activation {name!r}; choose one of {', '.join(activation_names())}")
    return key


def make_activation(name: str, **kwargs: Any) -> nn.Module:
    """Build an activation module by (case-insensitive) name, e.g. ``make_activation("elephant", d=8, a=0.08)``.

    Raises ``ValueError`` for an unknown name or an argument the activation does not take.
    """
    key = _canonical(name)
    factory, allowed = _REGISTRY[key]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        takes = ", ".join(allowed) if allowed else "no arguments"
        raise ValueError(f"activation {key!r} does not take {', '.join(unknown)}; it takes {takes}")
    return factory(**kwargs)


def output_width(module: nn.Module, units: int) -> int:
    """Width an activation module produces from ``units`` inputs."""
    if isinstance(module, Maxout):
        if units % module.k:
            raise ValueError(f"Maxout(k={module.k}): width {units} is not divisible by k")
        return units // module.k
    if isinstance(module, FTA):
        return units * module.k
    if isinstance(module, LWTA) and units % module.k:
        raise ValueError(f"LWTA(k={module.k}): width {units} is not divisible by k")
    return units
