"""Gram matrices of per-sample Jacobians: the engine behind :func:`ntk` and :func:`gradient_covariance`.

For a function ``fn(batch) -> (n, O)`` that runs an ``nn.Module`` on a batch, the Gram matrix
``K[n, m, o, p] = <d fn(x_n)_o / d theta, d fn(x'_m)_p / d theta>`` over the selected parameters ``theta`` (each
sample's Jacobian taken with that sample alone) is computed in two parts that add up:

* the layer-wise path for the parameters a rule (:mod:`interference.rules`) provably covers
  (:mod:`interference.plan` says how it is proven): forward hooks record the modules' inputs, and one batched
  backward pass (one cotangent per output) gives the gradients at their outputs;
* the exact path (:mod:`interference.exact`) for every other selected parameter: ``torch.func`` ``vmap(jacrev)``,
  or a per-sample autograd loop where ``vmap`` cannot run the model.

A batch is a tensor or a pytree (tuple, list, dict, namedtuple) of tensors that share the leading dimension.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Hashable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from .contract import kernel
from .exact import describe_error, func_jacobian, loop_jacobian
from .guard import detached, engine_call
from .plan import Plan, make_plan, use_counts
from .plan_cache import forget, lookup, plan_key, store
from .rows import NotPerSample, RowCheck, capture, output_grads
from .rules import Factor, rule_for

Batch = Any  # a Tensor or a pytree of Tensors with a common leading dimension
Output = Literal["full", "trace", "diagonal"]
Implementation = Literal["auto", "layerwise", "func", "loop"]

__all__ = ["jacobian_gram", "plan_for", "select_parameters", "batch_size", "available_memory", "quiet_functorch",
           "check_per_sample_modes", "Batch"]

_OUTPUTS = ("full", "trace", "diagonal")
_IMPLEMENTATIONS = ("auto", "layerwise", "func", "loop")


# ----------------------------------------------------------------------------------------------- batches
def batch_size(batch: Batch, what: str = "batch") -> int:
    """Leading dimension shared by every tensor in ``batch``; clear errors for anything else."""
    leaves = pytree.tree_leaves(batch)
    if not leaves:
        raise TypeError(f"{what} must be a torch.Tensor or a tuple/list/dict of tensors, got {type(batch).__name__}")
    for leaf in leaves:
        if not isinstance(leaf, Tensor):
            raise TypeError(f"{what} must contain only torch.Tensor values, got {type(leaf).__name__}")
        if leaf.dim() == 0:
            raise ValueError(f"{what} tensors need a leading batch dimension, got a 0-d tensor")
    sizes = {leaf.shape[0] for leaf in leaves}
    if len(sizes) != 1:
        raise ValueError(f"{what} tensors disagree on the batch size: {sorted(sizes)}")
    n = sizes.pop()
    if n == 0:
        raise ValueError(f"{what} is empty (batch size 0)")
    return n


def _slice(batch: Batch, start: int, stop: int) -> Batch:
    return pytree.tree_map(lambda t: t[start:stop], batch)


def check_compatible(a: Batch, b: Batch) -> None:
    """Raise if two batches differ in structure, per-sample shape or dtype."""
    la, sa = pytree.tree_flatten(a)
    lb, sb = pytree.tree_flatten(b)
    if sa != sb:
        raise ValueError("x and xt must have the same structure (both tensors, or the same tuple/dict layout)")
    for ta, tb in zip(la, lb):
        if ta.shape[1:] != tb.shape[1:]:
            raise ValueError(
                f"x and xt have mismatched feature shapes: {tuple(ta.shape[1:])} vs {tuple(tb.shape[1:])}"
                f" (full shapes {tuple(ta.shape)} and {tuple(tb.shape)})"
            )
        if ta.dtype != tb.dtype:
            raise ValueError(f"x and xt have different dtypes: {ta.dtype} vs {tb.dtype}")


# ----------------------------------------------------------------------------------------------- parameters
def select_parameters(model: nn.Module, params: Iterable[str] | None) -> dict[str, nn.Parameter]:
    """The parameters to differentiate: ``params`` by name (any of a tied parameter's names), or all with
    ``requires_grad=True``; each tensor once."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    named = dict(model.named_parameters())
    if params is None:
        chosen = {k: p for k, p in named.items() if p.requires_grad}
        if not chosen:
            raise ValueError("model has no trainable parameters (requires_grad=True); pass params=[names] to choose some")
        return _real(chosen)
    if isinstance(params, str):
        params = [params]
    names = list(params)
    every = dict(model.named_parameters(remove_duplicate=False))
    canonical = {id(p): k for k, p in named.items()}
    unknown = [k for k in names if k not in every]
    if unknown:
        raise ValueError(f"unknown parameter names {unknown}; the model has {list(named)}")
    if not names:
        raise ValueError("params is empty: choose at least one parameter name")
    chosen = {}
    for k in names:  # a tied parameter's other name maps to the name named_parameters() gives it
        chosen.setdefault(canonical[id(every[k])], every[k])
    return _real(chosen)


def _real(chosen: dict[str, nn.Parameter]) -> dict[str, nn.Parameter]:
    """``chosen``, refused if any is complex: a kernel of complex parameters needs conjugation (a Hermitian inner
    product) that no path computes, and a real kernel of them would be silently wrong."""
    complex_ = [f"{k} ({p.dtype})" for k, p in chosen.items() if p.is_complex()]
    if complex_:
        raise TypeError(f"complex parameters are not supported: {', '.join(complex_)}; select real ones with "
                        "params=[names], or split each into real and imaginary parameters")
    return chosen


def _promoted(selected: dict[str, nn.Parameter]) -> torch.dtype:
    """The kernel's dtype: the selected parameters' dtypes promoted (float64 if any is float64)."""
    dtype = next(iter(selected.values())).dtype
    for p in selected.values():
        dtype = torch.promote_types(dtype, p.dtype)
    return dtype


def check_per_sample_modes(model: nn.Module) -> None:
    """Refuse modules whose training mode makes per-sample Jacobians undefined (BatchNorm) or random (Dropout)."""
    for name, mod in model.named_modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm) and not mod.track_running_stats:
            raise ValueError(f"{name or 'the model'} ({type(mod).__name__}) has track_running_stats=False, so it"
                             " normalises with the batch's statistics in eval mode too, which mixes samples: per-sample"
                             " Jacobians are undefined")
        if not mod.training:
            continue
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            raise ValueError(f"{name or 'the model'} ({type(mod).__name__}) is in training mode, which mixes samples,"
                             " so per-sample Jacobians are undefined; call model.eval() first")
        if isinstance(mod, nn.modules.dropout._DropoutNd) and mod.p > 0:
            raise ValueError(f"{name or 'the model'} ({type(mod).__name__}) is in training mode, which draws a new"
                             " random mask per call, so the Jacobians are random; call model.eval() first")


