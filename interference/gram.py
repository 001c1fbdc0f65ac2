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
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from .contract import kernel
from .exact import describe_error, func_jacobian, loop_jacobian
from .plan import Plan, close, make_plan
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


class NotPerSample(Exception):
    """A block's outputs or gradients disagree with single-sample runs: the model is not a per-sample function of its
    batch beyond what the dry runs saw (or a layer's input changed in place after the layer ran)."""


@contextmanager
def _capture(plan: Plan) -> Iterator[dict[nn.Module, list]]:
    """Forward hooks that record each planned module's input (and its version) and replace its output by
    ``output + e``: ``e`` is a zero tensor whose gradient is the gradient at the module's output, even if later
    layers modify that output in place."""
    records: dict[nn.Module, list] = {m: [] for m in plan.modules}

    def hook(mod: nn.Module, args: tuple, kwargs: dict, out: Tensor) -> Tensor:
        (inp,) = [t for t in (*args, *kwargs.values()) if isinstance(t, Tensor)]  # one tensor: proven by the plan
        probe = torch.zeros_like(out, requires_grad=True)
        records[mod].append((inp.detach(), probe, inp._version))
        return out + probe

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in plan.modules]
    try:
        yield records
    finally:
        for h in handles:
            h.remove()


def _output_grads(out: Tensor, probes: list[Tensor]) -> list[Tensor | None]:
    """Gradients ``(O, n, *shape)`` of each of the ``O`` outputs (summed over samples) at each probe."""
    n, o = out.shape
    if not out.requires_grad:
        return [None] * len(probes)
    cotangents = torch.eye(o, dtype=out.dtype, device=out.device).unsqueeze(1).expand(o, n, o)
    if o > 1:
        try:
            return list(torch.autograd.grad(out, probes, grad_outputs=cotangents, is_grads_batched=True,
                                            allow_unused=True, retain_graph=True))  # kept for the fallback
        except RuntimeError:  # a backward formula vmap cannot batch (e.g. a recurrent layer): one pass per output
            pass
    per_output = [torch.autograd.grad(out, probes, grad_outputs=cotangents[i], allow_unused=True, retain_graph=True)
                  for i in range(o)]
    return [None if g[0] is None else torch.stack(g) for g in zip(*per_output)]


