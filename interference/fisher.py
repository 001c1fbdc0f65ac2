"""Sums of squared per-sample gradients (the diagonal empirical Fisher) without holding per-sample gradients.

``squared_grad_sum(model, loss_fn, batch)[name] = sum_n (d loss_n / d theta)^2``, shaped like the parameter. Divided
by the batch size and with ``loss_n = -log p(y_n | x_n)`` it is the diagonal of the empirical Fisher information that
EWC-style regularisers weight parameters with.

Per-sample gradients of a 10k-unit layer for a batch of 125 take gigabytes; a ``Linear`` layer's need not exist: its
per-sample weight gradient is the outer product ``b_n a_n^T`` of the gradient at its output and its input, so the sum
of their squares is ``(b^2)^T (a^2)`` (one matrix product) and the bias's is ``sum_n b_n^2``. ``implementation="auto"``
uses the NTK engine's proofs (:mod:`interference.plan`: the layer runs once, on rows that are the samples, its
parameter is used nowhere else; every row of the batch is checked against its sample alone, unless the model's
structure and the loss prove the rows independent: :mod:`interference.structure`) and its layer-wise rules
(:mod:`interference.rules`): a 2-D ``Linear`` by the product above, any other rule's parameter from the rule's
per-sample factor for that parameter alone (``Conv2d``: ``(n, c_out c_in kh kw)``); each parameter's factors are
checked against autograd through ``sum_n w_n g_n`` for random weights ``w`` (one backward), which catches a rule
whose dense factors do not follow the parameter's layout (a 2-D ``Linear``'s product form has its layout by
construction). Everything else takes :func:`interference.per_sample_grads`, which materialises ``(n, P)`` for those
parameters only. ``implementation="exact"`` takes that path for every parameter. :func:`grad_moments` also returns
the per-sample losses and the summed gradient (``b^T a`` for a ``Linear``) from the same pass.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import NamedTuple

import torch
from torch import Tensor, nn

from .gradcov import LossFn, loss_key, loss_outputs, per_sample_grads
from .gram import Batch, NotPerSample, _checked, check_uses, plan_for, quiet_functorch
from .guard import detached, engine_call
from .plan import Plan
from .plan_cache import forget, lookup, plan_key, store
from .rows import RowCheck, capture, output_grads, rows_flag
from .rules import Factor, rule_for
from .structure import rows_proven

__all__ = ["squared_grad_sum", "grad_moments", "GradMoments"]

_IMPLEMENTATIONS = ("auto", "exact")


class GradMoments(NamedTuple):
    """The first two moments of a batch's per-sample loss gradients ``g_n``, from one pass (:func:`grad_moments`)."""

    loss: Tensor
    """``(n,)`` the per-sample losses (no graph)."""
    grad: dict[str, Tensor]
    """``{name: sum_n g_n}``: the gradient of the summed loss, each of the parameter's shape."""
    squares: dict[str, Tensor]
    """``{name: sum_n g_n^2}``, as :func:`squared_grad_sum`."""


def squared_grad_sum(model: nn.Module, loss_fn: LossFn, batch: Batch, *, params: Iterable[str] | None = None,
                     implementation: str = "auto") -> dict[str, Tensor]:
    """``{name: sum_n (d loss_fn(model, batch)[n] / d param)^2}``, each of the parameter's shape and dtype.

    Args:
        model: any module; samples must not interact (BatchNorm in training mode is refused).
        loss_fn: ``loss_fn(model, batch) -> (n,)`` per-sample losses (no reduction); ``loss_n`` must depend on sample
            ``n`` alone (each is differentiated as if the sample were alone: a loss divided by the batch size gives
            the sums of the undivided losses' squared gradients). :func:`interference.cross_entropy` is one the
            engine knows: with a model of :data:`interference.structure.ROWWISE` layers the batch needs no every-row
            check (:mod:`interference.structure`).
        batch: ``(n, ...)`` tensor or pytree of tensors with a shared leading dimension.
        params: names to differentiate; default all with ``requires_grad``.
        implementation: ``"auto"`` (proven layer-wise paths, see the module docstring; per-sample gradients only for
            the rest) or ``"exact"`` (per-sample gradients of every parameter: memory ``n x P``).
    """
    return _moments(model, loss_fn, batch, params, implementation, sums=False).squares