# ----------------------------------------------------------------------------------------------- layer-wise pass
@contextmanager
def quiet_functorch() -> Iterator[None]:
    """Silence functorch's "performance drop ... batching rule" notes (the engine's speed is measured in benches)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="There is a performance drop")
        yield


def check_uses(plan: Plan, out: Tensor) -> None:
    """Raise :class:`NotPerSample` if a planned parameter is consumed in the graph of ``out`` another number of times
    than in the plan's dry run (a use that Python control flow on the data adds or removes)."""
    if not plan.uses:
        return
    now = use_counts(out.grad_fn, set(plan.uses))
    if now != plan.uses:
        raise NotPerSample("a rule parameter is used another number of times in the block's graph than in the dry"
                           " runs' (control flow on the data)")


def _layerwise_factors(fn: Callable[[Batch], Tensor], batch: Batch, plan: Plan,
                       check: RowCheck) -> tuple[list[Factor], Tensor]:
    """Per-layer factors for one block of samples and the outputs ``(n, O)``; the block's every-row checks go to
    ``check``."""
    mods = list(plan.modules)
    with torch.enable_grad(), capture(mods) as records:
        out = fn(batch)
    n = out.shape[0]
    bad = [type(m).__name__ for m, r in records.items() if len(r) != 1 or r[0].inp.shape[0] != n]
    if bad:  # the dry runs saw each of them once, on rows that are the samples: control flow depends on the data
        raise NotPerSample(f"modules {bad} ran a different number of times or on other shapes in a block than in the"
                           " dry runs")
    if not mods:
        return [], out.detach()
    grads = output_grads(out, [records[m][0].probe for m in mods])
    if n > 1:
        check.block(fn, batch, out, mods, records, grads)
    check_uses(plan, out)
    changed = [type(m).__name__ for m in mods if records[m][0].inp._version != records[m][0].version]
    if changed:
        raise NotPerSample(f"the inputs of {changed} were modified in place after those layers ran")
    factors = []
    for mod, g in zip(mods, grads):
        if g is None:  # module ran but does not influence the output
            continue
        with torch.no_grad():  # g: (O, n, *out_shape)
            factors += _checked(mod, rule_for(mod).fn(mod, records[mod][0].inp, g, plan.modules[mod]), g.shape[0], n)
    return factors, out.detach()


