"""The empirical neural tangent kernel of any ``nn.Module``."""

from __future__ import annotations

from collections.abc import Iterable

from torch import Tensor, nn

from .gram import Batch, Implementation, Output, batch_size, jacobian_gram

__all__ = ["ntk", "model_outputs"]


def model_outputs(model: nn.Module, batch: Batch) -> Tensor:
    """Run ``model`` on ``batch`` and flatten each sample's output: ``(n, O)``; clear errors for other outputs."""
    n = batch_size(batch, "x")
    out = model(batch)
    if not isinstance(out, Tensor):
        raise TypeError(f"the model must return a tensor, got {type(out).__name__}; wrap it to select one output")
    if out.dim() == 0 or out.shape[0] != n:
        raise ValueError(f"the model output must have the batch size {n} as its first dimension, got shape {tuple(out.shape)}")
    return out.reshape(n, -1)


def ntk(
    model: nn.Module,
    x: Batch,
    xt: Batch | None = None,
    *,
    output: Output = "full",
    params: Iterable[str] | None = None,
    implementation: Implementation = "auto",
    chunk_size: int | None = None,
    max_memory: int | None = None,
) -> Tensor:
    """Empirical NTK ``K[n, m, o, p] = <d f(x_n)_o / d theta, d f(xt_m)_p / d theta>``.

    Args:
        model: any module mapping a batch ``x`` (leading dimension ``N``) to outputs ``(N, *out)``; samples must
            not interact (BatchNorm in training mode is refused). Outputs are flattened to ``O = prod(out)``.
        x: ``(N, *features)`` tensor (or pytree of tensors, passed to ``model`` as is).
        xt: ``(M, *features)``; ``None`` means ``x``.
        output: ``"full"`` -> ``(N, M, O, O)``; ``"diagonal"`` -> ``(N, M, O)`` (same output index);
            ``"trace"`` -> ``(N, M)`` (sum over the diagonal).
        params: names (as in ``model.named_parameters()``) to differentiate; default: all trainable ones.
        implementation: ``"auto"`` (default) uses layer-wise kernels for ``Linear``, ``Conv2d``, ``LayerNorm`` and
            ``Elephant`` and exact ``torch.func`` Jacobians for everything else; ``"layerwise"`` refuses uncovered
            parameters; ``"func"`` uses ``torch.func`` for all (the reference).
        chunk_size: block size over ``x``/``xt``; ``None`` picks the largest that fits ``max_memory`` bytes
            (default 80% of free device memory). An estimate above the budget raises ``MemoryError``.

    The kernel has the dtype and device of the model's parameters; the model's train/eval mode is used as is
    (call ``model.eval()`` for deterministic kernels with dropout).
    """
    return jacobian_gram(lambda b: model_outputs(model, b), model, x, xt, params=params, output=output,
                         implementation=implementation, chunk_size=chunk_size, max_memory=max_memory)