def grad_moments(model: nn.Module, loss_fn: LossFn, batch: Batch, *, params: Iterable[str] | None = None,
                 implementation: str = "auto") -> GradMoments:
    """The per-sample losses, the summed gradient and :func:`squared_grad_sum`, from one forward and one backward.

    What a learner that regularises with the squared gradients needs for its own update: the gradient of the mean
    loss is ``grad[name] / n``, taken in the same pass (no second forward). Also the gradient noise of a batch:
    ``squares / n - (grad / n)^2`` is the per-parameter variance of the per-sample gradients. Arguments as
    :func:`squared_grad_sum`; the sums cost one more matrix product per layer (as autograd's parameter gradient).
    """
    return _moments(model, loss_fn, batch, params, implementation, sums=True)


def _moments(model: nn.Module, loss_fn: LossFn, batch: Batch, params: Iterable[str] | None, implementation: str,
             sums: bool) -> GradMoments:
    if implementation not in _IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {_IMPLEMENTATIONS}, got {implementation!r}")
    fn = lambda b: loss_outputs(loss_fn, model, b)  # noqa: E731 - (n, 1): one output, the loss
    engine = "auto" if implementation == "auto" else "loop"
    with engine_call(model):
        batch = detached(batch)
        fn_key = loss_key(loss_fn)
        key = None if fn_key is None else plan_key(model, ("squared",) + fn_key, params, batch, None, engine)
        plan = lookup(model, key)
        if plan is None:
            with quiet_functorch():
                plan = plan_for(fn, model, batch, params=params, implementation=engine)
        squares: dict[str, Tensor] = {}
        grad: dict[str, Tensor] = {}
        loss = None
        exact = list(plan.selected) if implementation == "exact" else list(plan.exact)
        if implementation == "auto" and plan.modules:
            frozen = [p for p in plan.selected.values() if not p.requires_grad]
            proven = rows_proven(model, batch, loss_fn)
            try:
                for p in frozen:  # named in params although frozen: differentiate them for this call
                    p.requires_grad_(True)
                with quiet_functorch():
                    loss, squares, grad, refused = _layerwise(fn, batch, plan, proven, sums)
            except NotPerSample as err:
                warnings.warn(f"{err}: the model is not a per-sample function of its batch beyond the dry-run samples,"
                              " so every parameter takes the per-sample gradient path", stacklevel=3)
                forget(model, key)
                squares, grad, exact, key = {}, {}, list(plan.selected), None
            else:
                exact += refused
            finally:
                for p in frozen:
                    p.requires_grad_(False)
        store(model, key, plan)
        if exact:
            per_sample = per_sample_grads(model, loss_fn, batch, params=exact)
            squares.update({name: g.pow(2).sum(0) for name, g in per_sample.items()})
            if sums:
                grad.update({name: g.sum(0) for name, g in per_sample.items()})
        if sums and loss is None:
            with torch.no_grad():
                loss = fn(batch)[:, 0]
    return GradMoments(torch.zeros(0) if loss is None else loss,
                       {name: grad[name] for name in plan.selected} if sums else {},
                       {name: squares[name] for name in plan.selected})


def _joined(parts: list[Tensor]) -> Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts) if parts else torch.zeros(0)


def _squares(factors: list[Factor], rows: slice) -> Tensor:
    """Flattened ``sum_n`` of the squared per-sample gradients the factors of one parameter stand for (samples
    ``rows`` only)."""
    parts = []
    for f in factors:
        if f.g is not None:  # (1, n, P)
            parts.append(f.g[0, rows].pow(2).sum(0))
            continue
        b2 = f.b[0, rows].pow(2)  # (n, out)
        if f.a is not None:
            parts.append((b2.T @ f.a[rows].pow(2)).reshape(-1))  # (out, in): the weight's layout
        if f.bias:
            parts.append(b2.sum(0))
    return _joined(parts)


def _summed(factors: list[Factor]) -> Tensor:
    """Flattened ``sum_n g_n`` of the per-sample gradients the factors of one parameter stand for."""
    parts = []
    for f in factors:
        if f.g is not None:
            parts.append(f.g[0].sum(0))
            continue
        if f.a is not None:
            parts.append((f.b[0].T @ f.a).reshape(-1))
        if f.bias:
            parts.append(f.b[0].sum(0))
    return _joined(parts)


