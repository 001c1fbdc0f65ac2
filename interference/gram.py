"""Gram matrices of per-sample Jacobians: the engine behind :func:`ntk` and :func:`gradient_covariance`.

For a function ``fn(batch) -> (n, O)`` that runs an ``nn.Module`` on a batch whose samples do not interact,
the Gram matrix ``K[n, m, o, p] = <d fn(x_n)_o / d theta, d fn(x'_m)_p / d theta>`` over the selected
parameters ``theta`` is computed in two parts that add up:

* the layer-wise path: forward hooks on modules of known types (``nn.Linear``, ``nn.Conv2d``, ``nn.LayerNorm``,
  :class:`~interference.activations.Elephant`) record their inputs, and one batched backward pass (one
  cotangent per output) gives the gradients at their outputs. A 2-D ``Linear`` contributes
  ``(A A'^T + 1) * (B B'^T)`` without ever forming per-sample gradients; the others contribute the Gram of their
  (small) per-sample gradients, formed one layer at a time.
* the ``torch.func`` path (``vmap(jacrev(...))``) for every selected parameter the layer-wise path does not cover:
  parameters of unknown module types, of modules called more than once per forward, or shared between modules.

A batch is a tensor or a pytree (tuple, list, dict, namedtuple) of tensors that share the leading dimension.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils import _pytree as pytree

from .activations import Elephant, _abs_pow

Batch = Any  # a Tensor or a pytree of Tensors with a common leading dimension
Output = Literal["full", "trace", "diagonal"]
Implementation = Literal["auto", "layerwise", "func"]

__all__ = ["jacobian_gram", "select_parameters", "single_sample_fn", "batch_size", "available_memory", "Batch"]

_OUTPUTS = ("full", "trace", "diagonal")
_IMPLEMENTATIONS = ("auto", "layerwise", "func")


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
    """The parameters to differentiate: ``params`` by name, or all with ``requires_grad=True``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    named = dict(model.named_parameters())
    if params is None:
        chosen = {k: p for k, p in named.items() if p.requires_grad}
        if not chosen:
            raise ValueError("model has no trainable parameters (requires_grad=True); pass params=[names] to choose some")
        return chosen
    if isinstance(params, str):
        params = [params]
    names = list(params)
    unknown = [k for k in names if k not in named]
    if unknown:
        raise ValueError(f"unknown parameter names {unknown}; the model has {list(named)}")
    if not names:
        raise ValueError("params is empty: choose at least one parameter name")
    return {k: named[k] for k in names}


# ----------------------------------------------------------------------------------------------- layer rules
# Rules see ``gout`` in output-major layout ``(O, n, *out_shape)`` (as the batched backward returns it) and
# return factors in the same layout, so rows ``(o, n)`` flatten into one matrix without copies.
@dataclass
class _Factor:
    """One layer's contribution for a block of samples.

    Either ``gram`` (2-D Linear): ``a`` (n, in) or None, ``bias`` flag, ``b`` (O, n, out); or ``g`` (O, n, P).
    """

    a: Tensor | None = None
    bias: bool = False
    b: Tensor | None = None
    g: Tensor | None = None


def _sum_rest(t: Tensor) -> Tensor:
    """Sum ``(O, n, rest, ...)`` over ``rest`` (weight sharing over positions); a view when ``rest == 1``."""
    return t.squeeze(2) if t.shape[2] == 1 else t.sum(2)


def _per_output_bmm(b: Tensor, u: Tensor) -> Tensor:
    """``(O, n, X, L) @ (n, L, Y) -> (O, n, X*Y)``, one batched product per output, written in place (no copies)."""
    o, n, x = b.shape[:3]
    out = b.new_empty(o, n, x, u.shape[-1])
    for i in range(o):
        torch.bmm(b[i], u, out=out[i])
    return out.reshape(o, n, -1)


