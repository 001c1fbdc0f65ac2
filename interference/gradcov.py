"""Per-sample loss gradients and the paper's gradient covariance (interference) matrix."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from .gram import Batch, Implementation, batch_size, jacobian_gram, select_parameters, single_sample_fn

__all__ = ["gradient_covariance", "per_sample_grads", "LossFn"]

LossFn = Callable[[nn.Module, Batch], Tensor]
"""``loss_fn(model, batch) -> (k,)`` per-sample losses (no reduction); samples must not interact."""


def _per_sample_losses(loss_fn: LossFn, model: nn.Module, batch: Batch, k: int) -> Tensor:
    losses = loss_fn(model, batch)
    if not isinstance(losses, Tensor) or losses.shape != (k,):
        got = tuple(losses.shape) if isinstance(losses, Tensor) else type(losses).__name__
        raise ValueError(
            f"loss_fn must return one loss per sample (shape ({k},) for a batch of {k}; no mean/sum reduction),"
            f" got {got}"
        )
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
        loss_fn: ``loss_fn(model, batch) -> (k,)`` per-sample losses, e.g. a DQN TD loss on replay samples.
        batch: ``k`` samples (a tensor or a pytree of tensors with leading dimension ``k``).
        normalize: ``False`` returns the raw Gram matrix ``<g_i, g_j>``.
        implementation: as in :func:`interference.ntk` (layer-wise by default, ``torch.func`` for the rest).
        zero_tol: gradients with norm ``<= zero_tol`` count as zero.

    A sample with a zero gradient (e.g. a TD error of exactly 0) has no direction: its row and column are 0 and
    its diagonal entry is 1, so the matrix stays symmetric with a unit diagonal and never holds NaN.
    """
    k = batch_size(batch)
    gram = jacobian_gram(lambda b: _per_sample_losses(loss_fn, model, b, batch_size(b)).unsqueeze(1), model, batch,
                         params=params, output="trace", implementation=implementation)
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
    model: nn.Module, loss_fn: LossFn, batch: Batch, *, params: Iterable[str] | None = None
) -> dict[str, Tensor]:
    """Per-sample gradients ``{name: (k, *param.shape)}`` of ``loss_fn`` by ``torch.func.vmap(grad)``."""
    k = batch_size(batch)
    _per_sample_losses(loss_fn, model, batch, k)  # validate the loss shape once, with a clear error
    selected = {name: p.detach() for name, p in select_parameters(model, params).items()}
    single = single_sample_fn(model, lambda b: loss_fn(model, b))
    return torch.func.vmap(torch.func.grad(single), in_dims=(None, 0))(selected, batch)
