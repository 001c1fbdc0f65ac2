"""Per-sample loss gradients and the paper's gradient covariance (interference) matrix."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Hashable, Iterable

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from .exact import describe_error, loop_jacobian, single_sample_fn
from .guard import BufferWatch, detached, engine_call
from .plan import check_pure, close, tolerance, unseen_message, unseen_parameters
from .structure import rows_proven
from .gram import (Batch, Implementation, batch_size, check_per_sample_modes, jacobian_gram, quiet_functorch,
                   select_parameters)

__all__ = ["gradient_covariance", "per_sample_grads", "loss_outputs", "LossFn"]

LossFn = Callable[[nn.Module, Batch], Tensor]
"""``loss_fn(model, batch) -> (k,)`` per-sample losses (no reduction); samples must not interact."""


class LossShapeError(ValueError):
    """``loss_fn`` did not return one loss per sample."""


def loss_outputs(loss_fn: LossFn, model: nn.Module, batch: Batch) -> Tensor:
    """The per-sample losses as outputs ``(k, 1)`` for the Gram engine."""
    return _per_sample_losses(loss_fn, model, batch, batch_size(batch)).unsqueeze(1)


def loss_key(loss_fn: LossFn) -> Hashable | None:
    """What identifies ``loss_fn`` for the plan cache: a weak reference to it (``None``: it cannot have one)."""
    try:
        return ("loss", weakref.ref(loss_fn))
    except TypeError:
        return None


def _per_sample_losses(loss_fn: LossFn, model: nn.Module, batch: Batch, k: int) -> Tensor:
    losses = loss_fn(model, batch)
    if not isinstance(losses, Tensor) or losses.shape != (k,):
        got = tuple(losses.shape) if isinstance(losses, Tensor) else type(losses).__name__
        raise LossShapeError(
            f"loss_fn must return one loss per sample (shape ({k},) for a batch of {k}; no mean/sum reduction),"
            f" got {got}"
        )
    if not losses.is_floating_point():
        raise TypeError(f"loss_fn must return floating-point losses, got {losses.dtype}")
    return losses


def gradient_covariance(
    model: nn.Module,
    loss_fn: LossFn,
    batch: Batch,
    normalize: bool = True,
    *,
    params: Iterable[str] | None = None,
    implementation: Implementation = "auto",
    zero_tol: float = 0.0,
) -> Tensor:
    """The ``(k, k)`` matrix ``C_ij = <g_i, g_j> / (|g_i| |g_j|)`` of per-sample loss gradients ``g_i``.

    Args:
        model: any module; samples must not interact (BatchNorm in training mode is refused).
        loss_fn: ``loss_fn(model, batch) -> (k,)`` per-sample losses, e.g. a DQN TD loss on replay samples.
        batch: ``k`` samples (a tensor or a pytree of tensors with leading dimension ``k``).
        normalize: ``False`` returns the raw Gram matrix ``<g_i, g_j>``.
        params: names (as in ``model.named_parameters()``) of the parameters the gradients are taken over;
            default: all trainable ones.
        implementation: as in :func:`interference.ntk` (layer-wise by default, ``torch.func`` for the rest).
        zero_tol: gradients with norm ``<= zero_tol`` count as zero.

    A sample with a zero gradient (e.g. a TD error of exactly 0) has no direction: its row and column are 0 and
    its diagonal entry is 1, so the matrix stays symmetric with a unit diagonal and never holds NaN.
    """
    k = batch_size(batch)
    try:
        gram = jacobian_gram(lambda b: loss_outputs(loss_fn, model, b), model, batch, params=params, output="trace",
                             implementation=implementation, fn_key=loss_key(loss_fn),
                             rows_independent=rows_proven(model, batch, loss_fn))
    except LossShapeError:  # raised on a dry run's sample: name the caller's batch instead
        with torch.no_grad():
            _per_sample_losses(loss_fn, model, batch, k)
        raise
    if not normalize:
        return gram
    norms = gram.diagonal().clamp_min(0).sqrt()
    zero = norms <= zero_tol
    safe = torch.where(zero, torch.ones_like(norms), norms)
    cov = (gram / safe[:, None] / safe[None, :]).clamp(-1.0, 1.0)
    cov = cov.masked_fill(zero[:, None] | zero[None, :], 0.0)
    cov.diagonal().fill_(1.0)
    return cov.reshape(k, k)


def per_sample_grads(
    model: nn.Module, loss_fn: LossFn, batch: Batch, *, params: Iterable[str] | None = None,
    implementation: str = "auto",
) -> dict[str, Tensor]:
    """Per-sample gradients ``{name: (k, *param.shape)}`` of ``loss_fn``, each sample alone.

    ``implementation``: ``"func"`` (``torch.func.vmap(grad)``), ``"loop"`` (one backward per sample) or ``"auto"``
    (``vmap``, and the loop with a warning where ``vmap`` cannot run the model).
    """
    if implementation not in ("auto", "func", "loop"):
        raise ValueError(f"implementation must be one of ('auto', 'func', 'loop'), got {implementation!r}")
    k = batch_size(batch)
    selected = select_parameters(model, params)
    check_per_sample_modes(model)
    with engine_call(model):
        batch = detached(batch)
        watch = BufferWatch(model)
        try:
            with torch.no_grad():
                _per_sample_losses(loss_fn, model, batch, k)  # validate the loss shape once, with a clear error
        finally:
            watch.restore()  # a stateful forward is refused below, on runs of its own
        fn = lambda b: loss_outputs(loss_fn, model, b)  # noqa: E731
        check_pure(fn, model, pytree.tree_map(lambda t: t[:1], batch))
        return _per_sample_grads(model, loss_fn, fn, batch, selected, implementation, k)


def _per_sample_grads(model: nn.Module, loss_fn: LossFn, fn: Callable[[Batch], Tensor], batch: Batch,
                      selected: dict[str, nn.Parameter], implementation: str, k: int) -> dict[str, Tensor]:
    unseen = unseen_parameters(fn, selected, pytree.tree_map(lambda t: t[:1], batch))
    if unseen and implementation == "func":
        raise RuntimeError(f"implementation='func': {unseen_message(unseen)}; use implementation='loop' or 'auto'")
    if unseen:
        warnings.warn(f"{unseen_message(unseen)}; per_sample_grads uses one backward per sample instead", stacklevel=3)
    if implementation != "loop" and not unseen:
        values = {name: p.detach() for name, p in selected.items()}
        single = single_sample_fn(model, lambda b: loss_fn(model, b))
        try:
            with quiet_functorch():
                grads = torch.func.vmap(torch.func.grad(single), in_dims=(None, 0))(values, batch)
        except Exception as err:  # noqa: BLE001 - vmap cannot run some modules
            why, cause = f"torch.func.vmap cannot run {describe_error(model)}", err
        else:  # checked against autograd on the first two samples (functional_call misses some uses; vmap bugs)
            head = torch.cat([g[:2].reshape(min(k, 2), -1) for g in grads.values()], 1)
            ref = loop_jacobian(fn, model, list(selected), pytree.tree_map(lambda t: t[:2], batch))[0]
            if close(head, ref, tolerance(model, batch)):
                return grads
            why, cause = ("torch.func (functional_call + vmap) gives other gradients than autograd on the first"
                          " samples (a parameter used through a tensor made outside forward, or a vmap batching bug)",
                          None)
        if implementation == "func":
            raise RuntimeError(f"implementation='func': {why}; use implementation='loop' (per-sample autograd) or"
                               " 'auto'") from cause
        warnings.warn(f"{why}; per_sample_grads uses one backward per sample instead", stacklevel=3)
    jac = loop_jacobian(fn, model, list(selected), batch)[0]  # (k, P)
    out, start = {}, 0
    for name, p in selected.items():
        out[name] = jac[:, start:start + p.numel()].reshape(k, *p.shape)
        start += p.numel()
    return out