def _check_block(fn: Callable[[Batch], Tensor], batch: Batch, out: Tensor, plan: Plan, used: list[nn.Module],
                 origin: tuple[int, int]) -> list[Tensor | None] | None:
    """Check a block of ``n`` samples (starting at ``origin`` = (batch 0 or 1, index)) against single samples;
    raises :class:`NotPerSample`.

    Rows 0, n-1 and one more (a dry-run sample's, else n/2) of the outputs must equal those samples' outputs alone
    (catches branches on one sample's values and batch-size tests the two-sample dry runs cannot see). Returns the
    gradients of sample 0's outputs alone (weighted by :func:`_weights`) at the ``used`` modules' outputs, for
    :func:`_check_first_row`."""
    n, tol = out.shape[0], plan.check_tolerance
    scale = float(out.detach().abs().max()) if out.numel() else 0.0  # the block's: outputs after cancellation
    # (a TD error squared) round differently in a batch of n than alone, relative to themselves
    if n == 1:
        return None
    which, start = origin
    known = {i - start: o for (w, i), o in plan.known.items() if w == which and start <= i < start + n}
    rows = {0, n - 1} | set(known)
    rows |= {n // 2} if len(rows) < 3 else set()
    first = [plan.first_grads.get(m) for m in used] if origin == (0, 0) and plan.first_grads else None
    for r in sorted(rows):
        if r in known and (r != 0 or first is not None):
            alone = known[r]
        elif r == 0:
            with torch.enable_grad(), _capture(plan) as records:
                alone = fn(_slice(batch, 0, 1))
            if any(len(records[m]) != 1 for m in used):
                raise NotPerSample("a layer ran a different number of times for sample 0 alone than in its block")
            if alone.requires_grad:
                cot = _weights(alone).unsqueeze(0)
                first = list(torch.autograd.grad(alone, [records[m][0][1] for m in used], cot, allow_unused=True))
        else:
            with torch.no_grad():
                alone = fn(_slice(batch, r, r + 1))
        if not close(out[r:r + 1], alone, tol, scale):
            raise NotPerSample(f"the model's output for sample {r} of a block of {n} differs from its output for that"
                               " sample alone")
    return first


def _weights(out: Tensor) -> Tensor:
    return torch.linspace(1.0, 2.0, out.shape[1], dtype=out.dtype, device=out.device)


def _check_first_row(first: list[Tensor | None] | None, grads: list[Tensor | None], out: Tensor, tol: float) -> None:
    """Sample 0's gradient alone at each layer's output (``first``) must equal row 0 of the block's gradients summed
    over outputs with the same weights (no mixing after a layer, no backward hook that is not linear)."""
    if first is None:
        return
    w = _weights(out)
    for g1, g in zip(first, grads):
        if g1 is None and g is None:
            continue
        if g1 is None or g is None:
            raise NotPerSample("a layer influences sample 0's outputs in its block but not alone, or the reverse")
        summed = torch.tensordot(w.to(g.dtype), g, dims=1)  # (n, ...): the block's gradient for these weights
        if not close(summed[0], g1[0], tol, float(summed.abs().max())):
            raise NotPerSample("the gradient of sample 0's outputs at a layer differs in its block from alone (samples"
                               " mixed after the layer, or a backward hook that is not linear)")


def _layerwise_factors(fn: Callable[[Batch], Tensor], batch: Batch, plan: Plan,
                       origin: tuple[int, int]) -> tuple[list[Factor], Tensor]:
    """Per-layer factors for one block of samples (starting at ``origin``: batch 0 or 1, index), and the outputs
    ``(n, O)``."""
    with torch.enable_grad(), _capture(plan) as records:
        out = fn(batch)
    n = out.shape[0]
    bad = [type(m).__name__ for m, r in records.items() if len(r) != 1 or r[0][0].shape[0] != n]
    if bad:  # the dry runs saw each of them once, on rows that are the samples: control flow depends on the data
        raise NotPerSample(f"modules {bad} ran a different number of times or on other shapes in a block than in the"
                           " dry runs")
    used = [(m, r[0]) for m, r in records.items()]
    if not used:
        return [], out.detach()
    probes = [probe for _, (_, probe, _) in used]
    first = _check_block(fn, batch, out, plan, [m for m, _ in used], origin)
    grads = _output_grads(out, probes)
    _check_first_row(first, grads, out, plan.check_tolerance)
    changed = [type(m).__name__ for m, (inp, _, version) in used if inp._version != version]
    if changed:
        raise NotPerSample(f"the inputs of {changed} were modified in place after those layers ran")
    factors = []
    for (mod, (inp, _, _)), g in zip(used, grads):
        if g is None:  # module ran but does not influence the output
            continue
        with torch.no_grad():  # g: (O, n, *out_shape)
            factors += _checked(mod, rule_for(mod).fn(mod, inp, g, plan.modules[mod]), g.shape[0], n)
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


def _block_kernel(fn, model, plan: Plan, b1: Batch, b2: Batch | None, output: str,
                  origins: tuple[tuple[int, int], tuple[int, int]] = ((0, 0), (1, 0))) -> Tensor:
    """The kernel between two blocks of samples (``b2=None``: the block with itself), in the output layout;
    ``origins``: where each block starts (batch 0 or 1, index)."""
    f1, out1 = _layerwise_factors(fn, b1, plan, origins[0])
    f2, out2 = (f1, out1) if b2 is None else _layerwise_factors(fn, b2, plan, origins[1])
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
             params: Iterable[str] | None = None, implementation: Implementation = "auto", rules: bool = True) -> Plan:
    """Validate the inputs and decide every selected parameter's path (see :mod:`interference.plan`);
    ``rules=False`` puts every parameter on the exact path."""
    if implementation not in _IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {_IMPLEMENTATIONS}, got {implementation!r}")
    batch_size(batch, "x")
    if batch2 is not None:
        batch_size(batch2, "xt")
        check_compatible(batch, batch2)
    selected = select_parameters(model, params)
    check_per_sample_modes(model)
    with quiet_functorch():
        plan = make_plan(fn, model, selected, batch, batch2, implementation, rules)
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
    """
    if output not in _OUTPUTS:
        raise ValueError(f"output must be one of {_OUTPUTS}, got {output!r}")
    _check_limits(chunk_size, max_memory)
    plan = plan_for(fn, model, batch, batch2, params=params, implementation=implementation)
    try:
        return _compute(fn, model, plan, batch, batch2, output, chunk_size, max_memory)
    except NotPerSample as err:
        if implementation == "layerwise":
            raise RuntimeError(f"implementation='layerwise': {err}; use 'auto'") from err
        warnings.warn(f"{err}: the model is not a per-sample function of its batch beyond the dry-run samples, so"
                      " every parameter takes the exact per-sample path", stacklevel=2)
    plan = plan_for(fn, model, batch, batch2, params=params, implementation=implementation, rules=False)
    return _compute(fn, model, plan, batch, batch2, output, chunk_size, max_memory)


def _compute(fn, model: nn.Module, plan: Plan, batch: Batch, batch2: Batch | None, output: str,
             chunk_size: int | None, max_memory: float | None) -> Tensor:
    """The kernel by ``plan``, in blocks that fit the memory budget."""
    implementation = plan.implementation
    if plan.fallback and implementation == "func":
        raise RuntimeError(f"implementation='func': {plan.fallback}; use implementation='loop' (per-sample autograd)"
                           " or 'auto'")
    if plan.fallback:
        _warn_fallback(plan)
    n = batch_size(batch, "x")
    m = n if batch2 is None else batch_size(batch2, "xt")
    o = plan.outputs
    per_pair = {"full": o * o, "diagonal": o, "trace": 1}[output]
    probe = next(iter(plan.selected.values()))
    if plan.identical_samples:  # every sample is the same: one sample's kernel, repeated (exact)
        with quiet_functorch():
            k = _block_kernel(fn, model, plan, _slice(batch, 0, 1), None, output)
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

    with quiet_functorch():
        return _blocks(fn, model, plan, batch, batch2, output, chunk, n, m, o, probe)


def _blocks(fn, model, plan: Plan, batch: Batch, batch2: Batch | None, output: str, chunk: int, n: int, m: int,
            o: int, probe: Tensor) -> Tensor:
    """The kernel over blocks of ``chunk`` samples."""
    if chunk >= max(n, m):
        return _block_kernel(fn, model, plan, batch, batch2, output, ((0, 0), (0 if batch2 is None else 1, 0)))
    other = batch if batch2 is None else batch2
    shape = (n, m) + {"full": (o, o), "diagonal": (o,), "trace": ()}[output]
    result = torch.empty(shape, dtype=plan.dtype, device=probe.device)
    for i in range(0, n, chunk):
        b1 = _slice(batch, i, i + chunk)
        for j in range(0, m, chunk):
            b2 = _slice(other, j, j + chunk)
            same = batch2 is None and i == j
            result[i:i + chunk, j:j + chunk] = _block_kernel(fn, model, plan, b1, None if same else b2, output,
                                                             ((0, i), (0 if batch2 is None else 1, j)))
    return result
