"""Activation functions of the paper and its baselines (their specs, registry and conventions:
:mod:`interference.activation_spec`).

All modules act on the last dimension of their input, which holds the hidden units:
``(..., units) -> (..., units_out)``. ``units_out == units`` except for ``Maxout`` (``units / k``) and
``FTA`` (``units * k``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .rules import Factor, register_rule, sum_positions

__all__ = [
    "Elephant",
    "Maxout",
    "LWTA",
    "FTA",
    "elephant",
]


_HALF = (torch.float16, torch.bfloat16)


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
    """``y = h s``, ``s = 1 / (1 + |u|^d)`` and ``dy/dx`` with ``u = x / a``, finite for every finite ``x``.

    ``dy/dx = -(d/a) y sign(u)|u|^(d-1) s`` is computed as ``-d y / (x + a / q)`` with ``q = sign(u)|u|^(d-1)``
    (``a (u + 1/q) = a sign(u)(|u| + |u|^(1-d))``), which never forms ``inf * 0``: an overflowing ``q`` (and
    ``|u|^d``) gives ``a / q = 0`` (and ``s = 0``, the correctly rounded value up to ``1 / max`` of the dtype), and
    ``u = 0`` gives ``a / q = inf`` and a slope of 0. In-place kernels on fresh tensors (call without grad); for the
    paper's ``d = 4`` eight full-size kernels for all three: ``u``, ``u^2``, ``1 + u^4`` (one ``addcmul``), ``s``,
    ``u^3``, ``x + a / u^3`` (one ``addcdiv``), ``y`` and ``-d y / (x + a / u^3)`` (one ``addcdiv``).
    """
    u = x / a
    n = int(d) if _is_small_int(d) else 0
    if n and n % 4 == 0:
        m = n // 2
        r = _int_pow(u, m, inplace=True)  # u^(d/2)
        s = torch.addcmul(r.new_ones(()), r, r).reciprocal_()
        q = r.mul_(u) if m == 2 else r.mul_(_int_pow(u, m - 1, inplace=True))  # u^(d-1) = sign(u)|u|^(d-1)
    else:
        s = _one_plus_abs_pow(u, d).reciprocal_()
        if n == 1:
            q = None
        elif n == 2:
            q = u
        elif n and n % 2 == 0:
            q = _int_pow(u, n - 1, inplace=True)  # odd power: carries sign(u)
        elif n:
            q = _int_pow(u, n - 1, inplace=True).copysign_(u)  # even power |u|^(d-1), given sign(u)
        else:
            q = u.abs().pow_(d - 1).copysign_(u)
    y = s * h  # may be wider than x / a (h broadcast to more dims): the slope grows with it
    if q is None:  # d = 1: dy/dx = -y s sign(u) / a (0 at the kink u = 0, as autograd of |u| gives)
        slope = torch.sign(u).mul_(s)
        slope = slope.mul_(y) if y.shape == slope.shape else slope * y
        return y, s, slope.mul_(a.reciprocal().neg_())
    t = torch.addcdiv(x, a, q, out=u)  # x + a/q = a sign(u)(|u| + |u|^(1-d)): |t| in [|x|, inf]
    zero = y.new_zeros(())
    if y.shape == t.shape and y.dtype == t.dtype:
        slope = torch.addcdiv(zero, y, t, value=-d, out=t)
    else:
        slope = torch.addcdiv(zero, y, t, value=-d)
    return y, s, slope


def _elephant_log_derivatives(x: Tensor, log_h: Tensor, log_a: Tensor, d: float) -> tuple[Tensor, Tensor]:
    """``dy/dlog h = y`` and ``dy/dlog a = -x dy/dx`` of ``y = h / (1 + |x/a|^d)`` (``h``, ``a`` broadcast against
    ``x``), without grad and finite everywhere (the fused kernels of :func:`_value_and_slope`); float16 and bfloat16
    are computed in float32 and rounded once."""
    out = torch.promote_types(x.dtype, torch.promote_types(log_h.dtype, log_a.dtype))
    work = torch.float32 if out in _HALF else out
    with torch.no_grad():
        x, log_h, log_a = (t.detach().to(work) for t in (x, log_h, log_a))
        y, _, slope = _value_and_slope(x, log_h.exp(), log_a.exp(), d)
        dlog_a = slope.mul_(x).neg_()  # slope has the broadcast shape of x, h and a
    return y.to(out), dlog_a.to(out)


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
    """The formula in plain differentiable torch ops whose derivatives of every order are finite.

    ``|u|^d`` overflows (and its derivative with it, ``0 * inf = nan`` in the chain rule) long before ``s`` underflows,
    so for ``|u| > 1`` the power is taken of ``r = 1/|u|`` instead: ``s = r^d / (1 + r^d)``; below, ``r = |u|`` and
    ``s = 1 / (1 + r^d)``. ``r`` stays in ``[0, 1]``, and the branch ``torch.where`` leaves out never divides by 0
    (the inner ``where`` feeds it 1), so the zero gradient it gets stays 0. Repeated squaring for integer ``d``.
    """
    au = (x / a).abs()
    big = au > 1.0
    r = torch.where(big, torch.where(big, au, 1.0).reciprocal(), au)
    p = _int_pow(r, int(d), inplace=False) if _is_small_int(d) else r.pow(d)
    return h * (torch.where(big, p, 1.0) / (1.0 + p))


def elephant(x: Tensor, h: Tensor | float = 1.0, a: Tensor | float = 1.0, d: float = 4.0,
             implementation: str = "auto") -> Tensor:
    """Elephant(x) = h / (1 + |x/a|^d), elementwise; ``h`` and ``a`` broadcast against ``x``.

    ``implementation``: ``"fused"`` (custom autograd function: for ``d = 4`` eight full-size kernels forward, which
    keep ``dy/dx``, then three products and two sums backward), ``"autograd"`` (the formula in plain torch ops,
    repeated squaring of ``|u|`` or ``1/|u|``) or ``"auto"`` (fused). Under ``torch.func`` transforms (``vmap``,
    ``grad``, ``jacrev``, ...) both run the plain ops; without grad (acting, target networks) both compute the power
    in place. All are exact and support double backward and forward-mode AD. Values and derivatives are finite for
    every finite ``x`` (no ``inf * 0`` where a power overflows); float16 and bfloat16 are computed in float32 and
    rounded once.
    """
    if isinstance(d, bool):
        raise ValueError(f"elephant: d must be a number, not a bool ({d!r})")
    h = torch.as_tensor(h, dtype=x.dtype, device=x.device)
    a = torch.as_tensor(a, dtype=x.dtype, device=x.device)
    return _elephant(x, h, a, float(d), implementation, log=False)


def _elephant(x: Tensor, h: Tensor, a: Tensor, d: float, implementation: str, log: bool) -> Tensor:
    """:func:`elephant` on tensors ``h`` and ``a``, or on ``log h`` and ``log a`` with ``log=True``."""
    if implementation not in ("auto", "fused", "autograd"):
        raise ValueError(f"implementation must be 'auto', 'fused' or 'autograd', got {implementation!r}")
    out = torch.promote_types(x.dtype, torch.promote_types(h.dtype, a.dtype))
    if out in _HALF:  # computed in float32 and rounded once (autograd through the casts): correctly rounded values
        return _elephant(x.float(), h.float(), a.float(), d, implementation, log).to(out)
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
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"Elephant: {name} must be a positive finite number, got {value!r}")
        if num_units is not None and (isinstance(num_units, bool) or not isinstance(num_units, int) or num_units <= 0):
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


def _elephant_rule(mod: Elephant, inp: Tensor, gout: Tensor, use: frozenset[str]) -> list[Factor]:
    """The NTK engine's rule for :class:`Elephant` (see :mod:`interference.rules`): ``dy/dlog h = y`` and
    ``dy/dlog a = -x dy/dx`` from the numerically safe fused kernels, summed over the positions that share a unit;
    one column per unit, or one for a shared ``h`` and ``a``."""
    o, n = gout.shape[:2]
    y, dlog_a = _elephant_log_derivatives(inp, mod.log_h, mod.log_a, mod.d)
    lead = (o, n, -1, 1) if mod.num_units is None else (o, n, -1, inp.shape[-1])
    out = []
    for name, dy in (("log_h", y), ("log_a", dlog_a)):
        if name in use:
            out.append(Factor.dense(sum_positions((gout * dy.to(gout.dtype)).reshape(lead))))
    return out


register_rule(Elephant, _elephant_rule, ("log_h", "log_a"))
