"""What the proofs of :mod:`interference.plan` observe: dry runs of the forward on one or two samples with the
claimed modules' calls recorded (inputs, outputs, their graph nodes), value comparisons within a tolerance, walks of
the autograd graph (which leaves a module's call reaches, uses common to two forwards), the check that the gradient
of one sample's outputs stays in that sample's row, and the refusals built on them (a forward that changes buffers
or draws random numbers, a reentrant checkpoint).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

from .guard import BufferWatch, raise_random, refuse_random, rng_states

Batch = Any


# ----------------------------------------------------------------------------------------------- dry runs
@dataclass
class _Call:
    inp: Tensor | None  # the one tensor argument, or None when there are several / none
    inp_node: Any
    out: Tensor | None
    out_node: Any


def _recording(mods: list[nn.Module], calls: dict[nn.Module, list[_Call]], probes: dict | None = None):
    def hook(mod: nn.Module, args: tuple, kwargs: dict, out: Any) -> Any:
        tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, Tensor)]
        inp = tensors[0] if len(tensors) == 1 else None
        if not isinstance(out, Tensor):
            calls[mod].append(_Call(inp, None, None, None))
            return None
        # values are copied: later in-place ops must not change what the runs compare
        calls[mod].append(_Call(None if inp is None else inp.detach().clone(), None if inp is None else inp.grad_fn,
                                out.detach().clone(), out.grad_fn))
        if probes is not None and out.is_floating_point():
            probe = torch.zeros_like(out, requires_grad=True)
            probes.setdefault(mod, []).append(probe)
            return out + probe
        return None

    return [m.register_forward_hook(hook, with_kwargs=True) for m in mods]


def _run(fn: Callable[[Batch], Tensor], batch: Batch, mods: list[nn.Module], grad: bool,
         probes: dict | None = None) -> tuple[Tensor, dict[nn.Module, list[_Call]]]:
    calls: dict[nn.Module, list[_Call]] = {m: [] for m in mods}
    handles = _recording(mods, calls, probes)
    try:
        with torch.set_grad_enabled(grad):
            out = fn(batch)
    finally:
        for h in handles:
            h.remove()
    return out, calls


def distinct_sample(batch: Batch, batch2: Batch | None, limit: int | None = 16) -> tuple[Batch, int, int] | None:
    """The sample among the first 16 of ``batch`` and of ``batch2`` that differs from ``batch``'s first in the most
    batch entries (bitwise), then by the largest relative distance: ``(1-sample batch, 0 or 1 for batch or batch2,
    index)``; ``None`` if all those samples equal the first (then every later one is looked at too)."""
    ref = [t[:1].detach() for t in pytree.tree_leaves(batch)]
    best, best_score = None, 0.0
    for which, b in enumerate((batch, batch2)):
        if b is None:
            continue
        leaves = [t.detach()[:limit] for t in pytree.tree_leaves(b)]
        n = leaves[0].shape[0]
        score = torch.zeros(n, dtype=torch.float64, device=leaves[0].device)
        for t, r in zip(leaves, ref):
            if t.is_floating_point():  # distance, and bitwise where it is 0 (so -0.0 differs from 0.0)
                d = torch.linalg.vector_norm((t - r).reshape(n, -1), dim=1).double().nan_to_num(1.0, 1.0, 1.0)
                differs = d > 0
                if not bool(differs.all()):
                    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
                    differs |= (t.view(bits) != r.view(bits)).reshape(n, -1).any(1)
                score += d.square() / (d.square() + float(r.double().nan_to_num().square().sum()) + 1e-300)
            else:
                differs = (t != r).reshape(n, -1).any(1)
            score += 2.0 * differs
        i = int(score.argmax())
        if float(score[i]) > best_score:
            best, best_score = (pytree.tree_map(lambda t: t[i:i + 1], b), which, i), float(score[i])
    return best if best is not None or limit is None else distinct_sample(batch, batch2, None)


def _cat(a: Batch, b: Batch) -> Batch:
    return pytree.tree_map(lambda s, t: torch.cat([s, t]), a, b)


def close(a: Tensor, b: Tensor, tol: float, scale: float = 0.0) -> bool:
    """Equal shapes and values within ``tol`` times a scale: ``scale`` or the largest magnitude in ``a`` and ``b``,
    whichever is larger (exact for integers and for non-finite entries)."""
    if a.shape != b.shape:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    if not a.numel():
        return True
    a, b = a.detach(), b.detach()
    diff, own = float((a - b).abs().max()), float(torch.maximum(a.abs().max(), b.abs().max()))
    if math.isfinite(own):
        return diff <= tol * max(scale, own, 1e-300)
    finite = torch.isfinite(a)
    if not torch.equal(finite, torch.isfinite(b)) or not torch.equal(a[~finite].nan_to_num(), b[~finite].nan_to_num()):
        return False
    return close(a[finite], b[finite], tol, scale)


def _rows_ok(pair: Tensor | None, first: Tensor | None, second: Tensor | None, tol: float) -> bool:
    """``pair`` (2, ...) holds ``first`` (1, ...) and ``second`` (1, ...) as its rows."""
    if pair is None or first is None or second is None:
        return False
    if first.dim() == 0 or first.shape[0] != 1 or second.shape != first.shape:
        return False
    return pair.shape == (2, *first.shape[1:]) and close(pair, torch.cat([first, second]), tol)


def tolerance(model: nn.Module, batch: Batch) -> float:
    """``sqrt(eps)`` of the least precise floating dtype among the model's parameters and buffers and the inputs."""
    dtypes = {t.dtype for t in (*model.parameters(), *model.buffers(), *pytree.tree_leaves(batch))
              if t.is_floating_point()} or {torch.get_default_dtype()}
    return max(torch.finfo(d).eps for d in dtypes) ** 0.5


