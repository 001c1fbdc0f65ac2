"""The empirical neural tangent kernel of any ``nn.Module``."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from torch import Tensor, nn

from .gradcov import loss_outputs
from .gram import Batch, Implementation, Output, batch_size, jacobian_gram, plan_for
from .guard import detached, engine_call
from .plan import Plan
from .structure import rows_proven

__all__ = ["ntk", "explain", "model_outputs"]


def model_outputs(model: nn.Module, batch: Batch) -> Tensor:
    """Run ``model`` on ``batch`` and flatten each sample's output: ``(n, O)``; clear errors for other outputs."""
    n = batch_size(batch, "x")
    out = model(batch)
    if not isinstance(out, Tensor):
        raise TypeError(f"the model must return a tensor, got {type(out).__name__}; wrap it to select one output")
    if out.dim() == 0 or out.shape[0] != n:
        raise ValueError(f"the model output must have the batch size {n} as its first dimension, got shape {tuple(out.shape)}")
    if not out.is_floating_point():
        raise TypeError(f"the model output must be a floating-point tensor to differentiate, got {out.dtype}")
    if out[:1].numel() == 0:
        raise ValueError(f"the model output has 0 outputs per sample (shape {tuple(out.shape)}): there is nothing to"
                         " differentiate")
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
        implementation: ``"auto"`` (default) puts each parameter a layer-wise rule provably covers (``Linear``,
            ``Conv2d``, ``LayerNorm``, ``Elephant``, ``NoisyLinear`` and any registered with
            :func:`interference.register_rule`) on its rule and the rest on the exact path: ``torch.func`` ``vmap(jacrev)``, or, with one warning, a
            per-sample autograd loop where ``vmap`` cannot run the model. ``"layerwise"`` refuses parameters no rule
            covers; ``"func"`` uses ``vmap(jacrev)`` for all (fast, but some modules cannot be vmapped: a clear
            ``RuntimeError``); ``"loop"`` uses the per-sample autograd loop for all (slowest: ``N + M`` forwards and
            ``(N + M) O`` backwards; runs anything autograd runs). :func:`explain` shows the choice per parameter.
        chunk_size: block size over ``x``/``xt``; ``None`` picks the largest that fits ``max_memory``.
        max_memory: bytes the computation may use; ``None``: 80% of the free memory of the parameters' device. An
            estimate above the budget raises ``MemoryError`` (saying how much it needs) before anything is computed.

    Returns:
        The kernel, shaped as ``output`` says.

    The kernel has the device of the model's parameters and their dtype (promoted over the selected ones: float64 if
    any is). Forwards that draw random numbers or change the model's buffers, and BatchNorm in training mode, are
    refused (``ValueError``). The dry runs of :func:`explain` run once per model structure (the plan is cached);
    every block is then checked on every row against its samples alone (about one training step on the block;
    skipped where the model's structure proves the rows independent, :mod:`interference.structure`); a block that
    fails (the model treats larger batches differently) sends every parameter to the exact path with a
    warning. The model is left as it was, and hooks on parameter tensors are ignored (see the paths page).
    """
    proven = rows_proven(model, x) and (xt is None or rows_proven(model, xt))
    return jacobian_gram(lambda b: model_outputs(model, b), model, x, xt, params=params, output=output,
                         implementation=implementation, chunk_size=chunk_size, max_memory=max_memory,
                         rows_independent=proven)


def explain(
    model: nn.Module,
    x: Batch,
    xt: Batch | None = None,
    *,
    params: Iterable[str] | None = None,
    implementation: Implementation = "auto",
    loss_fn: Callable[[nn.Module, Batch], Tensor] | None = None,
) -> Plan:
    """The path each parameter takes in :func:`ntk` (or, with ``loss_fn``, :func:`gradient_covariance`) and why.

    ``plan.paths[name]`` has ``path`` (``"rule"``, ``"func"`` or ``"loop"``), ``rule`` (the module type whose rule
    covers it) and ``reason``; ``print(plan)`` shows a table. Runs the same dry runs as the computation, on one or
    two samples. The computation also checks each block it computes and, if one fails (a model that treats larger
    batches differently), puts every parameter on the exact path with a warning: ``explain`` cannot foresee that.
    """
    fn = (lambda b: model_outputs(model, b)) if loss_fn is None else (lambda b: loss_outputs(loss_fn, model, b))
    with engine_call(model):
        return plan_for(fn, model, detached(x), detached(xt), params=params, implementation=implementation,
                        small=True)