def _checked(mod: nn.Module, factors: Any, o: int, n: int) -> list[Factor]:
    """A rule's factors, or a clear error naming the rule when they are not a list of well-shaped Factors."""
    name = type(mod).__name__
    if not isinstance(factors, (list, tuple)) or not all(isinstance(f, Factor) for f in factors):
        raise TypeError(f"the layer-wise rule for {name} must return a list of interference.Factor, got"
                        f" {type(factors).__name__}")
    for f in factors:
        t = f.g if f.g is not None else f.b
        if t is None or t.dim() != 3 or tuple(t.shape[:2]) != (o, n) or (f.a is not None and f.a.shape[0] != n):
            raise ValueError(f"the layer-wise rule for {name} returned a factor of shape"
                             f" {None if t is None else tuple(t.shape)}; expected (O={o}, n={n}, P)")
    return list(factors)


def _exact_factor(fn: Callable[[Batch], Tensor], model: nn.Module, plan: Plan, batch: Batch) -> Factor:
    if plan.exact_impl == "loop":
        return Factor(g=loop_jacobian(fn, model, plan.exact, batch))
    try:
        return Factor(g=func_jacobian(fn, model, plan.exact, batch))
    except Exception as err:  # noqa: BLE001 - vmap failed on this block although it ran on the dry-run samples
        why = f"torch.func.vmap cannot run {describe_error(model)}"
        if plan.implementation == "func":
            raise RuntimeError(f"implementation='func': {why}; use implementation='loop' (per-sample autograd) or"
                               " 'auto'") from err
    plan.exact_impl, plan.fallback = "loop", why
    _warn_fallback(plan)
    return Factor(g=loop_jacobian(fn, model, plan.exact, batch))


def _warn_fallback(plan: Plan) -> None:
    warnings.warn(f"{plan.fallback}; the exact path uses the per-sample autograd loop instead (one forward per sample"
                  " and one backward per sample and output); implementation='loop' chooses it without this warning",
                  stacklevel=4)


def _block_kernel(fn, model, plan: Plan, b1: Batch, b2: Batch | None, output: str, check: RowCheck) -> Tensor:
    """The kernel between two blocks of samples (``b2=None``: the block with itself), in the output layout."""
    f1, out1 = _layerwise_factors(fn, b1, plan, check)
    f2, out2 = (f1, out1) if b2 is None else _layerwise_factors(fn, b2, plan, check)
    if plan.exact:
        f1 = f1 + [_exact_factor(fn, model, plan, b1)]
        f2 = f1 if b2 is None else f2 + [_exact_factor(fn, model, plan, b2)]
    (n, o), m = out1.shape, out2.shape[0]
    dtype = plan.dtype
    cast = lambda fs: [f if (f.g if f.g is not None else f.b).dtype == dtype else Factor(  # noqa: E731
        *(None if t is None else t.to(dtype) for t in (f.g, f.a, f.b)), f.bias) for f in fs]
    return kernel(cast(f1), None if b2 is None else cast(f2), n, m, o, output, dtype, out1.device)


# ----------------------------------------------------------------------------------------------- memory
def available_memory(device: torch.device) -> int:
    """Bytes free on ``device`` now (CUDA: ``mem_get_info``; CPU: available physical memory)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not Linux: assume 8 GiB
        return 8 << 30


def _footprint(model: nn.Module, plan: Plan) -> int:
    """Elements per sample that one block's factors and exact Jacobians hold."""
    o = plan.outputs
    elems = 0
    for mod, use in plan.modules.items():
        io = plan.io[mod]
        local = sum(p.numel() for k, p in mod.named_parameters(recurse=False) if k in use)
        factored = type(mod) is nn.Linear and io == mod.in_features + mod.out_features
        elems += io * (o + 1) + (0 if factored else o * local)
    named = dict(model.named_parameters())
    return elems + 2 * o * sum(named[k].numel() for k in plan.exact)


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{int(nbytes)} bytes"


def _check_limits(chunk_size: Any, max_memory: Any) -> None:
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
    if max_memory is not None and (isinstance(max_memory, bool) or not isinstance(max_memory, (int, float))
                                   or not math.isfinite(max_memory) or max_memory <= 0):
        raise ValueError(f"max_memory must be a positive finite number of bytes or None, got {max_memory!r}")


