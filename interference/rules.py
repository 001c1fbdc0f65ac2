"""Layer-wise rules: the public seam through which the NTK engine learns a module type (BackPACK-style).

A rule turns one call of a module into the per-sample Jacobian of the model's outputs with respect to the module's
own parameters, from two things the engine records: the module's input ``inp`` ``(n, *in_shape)`` (rows are the
samples; the engine proves it before it uses a rule) and the gradient of each of the ``O`` model outputs at the
module's output, ``gout`` ``(O, n, *out_shape)``. It returns :class:`Factor` s whose Gram matrices add up to the Gram
matrix of those per-sample gradients.

The engine gives a parameter to a rule only when it can prove the rule covers it (see :func:`interference.explain`):
the module's type is exactly the registered type, it has no hooks or parametrizations, it ran once per forward on an
input whose rows are the samples, and the parameter is used nowhere else. So a rule only has to be right for the
module's own ``forward``.

Register a rule for your own module type::

    def scale_rule(mod, inp, gout, use):          # y = x * s, s of shape (F,)
        return [Factor.dense((gout * inp).reshape(*gout.shape[:2], -1, inp.shape[-1]).sum(2))]
    interference.register_rule(Scale, scale_rule, params=("s",))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = ["Factor", "LayerRule", "register_rule", "rule_for", "registered_rules"]


@dataclass(frozen=True)
class Factor:
    """One layer's contribution to the Gram matrix, for a block of ``n`` samples and ``O`` outputs.

    Build it with :meth:`dense` (per-sample gradients ``g`` of shape ``(O, n, P)``) or :meth:`linear` (a 2-D
    ``Linear``'s ``A`` (n, in) and ``B`` (O, n, out), whose per-sample weight gradient ``B_on A_n^T`` is never
    formed: the Gram is ``(A A'^T + 1[bias]) * (B B'^T)``).
    """

    g: Tensor | None = None
    a: Tensor | None = None
    b: Tensor | None = None
    bias: bool = False

    @staticmethod
    def dense(g: Tensor) -> "Factor":
        """Per-sample gradients ``(O, n, P)`` (any ``P``: the parameters' flattened, concatenated entries)."""
        if g.dim() != 3:
            raise ValueError(f"Factor.dense expects per-sample gradients of shape (O, n, P), got {tuple(g.shape)}")
        return Factor(g=g)

    @staticmethod
    def linear(a: Tensor | None, b: Tensor, bias: bool) -> "Factor":
        """A 2-D ``Linear``: input rows ``a`` (n, in) (``None``: weight not used), output gradients ``b`` (O, n, out)."""
        return Factor(a=a, b=b, bias=bias)


RuleFn = Callable[[nn.Module, Tensor, Tensor, frozenset[str]], list[Factor]]
"""``rule(module, inp (n, ...), gout (O, n, ...), use) -> factors`` for the local parameter names ``use``."""


@dataclass(frozen=True)
class LayerRule:
    """A rule, the local parameter names it differentiates, the class ``forward`` it was written for, and optional
    refusals: ``refuse(module)`` and ``refuse_input(module, inp)`` return a reason (str) when this instance or input
    (one sample's, ``(1, ...)``) is outside what the rule handles (a grouped convolution, a 3-D conv input), else
    ``None``."""

    fn: RuleFn
    params: frozenset[str]
    forward: Callable
    refuse: Callable[[nn.Module], str | None] | None = None
    check_input: Callable[[nn.Module, Tensor], str | None] | None = None

    def refuse_input(self, module: nn.Module, inp: Tensor) -> str | None:
        """Why the rule does not handle ``inp`` (one sample's input of ``module``), or ``None`` if it does."""
        return self.check_input(module, inp) if self.check_input is not None else None


_RULES: dict[type, LayerRule] = {}


def register_rule(module_type: type, rule: RuleFn, params: tuple[str, ...],
                  refuse: Callable[[nn.Module], str | None] | None = None,
                  refuse_input: Callable[[nn.Module, Tensor], str | None] | None = None, *,
                  replace: bool = False) -> None:
    """Teach the engine ``module_type`` (exact type; subclasses are not covered): see the module docstring.

    ``params`` are the local parameter names (as in ``module.named_parameters(recurse=False)``) the rule
    differentiates; any other parameter of the module goes to the exact path. ``refuse`` / ``refuse_input`` return a
    reason for instances / inputs the rule does not handle. The class's current ``forward`` is recorded: a module
    whose class ``forward`` is replaced later is refused. ``replace=True`` overrides an existing rule.
    """
    if not isinstance(module_type, type) or not issubclass(module_type, nn.Module):
        raise TypeError(f"module_type must be an nn.Module subclass, got {module_type!r}")
    if not callable(rule):
        raise TypeError(f"rule must be callable, got {type(rule).__name__}")
    if isinstance(params, str) or not params or not all(isinstance(p, str) for p in params):
        raise ValueError(f"params must be a non-empty tuple of parameter names, got {params!r}")
    if module_type in _RULES and not replace:
        raise ValueError(f"a rule for {module_type.__name__} is already registered; pass replace=True to override it")
    _RULES[module_type] = LayerRule(rule, frozenset(params), module_type.forward, refuse, refuse_input)


def rule_for(module: nn.Module) -> LayerRule | None:
    """The rule registered for ``type(module)`` exactly, or ``None``."""
    return _RULES.get(type(module))


def registered_rules() -> dict[type, LayerRule]:
    """A copy of the registry: module type -> rule."""
    return dict(_RULES)


# ----------------------------------------------------------------------------------------------- helpers
def sum_positions(t: Tensor) -> Tensor:
    """Sum ``(O, n, rest, ...)`` over ``rest`` (weight sharing over positions); a view when ``rest == 1``."""
    return t.squeeze(2) if t.shape[2] == 1 else t.sum(2)


def per_output_bmm(b: Tensor, u: Tensor) -> Tensor:
    """``(O, n, X, L) @ (n, L, Y) -> (O, n, X*Y)``, one batched product per output, written in place (no copies)."""
    o, n, x = b.shape[:3]
    out = b.new_empty(o, n, x, u.shape[-1])
    for i in range(o):
        torch.bmm(b[i], u, out=out[i])
    return out.reshape(o, n, -1)


# ----------------------------------------------------------------------------------------------- built-in rules
def _linear(mod: nn.Linear, inp: Tensor, gout: Tensor, use: frozenset[str]) -> list[Factor]:
    w, bias = "weight" in use, "bias" in use
    if inp.dim() == 2:
        return [Factor.linear(inp if w else None, gout, bias)]
    o, n = gout.shape[:2]
    a = inp.reshape(n, -1, inp.shape[-1])
    b = gout.reshape(o, n, -1, gout.shape[-1])
    out = []
    if w:
        out.append(Factor.dense(per_output_bmm(b.transpose(2, 3), a)))  # (O, n, out*in)
    if bias:
        out.append(Factor.dense(sum_positions(b)))
    return out


def _conv2d(mod: nn.Conv2d, inp: Tensor, gout: Tensor, use: frozenset[str]) -> list[Factor]:
    o, n, c_out = gout.shape[:3]
    b = gout.reshape(o, n, c_out, -1)
    out = []
    if "weight" in use:
        u = F.unfold(inp, mod.kernel_size, dilation=mod.dilation, padding=mod.padding, stride=mod.stride)
        out.append(Factor.dense(per_output_bmm(b, u.transpose(1, 2))))  # (O, n, c_out * c_in*kh*kw)
    if "bias" in use:
        out.append(Factor.dense(b.sum(-1)))
    return out


def _conv2d_refuse(mod: nn.Conv2d) -> str | None:
    if mod.groups != 1:
        return f"grouped convolution (groups={mod.groups})"
    if mod.padding_mode != "zeros":
        return f"padding_mode={mod.padding_mode!r}"
    if isinstance(mod.padding, str):
        return f"padding={mod.padding!r}"
    return None


def _layer_norm(mod: nn.LayerNorm, inp: Tensor, gout: Tensor, use: frozenset[str]) -> list[Factor]:
    o, n = gout.shape[:2]
    k = len(mod.normalized_shape)
    b = gout.reshape(o, n, -1, *gout.shape[gout.dim() - k:])  # (O, n, rest, *normalized)
    out = []
    if "weight" in use:
        xhat = F.layer_norm(inp, mod.normalized_shape, None, None, mod.eps)
        xhat = xhat.reshape(1, n, -1, *xhat.shape[xhat.dim() - k:])
        out.append(Factor.dense(sum_positions(b * xhat).reshape(o, n, -1)))
    if "bias" in use:
        out.append(Factor.dense(sum_positions(b).reshape(o, n, -1)))
    return out


def _needs_dims(least: int, exact: bool = False) -> Callable[[nn.Module, Tensor], str | None]:
    def check(mod: nn.Module, inp: Tensor) -> str | None:
        dims = least + (len(mod.normalized_shape) if isinstance(mod, nn.LayerNorm) else 0)
        if inp.dim() < dims or (exact and inp.dim() != dims):
            return f"input of {inp.dim()} dimensions (needs {'' if exact else 'at least '}{dims}: samples first)"
        return None
    return check


register_rule(nn.Linear, _linear, ("weight", "bias"), refuse_input=_needs_dims(2))
register_rule(nn.Conv2d, _conv2d, ("weight", "bias"), _conv2d_refuse, _needs_dims(4, exact=True))
register_rule(nn.LayerNorm, _layer_norm, ("weight", "bias"), refuse_input=_needs_dims(1))