def _linear_rule(mod: nn.Linear, inp: Tensor, gout: Tensor, use: set[str]) -> list[_Factor]:
    w, bias = "weight" in use, "bias" in use
    if inp.dim() == 2:
        return [_Factor(a=inp if w else None, bias=bias, b=gout)]
    o, n = gout.shape[:2]
    a = inp.reshape(n, -1, inp.shape[-1])
    b = gout.reshape(o, n, -1, gout.shape[-1])
    out = []
    if w:
        out.append(_Factor(g=_per_output_bmm(b.transpose(2, 3), a)))  # (O, n, out*in)
    if bias:
        out.append(_Factor(g=_sum_rest(b)))
    return out


def _conv2d_rule(mod: nn.Conv2d, inp: Tensor, gout: Tensor, use: set[str]) -> list[_Factor]:
    o, n, c_out = gout.shape[:3]
    b = gout.reshape(o, n, c_out, -1)
    out = []
    if "weight" in use:
        u = F.unfold(inp, mod.kernel_size, dilation=mod.dilation, padding=mod.padding, stride=mod.stride)
        out.append(_Factor(g=_per_output_bmm(b, u.transpose(1, 2))))  # (O, n, c_out * c_in*kh*kw)
    if "bias" in use:
        out.append(_Factor(g=b.sum(-1)))
    return out


def _layer_norm_rule(mod: nn.LayerNorm, inp: Tensor, gout: Tensor, use: set[str]) -> list[_Factor]:
    o, n = gout.shape[:2]
    k = len(mod.normalized_shape)
    b = gout.reshape(o, n, -1, *gout.shape[gout.dim() - k:])  # (O, n, rest, *normalized)
    out = []
    if "weight" in use:
        xhat = F.layer_norm(inp, mod.normalized_shape, None, None, mod.eps)
        xhat = xhat.reshape(1, n, -1, *xhat.shape[xhat.dim() - k:])
        out.append(_Factor(g=_sum_rest(b * xhat).reshape(o, n, -1)))
    if "bias" in use:
        out.append(_Factor(g=_sum_rest(b).reshape(o, n, -1)))
    return out


def _elephant_rule(mod: Elephant, inp: Tensor, gout: Tensor, use: set[str]) -> list[_Factor]:
    # dy/dlog_h = h s = y and dy/dlog_a = h d |u|^d s^2, with u = x/a and s = 1/(1 + |u|^d).
    o, n = gout.shape[:2]
    p = _abs_pow(inp / mod.a, mod.d, inplace=True)
    s = p.add(1.0).reciprocal_()
    hs = mod.h * s
    lead = (o, n, -1, 1) if mod.num_units is None else (o, n, -1, inp.shape[-1])
    out = []
    for name, dy in (("log_h", hs), ("log_a", p.mul_(s).mul_(hs).mul_(mod.d) if "log_a" in use else None)):
        if name in use:
            g = _sum_rest((gout * dy.unsqueeze(0)).reshape(lead))
            out.append(_Factor(g=g.sum(-1, keepdim=True) if mod.num_units is None else g))
    return out


_Rule = Callable[[nn.Module, Tensor, Tensor, set[str]], list[_Factor]]
_RULES: dict[type, _Rule] = {
    nn.Linear: _linear_rule,
    nn.Conv2d: _conv2d_rule,
    nn.LayerNorm: _layer_norm_rule,
    Elephant: _elephant_rule,
}


def _rule_for(mod: nn.Module) -> _Rule | None:
    rule = _RULES.get(type(mod))
    if rule is _conv2d_rule and (mod.groups != 1 or mod.padding_mode != "zeros" or isinstance(mod.padding, str)):
        return None
    return rule


# ----------------------------------------------------------------------------------------------- plan
@dataclass
class _Plan:
    """Which selected parameters each path handles."""

    modules: dict[nn.Module, set[str]] = field(default_factory=dict)  # module -> its local param names to use
    func_names: list[str] = field(default_factory=list)  # full names for the torch.func path


def _make_plan(model: nn.Module, selected: dict[str, nn.Parameter], implementation: str) -> _Plan:
    plan = _Plan()
    if implementation == "func":
        plan.func_names = list(selected)
        return plan
    owners: dict[int, int] = {}
    for mod in model.modules():
        for p in mod.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    seen: dict[int, str] = {}
    for full, p in model.named_parameters(remove_duplicate=False):
        seen.setdefault(id(p), full)
    covered: set[str] = set()
    for prefix, mod in model.named_modules():
        rule = _rule_for(mod)
        if rule is None:
            continue
        use = set()
        for local, p in mod.named_parameters(recurse=False):
            full = seen[id(p)]
            if full in selected and owners[id(p)] == 1:
                use.add(local)
                covered.add(full)
        if use:
            plan.modules[mod] = use
    plan.func_names = [k for k in selected if k not in covered]
    return plan


