"""The exact paths: per-sample Jacobians for any parameters, by ``torch.func`` or by a plain autograd loop.

* ``func``: ``vmap(jacrev(f))`` over samples, ``f`` the model on one sample with the parameters swapped in by
  ``functional_call``. Fast (one vectorised pass), but ``vmap`` cannot run every module: ``nn.GRU``/``nn.LSTM`` (in
  float64), in-place updates of a state created inside ``forward``, data-dependent Python control flow, random ops.
* ``loop``: for each sample a forward pass and one backward pass per output (``n`` forwards and ``n * O``
  backwards) on the model's own parameters: runs whatever ``loss.backward()`` runs and sees every use of a
  parameter, at Python-loop speed.

``functional_call`` cannot see a parameter used through a tensor made outside ``forward`` (a view taken in
``__init__``), and ``vmap`` has batching bugs (``nn.PReLU`` in torch 2.13: an error when the batch size differs from
the number of outputs, wrong Jacobians when they are equal); :func:`exact_path_check` compares the two on the dry-run
samples so such models take the loop.

Both treat each sample alone, which defines the per-sample Jacobian even for models that mix samples.
"""

from __future__ import annotations

import contextlib

import sys
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

__all__ = ["single_sample_fn", "func_jacobian", "loop_jacobian", "failing_module", "describe_error",
           "exact_path_check"]

Batch = Any


class _FnModule(nn.Module):
    """Wraps ``fn`` so that ``torch.func.functional_call`` can swap the model's parameters under it."""

    def __init__(self, model: nn.Module, fn: Callable[[Batch], Tensor]) -> None:
        super().__init__()
        self.model = model
        self.fn = fn

    def forward(self, batch: Batch) -> Tensor:
        return self.fn(batch)


@contextlib.contextmanager
def preserved(model: nn.Module) -> Iterator[None]:
    """Puts every module's own parameter and buffer objects back on exit, whatever happened inside.

    ``functional_call`` swaps tensors into a module by attribute; a module reachable under two names (an aliased
    submodule) is swapped twice and restored once, and would keep a plain tensor where its ``Parameter`` was, so
    that it stopped training. Restoring the objects themselves (not their values) keeps their ``.grad``, hooks and
    ``requires_grad`` too.
    """
    saved = [(mod, dict(mod._parameters), dict(mod._buffers)) for mod in model.modules()]
    try:
        yield
    finally:
        for mod, params, buffers in saved:
            for store, own in ((mod._parameters, params), (mod._buffers, buffers)):
                for name, value in own.items():
                    if store.get(name) is not value or name in mod.__dict__:
                        mod.__dict__.pop(name, None)
                        store[name] = value


def single_sample_fn(model: nn.Module, fn: Callable[[Batch], Tensor]) -> Callable[[dict[str, Tensor], Batch], Tensor]:
    """``f(params, sample)``: ``fn`` on one sample (no batch dimension) with ``params`` swapped into ``model``.

    Every other parameter enters detached, so transforms over ``params`` build no graph through the rest.
    """
    wrapper = _FnModule(model, fn)
    fixed = {f"model.{k}": p.detach() for k, p in model.named_parameters()}
    # a parameter reachable under several names (an aliased submodule, a tied weight) is swapped under every one of
    # them: functional_call otherwise leaves the other names' modules holding plain tensors after the call
    aliases: dict[str, list[str]] = {}
    canonical = {id(p): k for k, p in model.named_parameters()}
    for k, p in model.named_parameters(remove_duplicate=False):
        if canonical[id(p)] != k:
            aliases.setdefault(canonical[id(p)], []).append(k)

    def single(params: dict[str, Tensor], sample: Batch) -> Tensor:
        one = pytree.tree_map(lambda t: t.unsqueeze(0), sample)
        swapped = {**fixed, **{f"model.{k}": v for k, v in params.items()}}
        swapped.update({f"model.{a}": swapped[f"model.{k}"] for k, names in aliases.items() for a in names})
        with preserved(model):
            return torch.func.functional_call(wrapper, swapped, (one,), tie_weights=False).squeeze(0)

    return single


def _n(batch: Batch) -> int:
    return pytree.tree_leaves(batch)[0].shape[0]


