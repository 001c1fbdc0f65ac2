"""A proof from the model's structure that the rows of a batch do not interact, so the every-row check of
:mod:`interference.rows` has nothing to find.

The proof holds for an ``nn.Sequential`` (nested ones too) built only of the layers in :data:`ROWWISE`, each of its
own class (not a subclass, no ``forward`` set on the instance, no parametrization), with no module hooks (on a module
or global) and no ``torch.overrides`` or dispatch mode active, run on a plain tensor: every such layer computes row
``n`` of its output from row ``n`` of its input alone, given the number of dimensions of its input, which is followed
from the batch's through the layers (a ``Conv2d`` that would take a 3-D input as one unbatched image, a ``Flatten``
or ``Softmax`` over dimension 0, a ``LayerNorm`` over every dimension: not proven). A loss proves itself only if it
is one of :data:`ROWWISE_LOSSES` (the engine's own per-sample losses, e.g. :func:`interference.cross_entropy`).

Anything else is not proven, and the engine checks every row as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn
from torch.nn.modules import module as _module
from torch.nn.functional import cross_entropy as _cross_entropy
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from .activations import Elephant

__all__ = ["ROWWISE", "ROWWISE_LOSSES", "cross_entropy", "rows_proven"]


def cross_entropy(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    """Per-sample cross-entropy ``-log softmax(model(x))[y]`` ``(n,)`` of logits ``(n, C)`` and classes ``y`` ``(n,)``.

    A loss function for :func:`interference.squared_grad_sum`, :func:`interference.grad_moments`,
    :func:`interference.gradient_covariance` and :func:`interference.per_sample_grads` that the engine knows to be
    per-sample: with a model of :data:`ROWWISE` layers it skips the every-row check."""
    x, y = batch
    return _cross_entropy(model(x), y, reduction="none")


def _same(m: nn.Module, d: int) -> int | None:  # acts on the trailing dimensions, keeps their number
    return d if d >= 2 else None


def _layer_norm(m: nn.LayerNorm, d: int) -> int | None:
    return d if d > len(m.normalized_shape) else None


def _flatten(m: nn.Flatten, d: int) -> int | None:
    start = m.start_dim + d if m.start_dim < 0 else m.start_dim
    end = m.end_dim + d if m.end_dim < 0 else m.end_dim
    return d - (end - start) if d >= 2 and 1 <= start <= end < d else None


def _spatial(k: int) -> Callable[[nn.Module, int], int | None]:
    def rule(m: nn.Module, d: int) -> int | None:  # (n, C, *k spatial): a (C, *k) input would be unbatched
        return d if d == k + 2 and not getattr(m, "return_indices", False) else None
    return rule


def _softmax(m: nn.Softmax | nn.LogSoftmax, d: int) -> int | None:
    return d if m.dim is not None and d >= 2 and (m.dim % d) >= 1 else None


def _dropout(m: nn.Dropout, d: int) -> int | None:
    return d if not m.training and d >= 2 else None  # in training it is random (refused elsewhere)


def _elephant(m: Elephant, d: int) -> int | None:
    return d if d >= 2 and m.log_h.ndim <= 1 and m.log_a.ndim <= 1 else None


#: layer class -> ``rule(module, input ndim) -> output ndim``, ``None`` where rows could interact
ROWWISE: dict[type, Callable[[Any, int], int | None]] = {
    nn.Linear: _same, nn.Identity: _same, nn.LayerNorm: _layer_norm, nn.Flatten: _flatten, nn.Dropout: _dropout,
    nn.Softmax: _softmax, nn.LogSoftmax: _softmax, Elephant: _elephant,
    **{t: _same for t in (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish,
                          nn.Tanh, nn.Sigmoid, nn.Softplus, nn.Softsign, nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid,
                          nn.Tanhshrink)},
    **{t: _spatial(k) for k, ts in ((1, (nn.Conv1d, nn.MaxPool1d, nn.AvgPool1d)),
                                    (2, (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d)),
                                    (3, (nn.Conv3d, nn.MaxPool3d, nn.AvgPool3d))) for t in ts},
}

#: losses ``loss_fn(model, (x, y))`` whose sample ``n`` reads ``model(x)[n]`` and ``y[n]`` alone
ROWWISE_LOSSES: tuple[Callable[..., Tensor], ...] = (cross_entropy,)

_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks")


def _ndim_after(m: nn.Module, d: int) -> int | None:
    """The number of dimensions of ``m``'s output for a ``d``-dimensional batch, if ``m`` provably keeps rows apart."""
    if any(getattr(m, h) for h in _HOOKS) or "forward" in m.__dict__:
        return None
    if type(m) is nn.Sequential:
        for child in m:
            d = _ndim_after(child, d)
            if d is None:
                return None
        return d
    rule = ROWWISE.get(type(m))
    return None if rule is None else rule(m, d)


def rows_proven(model: nn.Module, batch: Any, loss_fn: Callable[..., Tensor] | None = None) -> bool:
    """Whether ``model(batch)`` (or ``loss_fn(model, batch)``) computes row ``n`` from sample ``n`` alone, by the
    structure described in the module docstring: ``batch`` a plain tensor (with a loss, a pair ``(x, y)`` of them),
    the output ``(n, O)`` (with a loss: logits ``(n, C)``, classes ``(n,)``)."""
    if any(getattr(_module, h) for h in _GLOBAL_HOOKS) or _get_current_function_mode_stack() \
            or _get_current_dispatch_mode_stack():
        return False
    if loss_fn is None:
        x = batch
    elif loss_fn in ROWWISE_LOSSES and isinstance(batch, tuple) and len(batch) == 2:
        x, y = batch
        if type(y) is not Tensor or y.ndim != 1 or y.is_floating_point() or y.shape[0] != getattr(x, "shape", (0,))[0]:
            return False
    else:
        return False
    if type(x) is not Tensor or x.ndim < 2:
        return False
    return _ndim_after(model, x.ndim) == 2