# ----------------------------------------------------------------------------------------------- layer-wise pass
@contextmanager
def _capture(plan: _Plan) -> Iterator[dict[nn.Module, list]]:
    """Forward hooks that record each planned module's input and replace its output by ``output + e``.

    ``e`` is a zero tensor whose gradient is the gradient at the module's output, even if later layers
    modify that output in place.
    """
    records: dict[nn.Module, list] = {m: [] for m in plan.modules}

    def hook(mod: nn.Module, args: tuple, out: Tensor) -> Tensor:
        probe = torch.zeros_like(out, requires_grad=True)
        records[mod].append((args[0].detach(), probe))
        return out + probe

    handles = [m.register_forward_hook(hook) for m in plan.modules]
    try:
        yield records
    finally:
        for h in handles:
            h.remove()


def _layerwise_factors(fn: Callable[[Batch], Tensor], batch: Batch, plan: _Plan) -> tuple[list[_Factor], Tensor]:
    """Per-layer factors for one block of samples, and the outputs ``(n, O)``."""
    with torch.enable_grad(), _capture(plan) as records:
        out = fn(batch)
    bad = [type(m).__name__ for m, r in records.items() if len(r) > 1]
    if bad:  # the one-sample dry run saw each of them once: the forward's control flow depends on the data
        raise RuntimeError(f"modules {bad} ran more than once on this block but once on a single sample;"
                           " use implementation='func' for models whose structure depends on the batch")
    used = [(m, r[0]) for m, r in records.items() if r]
    if not used:
        return [], out.detach()
    n, o = out.shape
    probes = [probe for _, (_, probe) in used]
    cotangents = torch.eye(o, dtype=out.dtype, device=out.device).unsqueeze(1).expand(o, n, o)
    if o == 1:
        grads = torch.autograd.grad(out, probes, grad_outputs=cotangents[0], allow_unused=True)
        grads = [None if g is None else g.unsqueeze(0) for g in grads]  # (O=1, n, *out_shape)
    else:
        grads = torch.autograd.grad(out, probes, grad_outputs=cotangents, is_grads_batched=True, allow_unused=True)
    factors = []
    for (mod, (inp, _)), g in zip(used, grads):
        if g is None:  # module ran but does not influence the output
            continue
        with torch.no_grad():  # g: (O, n, *out_shape)
            factors += _rule_for(mod)(mod, inp, g, plan.modules[mod])
    return factors, out.detach()


class _ReusedModules(Exception):
    def __init__(self, modules: list[nn.Module]) -> None:
        self.modules = modules


# ----------------------------------------------------------------------------------------------- torch.func path
class _FnModule(nn.Module):
    """Wraps ``fn`` so that ``torch.func.functional_call`` can swap the model's parameters under it."""

    def __init__(self, model: nn.Module, fn: Callable[[Batch], Tensor]) -> None:
        super().__init__()
        self.model = model
        self.fn = fn

    def forward(self, batch: Batch) -> Tensor:
        return self.fn(batch)


def single_sample_fn(model: nn.Module, fn: Callable[[Batch], Tensor]) -> Callable[[dict[str, Tensor], Batch], Tensor]:
    """``f(params, sample)``: ``fn`` on one sample (no batch dimension) with ``params`` swapped into ``model``.

    Every other parameter enters detached, so ``torch.func`` transforms over ``params`` and samples
    (``vmap(jacrev(f))``) build no graph through the rest of the model.
    """
    wrapper = _FnModule(model, fn)
    fixed = {f"model.{k}": p.detach() for k, p in model.named_parameters()}

    def single(params: dict[str, Tensor], sample: Batch) -> Tensor:
        one = pytree.tree_map(lambda t: t.unsqueeze(0), sample)
        swapped = {**fixed, **{f"model.{k}": v for k, v in params.items()}}
        return torch.func.functional_call(wrapper, swapped, (one,)).squeeze(0)

    return single