def func_jacobian(fn: Callable[[Batch], Tensor], model: nn.Module, names: list[str], batch: Batch) -> Tensor:
    """Per-sample Jacobian ``(O, n, P)`` of ``fn`` w.r.t. the named parameters, by ``vmap(jacrev)``."""
    named = dict(model.named_parameters())
    params = {k: named[k].detach() for k in names}
    jac = torch.func.vmap(torch.func.jacrev(single_sample_fn(model, fn)), in_dims=(None, 0))(params, batch)
    n = _n(batch)
    return torch.cat([jac[k].reshape(n, jac[k].shape[1], -1) for k in names], dim=-1).transpose(0, 1).contiguous()


def loop_jacobian(fn: Callable[[Batch], Tensor], model: nn.Module, names: list[str], batch: Batch) -> Tensor:
    """Per-sample Jacobian ``(O, n, P)``: one forward per sample and one backward per output, w.r.t. the model's
    own parameter tensors (no ``vmap``, no ``functional_call``: every use autograd sees counts, including tensors
    derived from a parameter outside ``forward``). Selected parameters with ``requires_grad=False`` are switched on
    for the call and restored."""
    named = dict(model.named_parameters())
    params = [named[k] for k in names]
    frozen = [p for p in params if not p.requires_grad]
    for p in frozen:
        p.requires_grad_(True)
    try:
        rows = []
        for i in range(_n(batch)):
            with torch.enable_grad():
                out = fn(pytree.tree_map(lambda t: t[i:i + 1], batch)).reshape(-1)
                per_output = []
                for o in range(out.numel()):
                    grads = torch.autograd.grad(out[o], params, retain_graph=o + 1 < out.numel(), allow_unused=True) \
                        if out.requires_grad else [None] * len(params)
                    per_output.append(torch.cat([_dense(g, p).reshape(-1) for g, p in zip(grads, params)]))
            rows.append(torch.stack(per_output).detach())  # (O, P)
    finally:
        for p in frozen:
            p.requires_grad_(False)
    return torch.stack(rows, dim=1)  # (O, n, P)


def _dense(grad: Tensor | None, param: Tensor) -> Tensor:
    """A parameter's gradient as a dense tensor (zeros if unused; ``Embedding(sparse=True)`` gives sparse ones)."""
    if grad is None:
        return torch.zeros_like(param)
    return grad.to_dense() if grad.layout != torch.strided else grad


def failing_module(model: nn.Module, tb: TracebackType | None) -> str:
    """The name of the innermost module of ``model`` whose ``forward`` is on the traceback, or ``"the model"``."""
    names = {id(m): (k or type(m).__name__) for k, m in model.named_modules()}
    found = None
    while tb is not None:
        obj = tb.tb_frame.f_locals.get("self")
        if id(obj) in names and isinstance(obj, nn.Module):
            found = f"{names[id(obj)]} ({type(obj).__name__})"
        tb = tb.tb_next
    return found or "the model"


def describe_error(model: nn.Module) -> str:
    """``"<module>: <first line of the current exception>"`` inside an ``except`` block."""
    err = sys.exc_info()[1]
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    first = first if len(first) <= 160 else first[:160].rsplit(" ", 1)[0] + " ..."
    return f"{failing_module(model, sys.exc_info()[2])}: {type(err).__name__}: {first}"


def exact_path_check(fn: Callable[[Batch], Tensor], model: nn.Module, names: list[str], batch: Batch,
                     close: Callable[[Tensor, Tensor], bool]) -> str | None:
    """``None`` if ``vmap(jacrev)`` runs on ``batch`` (the dry-run samples) and agrees with the loop there, else why
    not (for the warning or error)."""
    try:
        jf = func_jacobian(fn, model, names, batch)
    except Exception:  # noqa: BLE001 - any failure inside vmap is a reason to take the loop
        return f"torch.func.vmap cannot run {describe_error(model)}"
    if not close(jf, loop_jacobian(fn, model, names, batch)):
        return ("torch.func (functional_call + vmap) gives other Jacobians than autograd on the dry-run samples (a"
                " parameter used through a tensor made outside forward, or a vmap batching bug)")
    return None