def _weighted(factors: list[Factor], w: Tensor) -> Tensor:
    """Flattened ``sum_n w_n g_n`` of the per-sample gradients the factors of one parameter stand for."""
    parts = []
    for f in factors:
        if f.g is not None:
            parts.append(w.to(f.g.dtype) @ f.g[0])
            continue
        wb = f.b[0] * w.to(f.b.dtype)[:, None]  # (n, out)
        if f.a is not None:
            parts.append((wb.T @ f.a).reshape(-1))
        if f.bias:
            parts.append(wb.sum(0))
    return torch.cat(parts) if parts else torch.zeros(0)


def _layerwise(fn, batch: Batch, plan: Plan, proven: bool,
               sums: bool) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor], list[str]]:
    """The per-sample losses, the squared-gradient sums (and with ``sums`` the gradient sums) of the parameters on
    rules, and the names whose rule result failed its layout check (or had the wrong size): they go to the
    per-sample path. :class:`NotPerSample` if the batch fails its every-row check (:mod:`interference.rows`; not run
    where the structure ``proven`` rows independent)."""
    used = list(plan.modules)
    with torch.enable_grad(), capture(used) as records:
        out = fn(batch)
    n = out.shape[0]
    if any(len(r) != 1 or r[0].inp.shape[0] != n for r in records.values()):
        raise NotPerSample("layers ran a different number of times or on other shapes in the batch than in the dry"
                           " runs")
    grads = output_grads(out, [records[m][0].probe for m in used])
    check_uses(plan, out)
    check = RowCheck(plan.tolerance, plan.check_tolerance, plan.reference, proven=proven)
    if n > 1:
        check.block(fn, batch, out, used, records, grads)
    plan.reference = check.mode
    if any(records[m][0].inp._version != records[m][0].version for m in used):
        raise NotPerSample("a layer's input was modified in place after the layer ran")
    names = {(id(p), local): name for name, p in plan.selected.items()
             for mod in plan.modules for local in plan.modules[mod] if getattr(mod, local) is p}
    squares: dict[str, Tensor] = {}
    grad: dict[str, Tensor] = {}
    weighted: dict[str, Tensor | None] = {}  # sum_n w_n g_n by the rule, for the layout check below
    w = torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(out.device) + 0.5
    for mod, g in zip(used, grads):
        inp = records[mod][0].inp
        for local in sorted(plan.modules[mod]):
            p = getattr(mod, local)
            name = names[(id(p), local)]
            if g is None:  # the layer does not reach the loss
                squares[name], weighted[name] = torch.zeros_like(p), None
                if sums:
                    grad[name] = torch.zeros_like(p)
                continue
            with torch.no_grad():
                factors = _checked(mod, rule_for(mod).fn(mod, inp, g, frozenset({local})), 1, n)
                total = _squares(factors, slice(None))
                if total.numel() == p.numel():
                    squares[name] = total.reshape(p.shape).to(p.dtype)
                    if sums:
                        grad[name] = _summed(factors).reshape(p.shape).to(p.dtype)
                    # a 2-D Linear's factored form has this module's own layout; a rule's dense factors are checked
                    weighted[name] = _weighted(factors, w) if any(f.g is not None for f in factors) else None
    refused = [name for name in plan.selected if name in names.values() and name not in squares]
    # the rule's per-sample layout, all samples at once: sum_n w_n g_n against autograd through every use
    checked = [name for name in squares if weighted[name] is not None]
    layout = []
    if checked:
        ref = torch.autograd.grad(out[:, 0], [plan.selected[k] for k in checked], w.to(out.dtype),
                                  allow_unused=True)
        for name, r in zip(checked, ref):
            r = torch.zeros_like(weighted[name]) if r is None else r.detach().reshape(-1)
            layout.append(rows_flag(weighted[name].to(r.dtype)[None], r[None], plan.check_tolerance))
    flags = torch.stack(check.flags + layout).tolist() if check.flags or layout else []  # the one host sync
    if not all(flags[:len(check.flags)]):
        raise NotPerSample(f"{check.failed()} for some sample of the batch differ from that sample's alone")
    for name, ok in zip(checked, flags[len(check.flags):]):
        if not ok:
            warnings.warn(f"the layer-wise gradients of {name} differ from autograd (a rule whose factors do not follow"
                          " the parameter's layout, or the parameter is also used elsewhere); it takes the per-sample"
                          " gradient path", stacklevel=3)
            del squares[name]
            grad.pop(name, None)
            refused.append(name)
    return out[:, 0].detach(), squares, grad, refused