def _func_jacobian(fn: Callable[[Batch], Tensor], model: nn.Module, names: list[str], batch: Batch) -> Tensor:
    """Per-sample Jacobian ``(O, n, P)`` of ``fn`` w.r.t. the named parameters, by ``vmap(jacrev)``."""
    named = dict(model.named_parameters())
    params = {k: named[k].detach() for k in names}
    jac = torch.func.vmap(torch.func.jacrev(single_sample_fn(model, fn)), in_dims=(None, 0))(params, batch)
    n = batch_size(batch)
    return torch.cat([jac[k].reshape(n, jac[k].shape[1], -1) for k in names], dim=-1).transpose(0, 1).contiguous()


# ----------------------------------------------------------------------------------------------- contraction
# Kernels accumulate in an output-major working layout that keeps every contraction a plain matrix product:
# full -> (O*n, O*m) with rows (o, n) and columns (q, m); diagonal -> (O, n, m); trace -> (n, m).
def _work_shape(n: int, m: int, o: int, output: str) -> tuple[int, ...]:
    return {"full": (o * n, o * m), "diagonal": (o, n, m), "trace": (n, m)}[output]


def _from_work(work: Tensor, n: int, m: int, o: int, output: str) -> Tensor:
    if output == "full":
        return work.view(o, n, o, m).permute(1, 3, 0, 2).contiguous()
    return work.permute(1, 2, 0).contiguous() if output == "diagonal" else work


def _dense(f: _Factor | Tensor) -> Tensor | None:
    """The per-sample Jacobian ``(O, n, P)`` of a factor (``torch.func`` path or ``g``); None for a Linear gram."""
    return f if isinstance(f, Tensor) else f.g


def _outer(f1: _Factor, f2: _Factor) -> Tensor:
    """``A A'^T + 1`` (or its parts) of two 2-D Linear factors: ``(n, m)``."""
    n, m = f1.b.shape[1], f2.b.shape[1]
    outer = (f1.a @ f2.a.T) if f1.a is not None else None
    if f1.bias:
        outer = outer + 1.0 if outer is not None else f1.b.new_ones(n, m)
    return outer


def _full_outer(f1: _Factor | Tensor, f2: _Factor | Tensor) -> Tensor | None:
    """For 2-D Linear factors, ``A A'^T + 1`` repeated to the ``(O*n, O*m)`` working layout; else None."""
    if _dense(f1) is not None:
        return None
    o = f1.b.shape[0]
    return _outer(f1, f2).repeat(o, o)


def _accumulate_full(work: Tensor, f1: _Factor | Tensor, f2: _Factor | Tensor, rows: slice, cols: slice,
                     outer: Tensor | None) -> None:
    """Add the full kernel between two factors to ``work``, the ``(rows, cols)`` panel of the working matrix.

    ``rows`` and ``cols`` index the flattened ``(o, n)`` rows of ``f1`` and ``(q, m)`` rows of ``f2``; ``outer``
    is ``_full_outer(f1, f2)``.
    """
    g1, g2 = _dense(f1), _dense(f2)
    if g1 is not None:
        work.addmm_(g1.reshape(-1, g1.shape[-1])[rows], g2.reshape(-1, g2.shape[-1])[cols].T)
        return
    bb = f1.b.reshape(-1, f1.b.shape[-1])[rows] @ f2.b.reshape(-1, f2.b.shape[-1])[cols].T
    work.addcmul_(bb, outer[rows, cols])


def _accumulate_reduced(work: Tensor, f1: _Factor | Tensor, f2: _Factor | Tensor, output: str) -> None:
    """Add the diagonal ``(O, n, m)`` or trace ``(n, m)`` kernel between two factors to ``work``."""
    g1, g2 = _dense(f1), _dense(f2)
    if g1 is not None:
        if output == "diagonal":
            work.baddbmm_(g1, g2.transpose(1, 2))
        else:
            for o in range(g1.shape[0]):
                work.addmm_(g1[o], g2[o].T)
        return
    bb = torch.bmm(f1.b, f2.b.transpose(1, 2))  # (O, n, m)
    work.addcmul_(bb if output == "diagonal" else bb.sum(0), _outer(f1, f2))