# ----------------------------------------------------------------------------------------------- the autograd graph
def _leaves_below(roots: list[Any], cuts: dict[Any, tuple[nn.Module, list[Any]]],
                  own: dict[nn.Module, set[int]]) -> set[int]:
    """ids of the leaf tensors reachable from ``roots`` outside the module calls in ``cuts`` (a call's output node ->
    its module and input nodes), plus those a call reaches inside itself that are not its module's own parameters.

    Outside a call the walk skips the call's inside and goes on from its inputs; inside, it stops at the inputs."""
    reached: set[int] = set()
    outer, seen_outer = list(roots), set()
    while outer:
        node = outer.pop()
        if node is None or node in seen_outer:
            continue
        seen_outer.add(node)
        if node in cuts:
            mod, inputs = cuts[node]
            outer.extend(inputs)
            stops, inner, seen = set(inputs), [nxt for nxt, _ in node.next_functions], set()
            while inner:  # the call's inside: its own parameters only
                n = inner.pop()
                if n is None or n in seen or n in stops:
                    continue
                seen.add(n)
                if n in cuts:  # a nested call: counted when the outer walk reaches it
                    outer.append(n)
                    continue
                var = getattr(n, "variable", None)
                if var is not None:
                    if id(var) not in own[mod]:
                        reached.add(id(var))
                    continue
                inner.extend(nxt for nxt, _ in n.next_functions)
            continue
        var = getattr(node, "variable", None)
        if var is not None:
            reached.add(id(var))
            continue
        outer.extend(nxt for nxt, _ in node.next_functions)
    return reached


def _nodes(root: Any) -> set[Any]:
    """Every node of the autograd graph under ``root``."""
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack.extend(nxt for nxt, _ in node.next_functions)
    return seen


def use_counts(root: Any, ids: set[int]) -> dict[int, int]:
    """How many graph nodes under ``root`` consume each leaf tensor whose id is in ``ids``."""
    counts = dict.fromkeys(ids, 0)
    if root is None:
        return counts
    for node in _nodes(root):
        for nxt, _ in node.next_functions:
            var = getattr(nxt, "variable", None)
            if var is not None and id(var) in counts:
                counts[id(var)] += 1
    return counts


def hidden_uses(first: Tensor, second: Tensor) -> set[int]:
    """ids of the leaves reached through graph nodes common to two forwards' outputs ``first`` and ``second``:
    tensors made from parameters outside ``forward`` (a view taken in ``__init__``), which ``functional_call`` and
    so ``torch.func`` cannot see."""
    if first.grad_fn is None or second.grad_fn is None:
        return set()
    common = [n for n in _nodes(first.grad_fn) & _nodes(second.grad_fn) if getattr(n, "variable", None) is None]
    below = set().union(*(_nodes(n) for n in common)) if common else set()
    return {id(n.variable) for n in below if getattr(n, "variable", None) is not None}