# ----------------------------------------------------------------------------------------------- entry point
def plan_for(fn: Callable[[Batch], Tensor], model: nn.Module, batch: Batch, batch2: Batch | None = None, *,
             params: Iterable[str] | None = None, implementation: Implementation = "auto", rules: bool = True,
             small: bool = False) -> Plan:
    """Validate the inputs and decide every selected parameter's path (see :mod:`interference.plan`);
    ``rules=False`` puts every parameter on the exact path."""
    _check_batches(batch, batch2, implementation)
    selected = select_parameters(model, params)
    check_per_sample_modes(model)
    with quiet_functorch():
        plan = make_plan(fn, model, selected, batch, batch2, implementation, rules, small)
    plan.selected, plan.dtype = selected, _promoted(selected)
    if implementation == "layerwise" and plan.exact:
        reasons = "; ".join(f"{k}: {plan.paths[k].reason}" for k in plan.exact)
        raise ValueError(f"implementation='layerwise' does not cover parameters {plan.exact} ({reasons});"
                         " use 'auto'")
    return plan


def jacobian_gram(
    fn: Callable[[Batch], Tensor],
    model: nn.Module,
    batch: Batch,
    batch2: Batch | None = None,
    *,
    params: Iterable[str] | None = None,
    output: Output = "full",
    implementation: Implementation = "auto",
    chunk_size: int | None = None,
    max_memory: int | None = None,
    fn_key: Hashable | None = ("outputs",),
    rows_independent: bool = False,
) -> Tensor:
    """Gram matrix of per-sample Jacobians of ``fn`` (see the module docstring).

    Args:
        fn: maps a batch of ``n`` samples to outputs of shape ``(n, O)`` by running ``model``'s modules.
        batch, batch2: ``N`` and ``M`` samples; ``batch2=None`` means ``batch``.
        params: parameter names to differentiate (default: all with ``requires_grad``).
        output: ``"full"`` -> ``(N, M, O, O)``, ``"diagonal"`` -> ``(N, M, O)``, ``"trace"`` -> ``(N, M)``.
        implementation: ``"auto"`` (proven layer-wise rules, the exact path for the rest: ``vmap``, or the loop
            where ``vmap`` fails, with a warning), ``"layerwise"`` (refuse if any parameter is not on a rule),
            ``"func"`` (``vmap(jacrev)`` for everything) or ``"loop"`` (per-sample autograd for everything).
        chunk_size: samples per block; ``None`` picks the largest block that fits ``max_memory``.
        max_memory: bytes the computation may use; default 80% of what the device has free.
        fn_key: what identifies ``fn`` across calls for the plan cache (:mod:`interference.plan_cache`);
            ``None``: no caching.
        rows_independent: the caller proved that ``fn`` computes row ``n`` from sample ``n`` alone
            (:func:`interference.structure.rows_proven`): the every-row check is skipped.
    """
    if output not in _OUTPUTS:
        raise ValueError(f"output must be one of {_OUTPUTS}, got {output!r}")
    _check_limits(chunk_size, max_memory)
    _check_batches(batch, batch2, implementation)
    with engine_call(model):
        batch, batch2 = detached(batch), detached(batch2)
        key = None if fn_key is None else plan_key(model, fn_key, params, batch, batch2, implementation)
        plan = lookup(model, key)
        reused, warned = plan is not None, set()
        if plan is None:
            plan = plan_for(fn, model, batch, batch2, params=params, implementation=implementation, small=True)
        try:
            result = _compute(fn, model, plan, batch, batch2, output, chunk_size, max_memory, warned, rows_independent)
        except NotPerSample as err:
            if not reused:
                failure = err
            else:  # the plan was made on another batch: make it on this one
                forget(model, key)
                plan = plan_for(fn, model, batch, batch2, params=params, implementation=implementation, small=True)
                try:
                    result = _compute(fn, model, plan, batch, batch2, output, chunk_size, max_memory, warned, rows_independent)
                    failure = None
                except NotPerSample as again:
                    failure = again
            if failure is not None:
                if implementation == "layerwise":
                    raise RuntimeError(f"implementation='layerwise': {failure}; use 'auto'") from failure
                warnings.warn(f"{failure}: the model is not a per-sample function of its batch beyond the dry-run"
                              " samples, so every parameter takes the exact per-sample path", stacklevel=2)
                plan = plan_for(fn, model, batch, batch2, params=params, implementation=implementation, rules=False)
                result = _compute(fn, model, plan, batch, batch2, output, chunk_size, max_memory, warned, rows_independent)
        store(model, key, plan)
    return result