def _samples(f: _Factor | Tensor, start: int, stop: int | None = None) -> _Factor | Tensor:
    """Samples ``start:stop`` of a factor."""
    if isinstance(f, Tensor):
        return f[:, start:stop]
    if f.g is not None:
        return _Factor(g=f.g[:, start:stop])
    return _Factor(a=None if f.a is None else f.a[start:stop], bias=f.bias, b=f.b[:, start:stop])


def _block_kernel(fn, model, plan, b1, b2, output) -> Tensor:
    """The kernel between two blocks of samples (``b2=None``: the block with itself), in the output layout.

    With itself the kernel is symmetric: it is computed in row panels, panel ``i`` against the columns from
    panel ``i`` on (a little over half the work with 8 panels), and the rest is mirrored.
    """
    f1, out1 = _layerwise_factors(fn, b1, plan)
    f2, out2 = (f1, out1) if b2 is None else _layerwise_factors(fn, b2, plan)
    if plan.func_names:
        j1 = _func_jacobian(fn, model, plan.func_names, b1)
        j2 = j1 if b2 is None else _func_jacobian(fn, model, plan.func_names, b2)
        f1, f2 = f1 + [j1], f2 + [j2]
    if not f1:
        raise ValueError("none of the selected parameters influences the output (all gradients are zero)")
    (n, o), m = out1.shape, out2.shape[0]
    work = out1.new_zeros(_work_shape(n, m, o, output))
    full = output == "full"
    if b2 is not None:
        for a, b in zip(f1, f2):
            if full:
                _accumulate_full(work, a, b, slice(None), slice(None), _full_outer(a, b))
            else:
                _accumulate_reduced(work, a, b, output)
        return _from_work(work, n, m, o, output)
    size = o * n if full else n  # panels split the working matrix's rows: (o, n) pairs, or samples
    parts = min(8, size // 64) or 1  # panels of at least 64 rows keep the matrix products efficient
    edges = [size * i // parts for i in range(parts + 1)]
    for f in f1:
        outer = _full_outer(f, f) if full else None
        for i in range(parts):
            r = slice(edges[i], edges[i + 1])
            if full:
                c = slice(edges[i], None)
                _accumulate_full(work[r, c], f, f, r, c, outer)
            else:
                _accumulate_reduced(work[..., r, edges[i]:], _samples(f, r.start, r.stop), _samples(f, r.start),
                                    output)
    for i in range(parts - 1):  # mirror the part below the diagonal panels
        r, c = slice(edges[i], edges[i + 1]), slice(edges[i + 1], None)
        work[..., c, r] = work[..., r, c].transpose(-1, -2)
    return _from_work(work, n, m, o, output)


# ----------------------------------------------------------------------------------------------- memory
def available_memory(device: torch.device) -> int:
    """Bytes free on ``device`` now (CUDA: ``mem_get_info``; CPU: available physical memory)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # not Linux: assume 8 GiB
        return 8 << 30


@dataclass
class _Footprint:
    """Per-sample memory (in elements) of one block's factors, measured by a one-sample dry run."""

    per_sample: int
    outputs: int


def _footprint(fn, model, plan, batch) -> _Footprint:
    one = _slice(batch, 0, 1)
    sizes: dict[nn.Module, list[int]] = {}

    def hook(mod, args, out):
        sizes.setdefault(mod, []).append(args[0].numel() + out.numel())
    handles = [m.register_forward_hook(hook) for m in plan.modules]
    try:
        with torch.no_grad():
            out = fn(one)
    finally:
        for h in handles:
            h.remove()
    reused = [m for m, s in sizes.items() if len(s) > 1]
    if reused:
        raise _ReusedModules(reused)
    o = out.shape[1]
    elems = 0
    for mod, use in plan.modules.items():
        if mod not in sizes:
            continue
        io = sizes[mod][0]
        local = sum(p.numel() for k, p in mod.named_parameters(recurse=False) if k in use)
        gram = type(mod) is nn.Linear and io == mod.in_features + mod.out_features
        elems += io * (o + 1) + (0 if gram else o * local)
    elems += 2 * o * sum(dict(model.named_parameters())[k].numel() for k in plan.func_names)
    return _Footprint(per_sample=elems, outputs=o)


# ----------------------------------------------------------------------------------------------- entry point
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
        fn: maps a batch of ``n`` samples to outputs of shape ``(n, O)``; must run ``model``'s modules and treat
            samples independently.
        batch, batch2: ``N`` and ``M`` samples; ``batch2=None`` means ``batch``.
        params: parameter names to differentiate (default: all with ``requires_grad``).
        output: ``"full"`` -> ``(N, M, O, O)``, ``"diagonal"`` -> ``(N, M, O)``, ``"trace"`` -> ``(N, M)``.
        implementation: ``"auto"`` (layer-wise, ``torch.func`` for uncovered parameters), ``"layerwise"``
            (refuse if any parameter is uncovered) or ``"func"`` (``torch.func`` for everything).
        chunk_size: samples per block; ``None`` picks the largest block that fits ``max_memory``.
        max_memory: bytes the computation may use; default 80% of what the device has free.
    """
    if output not in _OUTPUTS:
        raise ValueError(f"output must be one of {_OUTPUTS}, got {output!r}")
    if implementation not in _IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {_IMPLEMENTATIONS}, got {implementation!r}")
    n = batch_size(batch, "x")
    m = n if batch2 is None else batch_size(batch2, "xt")
    if batch2 is not None:
        check_compatible(batch, batch2)
    selected = select_parameters(model, params)
    for mod in model.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.training:
            raise ValueError(
                f"{type(mod).__name__} in training mode mixes samples, so per-sample Jacobians are undefined;"
                " call model.eval() first"
            )
    plan = _make_plan(model, selected, implementation)
    try:
        foot = _footprint(fn, model, plan, batch)
    except _ReusedModules as err:  # modules called twice per forward go to the torch.func path
        names = {k for k, p in model.named_parameters() for mod in err.modules for q in mod.parameters(False)
                 if p is q and k in selected}
        for mod in err.modules:
            plan.modules.pop(mod)
        plan.func_names += [k for k in selected if k in names and k not in plan.func_names]
        foot = _footprint(fn, model, plan, batch)
    if implementation == "layerwise" and plan.func_names:
        raise ValueError(f"implementation='layerwise' does not cover parameters {plan.func_names}; use 'auto'")

    o = foot.outputs
    out_elems = n * m * {"full": o * o, "diagonal": o, "trace": 1}[output]
    probe = next(iter(selected.values()))
    itemsize = probe.element_size()
    budget = int(0.8 * available_memory(probe.device)) if max_memory is None else int(max_memory)

    def need(block: int) -> int:
        per_block = {"full": o * o, "diagonal": o, "trace": 1}[output] * block * block
        return itemsize * (out_elems + 2 * block * foot.per_sample + 2 * per_block)

    if chunk_size is None:
        chunk = max(n, m)
        while chunk > 1 and need(chunk) > budget:
            chunk = (chunk + 1) // 2
    else:
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
        chunk = chunk_size
    if need(chunk) > budget:
        raise MemoryError(
            f"the kernel needs about {need(chunk) / 2**30:.2f} GiB (output {itemsize * out_elems / 2**30:.2f} GiB,"
            f" blocks of {chunk} samples) but only {budget / 2**30:.2f} GiB are allowed; use output='trace' or"
            " 'diagonal', fewer samples, a smaller chunk_size, or raise max_memory"
        )

    if chunk >= max(n, m):
        return _block_kernel(fn, model, plan, batch, batch2, output)
    other = batch if batch2 is None else batch2
    shape = (n, m) + {"full": (o, o), "diagonal": (o,), "trace": ()}[output]
    result = torch.empty(shape, dtype=probe.dtype, device=probe.device)
    for i in range(0, n, chunk):
        b1 = _slice(batch, i, i + chunk)
        for j in range(0, m, chunk):
            b2 = _slice(other, j, j + chunk)
            same = batch2 is None and i == j
            result[i:i + chunk, j:j + chunk] = _block_kernel(fn, model, plan, b1, None if same else b2, output)
    return result