# ----------------------------------------------------------------------------------------------- checks and refusals
def check_pure(fn: Callable[[Batch], Tensor], model: nn.Module, one: Batch) -> None:
    """Refuse (ValueError) a forward that changes the model's buffers (put back first) or draws random numbers, from
    two runs of ``fn`` on the one-sample batch ``one``."""
    watch, rng = BufferWatch(model), rng_states()
    try:
        with torch.no_grad():
            first, second = fn(one), fn(one)
    except BaseException:
        watch.refuse_if_changed()
        watch.restore()
        raise
    watch.refuse_if_changed()
    refuse_random(rng)
    if not close(first, second, min(16 * tolerance(model, one), 0.05)):
        raise_random()


def unseen_message(names: list[str]) -> str:
    return (f"torch.func (functional_call + vmap) cannot see how {names} reach the output (through a tensor made from"
            " them outside forward, e.g. a view taken in __init__)")


def unseen_parameters(fn: Callable[[Batch], Tensor], selected: dict[str, nn.Parameter], one: Batch) -> list[str]:
    """Selected parameters that reach ``fn``'s output through tensors made outside ``forward`` (two runs on ``one``)."""
    frozen = [p for p in selected.values() if not p.requires_grad]
    for p in frozen:
        p.requires_grad_(True)
    try:
        with torch.enable_grad():
            hidden = hidden_uses(fn(one), fn(one))
    finally:
        for p in frozen:
            p.requires_grad_(False)
    return [k for k, p in selected.items() if id(p) in hidden]


def _refuse_reentrant_checkpoint(out: Tensor) -> None:
    if out.grad_fn is not None and any(type(n).__name__ == "CheckpointFunctionBackward" for n in _nodes(out.grad_fn)):
        raise_reentrant()


def raise_reentrant() -> None:
    raise RuntimeError("the model's forward uses torch.utils.checkpoint with use_reentrant=True, which supports only"
                       " loss.backward() (no gradients of single outputs, and none at all for inputs that do not"
                       " require grad); pass use_reentrant=False, which every implementation supports")


def _check_gradient_rows(out: Tensor, probes: dict[nn.Module, Tensor], refuse: Callable[[nn.Module, str], None],
                         tol: float) -> None:
    """Refuse modules at whose output the gradient of one sample's outputs (``out`` (2, O) of a pair run, ``probes``
    the zero tensors added to the modules' outputs in it) reaches the other sample's row, or where sample 0's row
    changes when sample 1's outputs are differentiated as well (a backward hook that is not linear, e.g. clipping)."""
    if not probes or not out.requires_grad:
        return
    used = list(probes)
    weights = torch.linspace(1.0, 2.0, out.shape[1], dtype=out.dtype, device=out.device)
    cot = torch.zeros(2, *out.shape, dtype=out.dtype, device=out.device)
    cot[0, 0], cot[1] = weights, weights  # sample 0's outputs only; both samples' outputs
    first, both = (torch.autograd.grad(out, [probes[m] for m in used], cot[r], retain_graph=r == 0, allow_unused=True)
                   for r in (0, 1))
    for mod, g0, g in zip(used, first, both):
        if g0 is None and g is None:
            continue
        if g0 is None or g is None:
            refuse(mod, "the gradient at its output depends on which samples' outputs are differentiated")
            continue
        own = max(float(g0[0].abs().max()), float(g[0].abs().max()), 1e-30)
        if float(g0[1].abs().max()) > tol * own:
            refuse(mod, "the gradient of one sample's outputs reaches another sample's row at its output"
                        " (samples are mixed after it)")
        elif not close(g[0], g0[0], tol):  # sample 1's cotangent must leave sample 0's row alone
            refuse(mod, "the gradient at sample 0's row changes when sample 1's outputs are differentiated too"
                        " (samples mixed after it, or a backward hook that clips or normalises gradients)")