def _check_batches(batch: Batch, batch2: Batch | None, implementation: str) -> None:
    if implementation not in _IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {_IMPLEMENTATIONS}, got {implementation!r}")
    batch_size(batch, "x")
    if batch2 is not None:
        batch_size(batch2, "xt")
        check_compatible(batch, batch2)


def _compute(fn, model: nn.Module, plan: Plan, batch: Batch, batch2: Batch | None, output: str,
             chunk_size: int | None, max_memory: float | None, warned: set[str], rows_independent: bool) -> Tensor:
    """The kernel by ``plan``, in blocks that fit the memory budget; :class:`NotPerSample` if a block fails its
    every-row check (none where ``rows_independent``). ``warned``: the fallback warnings given in this call already
    (each is given once)."""
    implementation = plan.implementation
    if plan.fallback and implementation == "func":
        raise RuntimeError(f"implementation='func': {plan.fallback}; use implementation='loop' (per-sample autograd)"
                           " or 'auto'")
    if plan.fallback and plan.fallback not in warned:
        warned.add(plan.fallback)
        _warn_fallback(plan)
    frozen = [p for p in plan.selected.values() if not p.requires_grad]
    for p in frozen:  # named in params although frozen: in the graph, as in the plan's dry runs (use counts)
        p.requires_grad_(True)
    try:
        check = RowCheck(plan.tolerance, plan.check_tolerance, plan.reference, proven=rows_independent)
        with quiet_functorch():
            result = _kernel(fn, model, plan, batch, batch2, output, chunk_size, max_memory, check)
        plan.reference = check.mode
        failed = check.failed()
    finally:
        for p in frozen:
            p.requires_grad_(False)
    if failed:
        raise NotPerSample(f"{failed} for some sample in a block of the batch differ from that sample's alone")
    return result


def _kernel(fn, model: nn.Module, plan: Plan, batch: Batch, batch2: Batch | None, output: str,
            chunk_size: int | None, max_memory: float | None, check: RowCheck) -> Tensor:
    """The kernel in blocks of samples that fit the memory budget."""
    n = batch_size(batch, "x")
    m = n if batch2 is None else batch_size(batch2, "xt")
    o = plan.outputs
    per_pair = {"full": o * o, "diagonal": o, "trace": 1}[output]
    probe = next(iter(plan.selected.values()))
    if plan.identical_samples:  # every sample is the same: one sample's kernel, repeated (exact)
        k = _block_kernel(fn, model, plan, _slice(batch, 0, 1), None, output, check)
        return k.expand(n, m, *k.shape[2:]).contiguous()

    out_elems = n * m * per_pair
    itemsize = torch.empty((), dtype=plan.dtype).element_size()  # the kernel's; factors are cast to it
    foot = _footprint(model, plan)
    budget = int(0.8 * available_memory(probe.device)) if max_memory is None else int(max_memory)

    def need(block: int) -> int:
        return itemsize * (out_elems + 2 * block * foot + 2 * per_pair * block * block)

    if chunk_size is None:
        chunk = max(n, m)
        while chunk > 1 and need(chunk) > budget:
            chunk = (chunk + 1) // 2
    else:
        chunk = min(chunk_size, max(n, m))
    if need(chunk) > budget:
        raise MemoryError(
            f"the kernel needs about {_size(need(chunk))} (output {_size(itemsize * out_elems)}, blocks of {chunk}"
            f" samples) but only {_size(budget)} are allowed; use output='trace' or 'diagonal', fewer samples, a"
            " smaller chunk_size, or raise max_memory"
        )

    return _blocks(fn, model, plan, batch, batch2, output, chunk, n, m, o, probe, check)


def _blocks(fn, model, plan: Plan, batch: Batch, batch2: Batch | None, output: str, chunk: int, n: int, m: int,
            o: int, probe: Tensor, check: RowCheck) -> Tensor:
    """The kernel over blocks of ``chunk`` samples."""
    if chunk >= max(n, m):
        return _block_kernel(fn, model, plan, batch, batch2, output, check)
    other = batch if batch2 is None else batch2
    shape = (n, m) + {"full": (o, o), "diagonal": (o,), "trace": ()}[output]
    result = torch.empty(shape, dtype=plan.dtype, device=probe.device)
    for i in range(0, n, chunk):
        b1 = _slice(batch, i, i + chunk)
        for j in range(0, m, chunk):
            b2 = _slice(other, j, j + chunk)
            same = batch2 is None and i == j
            result[i:i + chunk, j:j + chunk] = _block_kernel(fn, model, plan, b1, None if same else b2, output,
                                                             check)
    return result
