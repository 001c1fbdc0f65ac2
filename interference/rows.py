"""The layer-wise pass over a block of samples, and its check on every row of the block.

The pass runs the block once with forward hooks on the planned modules (:func:`capture`): each records its input and
adds a zero probe to its output, whose gradients (:func:`output_grads`, one batched backward with one cotangent per
model output) are the gradients at the module's output.

The proofs of :mod:`interference.plan` run on one or two samples; a model can still treat a larger batch otherwise
(a branch on a batch statistic, a sort that dispatches rows, a permutation only for three or more rows). So every
block is checked against the model on each of its samples alone (:func:`per_sample_run`: ``torch.func.vmap`` over
single samples, or, where ``vmap`` cannot run the model, one forward and one backward per sample), on every row:

* the model's outputs, and each planned module's input, equal those of the sample alone;
* the gradient of the weighted outputs ``sum_o w_o f_o`` at each module's output equals the sample alone's (no
  mixing after the module, no backward hook that is not linear);
* the gradient of ``sum_n sum_o w_o f_o(x_n)`` with respect to each planned parameter, through every use autograd
  sees, equals its gradient through the module's own call (no other use of the parameter on this batch).

The weights ``w`` are fixed and positive; a defect the check misses must cancel exactly in these weighted sums. The
cost is one vmapped forward and backward of the block plus one backward with one cotangent: about one training
step on the block. The result is one boolean on the device, read once per engine call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

__all__ = ["Record", "capture", "output_grads", "weights", "close_flag", "RowCheck"]

Batch = Any


@dataclass
class Record:
    """One call of a planned module in a pass: its input (detached), the probe added to its output and the input's
    version when the module ran."""

    inp: Tensor
    probe: Tensor
    version: int


@contextmanager
def capture(modules: list[nn.Module]) -> Iterator[dict[nn.Module, list[Record]]]:
    """Forward hooks that record each module's call and replace its output by ``output + probe``; the probe's
    gradient is the gradient at the module's output, even if later layers modify that output in place."""
    records: dict[nn.Module, list[Record]] = {m: [] for m in modules}

    def hook(mod: nn.Module, args: tuple, kwargs: dict, out: Tensor) -> Tensor:
        (inp,) = [t for t in (*args, *kwargs.values()) if isinstance(t, Tensor)]  # one tensor: proven by the plan
        probe = torch.zeros_like(out, requires_grad=True)
        records[mod].append(Record(inp.detach(), probe, inp._version))
        return out + probe

    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in modules]
    try:
        yield records
    finally:
        for h in handles:
            h.remove()


def output_grads(out: Tensor, probes: list[Tensor]) -> list[Tensor | None]:
    """Gradients ``(O, n, *shape)`` of each of the ``O`` outputs (summed over samples) at each probe."""
    n, o = out.shape
    if not out.requires_grad:
        return [None] * len(probes)
    cotangents = torch.eye(o, dtype=out.dtype, device=out.device).unsqueeze(1).expand(o, n, o)
    if o > 1:
        try:
            return list(torch.autograd.grad(out, probes, grad_outputs=cotangents, is_grads_batched=True,
                                            allow_unused=True, retain_graph=True))
        except RuntimeError:  # a backward formula vmap cannot batch (e.g. a recurrent layer): one pass per output
            pass
    per_output = [torch.autograd.grad(out, probes, grad_outputs=cotangents[i], allow_unused=True, retain_graph=True)
                  for i in range(o)]
    return [None if g[0] is None else torch.stack(g) for g in zip(*per_output)]


def weights(out: Tensor) -> Tensor:
    """The check's output weights ``w``: ``(O,)``, from 1 to 2."""
    return torch.linspace(1.0, 2.0, out.shape[1], dtype=out.dtype, device=out.device)


def close_flag(a: Tensor, b: Tensor, tol: float, scale: Tensor | None = None) -> Tensor:
    """A 0-d boolean tensor on the device: ``a`` and ``b`` have the same non-finite entries and the finite ones differ
    by at most ``tol`` times the largest magnitude (or ``scale``, if larger). No host synchronisation."""
    if a.shape != b.shape:
        return torch.zeros((), dtype=torch.bool, device=a.device)
    if not a.numel():
        return torch.ones((), dtype=torch.bool, device=a.device)
    b = b.to(a.dtype)
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    same = (fa == fb).all() & torch.eq(torch.where(fa, 0.0, a.nan_to_num()), torch.where(fb, 0.0, b.nan_to_num())).all()
    a0, b0 = torch.where(fa, a, 0.0), torch.where(fb, b, 0.0)
    own = torch.maximum(a0.abs().amax(), b0.abs().amax())
    if scale is not None:
        own = torch.maximum(own, scale.to(own.dtype))
    bound = tol * own.clamp_min(torch.finfo(a.dtype).tiny)
    return same & ((a0 - b0).abs().amax() <= bound)


def _per_sample_vmap(fn: Callable[[Batch], Tensor], batch: Batch, used: list[nn.Module], shapes: list[torch.Size],
                     dtypes: list[torch.dtype], w: Tensor) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    index = {m: i for i, m in enumerate(used)}

    def single(sample: Batch) -> tuple[Tensor, list[Tensor], tuple[Tensor, ...]]:
        one = pytree.tree_map(lambda t: t.unsqueeze(0), sample)

        def with_probes(*probes: Tensor) -> tuple[Tensor, list[Tensor]]:
            inputs: list[Tensor | None] = [None] * len(used)

            def hook(mod: nn.Module, args: tuple, kwargs: dict, out: Tensor) -> Tensor:
                i = index[mod]
                if inputs[i] is not None:
                    raise RuntimeError(f"{type(mod).__name__} ran twice for one sample")
                (inputs[i],) = [t for t in (*args, *kwargs.values()) if isinstance(t, Tensor)]
                return out + probes[i]

            handles = [m.register_forward_hook(hook, with_kwargs=True) for m in used]
            try:
                out = fn(one)
            finally:
                for h in handles:
                    h.remove()
            if any(t is None for t in inputs):
                raise RuntimeError("a planned module did not run for one sample")
            return out, inputs

        zeros = [torch.zeros(s, dtype=d, device=w.device) for s, d in zip(shapes, dtypes)]
        out, pullback, inputs = torch.func.vjp(with_probes, *zeros, has_aux=True)
        grads = pullback(w.to(out.dtype).expand_as(out))
        return out.squeeze(0), [t.squeeze(0) for t in inputs], grads

    with torch.no_grad():
        out, inputs, grads = torch.func.vmap(single)(batch)
    return out, inputs, [g.squeeze(1) for g in grads]


def _per_sample_loop(fn: Callable[[Batch], Tensor], batch: Batch, used: list[nn.Module], n: int,
                     w: Tensor) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    outs, inputs, grads = [], [[] for _ in used], [[] for _ in used]
    for i in range(n):
        with torch.enable_grad(), capture(used) as records:
            out = fn(pytree.tree_map(lambda t: t[i:i + 1], batch))
        if any(len(records[m]) != 1 for m in used):
            raise RuntimeError("a planned module ran another number of times for one sample")
        probes = [records[m][0].probe for m in used]
        got = torch.autograd.grad(out, probes, w.to(out.dtype).expand_as(out), allow_unused=True) \
            if out.requires_grad else [None] * len(used)
        outs.append(out.detach())
        for k, m in enumerate(used):
            inputs[k].append(records[m][0].inp)
            grads[k].append(torch.zeros_like(probes[k]) if got[k] is None else got[k])
    return torch.cat(outs), [torch.cat(t) for t in inputs], [torch.cat(g) for g in grads]


class RowCheck:
    """Accumulates the every-row checks of one engine call as device booleans; :meth:`passed` reads them once.

    ``mode`` is how the per-sample reference runs: ``"vmap"`` until ``vmap`` fails on the model, then ``"loop"``
    (kept in the plan, so a cached plan does not try ``vmap`` again)."""

    def __init__(self, tol: float, check_tol: float, mode: str = "vmap") -> None:
        self.tol, self.check_tol, self.mode = tol, check_tol, mode
        self.flags: list[Tensor] = []
        self.labels: list[str] = []

    def _add(self, flag: Tensor, label: str) -> None:
        self.flags.append(flag)
        self.labels.append(label)

    def block(self, fn: Callable[[Batch], Tensor], batch: Batch, out: Tensor, used: list[nn.Module],
              records: dict[nn.Module, list[Record]], grads: list[Tensor | None]) -> None:
        """Check a block's pass (``out`` (n, O), the modules' records and output gradients) on every row."""
        n = out.shape[0]
        w = weights(out)
        probes = [records[m][0].probe for m in used]
        shapes = [torch.Size((1, *p.shape[1:])) for p in probes]
        ref = None
        batch = pytree.tree_map(torch.clone, batch)  # a forward that writes its input in place must not touch the
        # tensors the pass's graph saved
        if self.mode == "vmap":
            try:
                ref = _per_sample_vmap(fn, batch, used, shapes, [p.dtype for p in probes], w)
            except Exception:  # noqa: BLE001 - vmap cannot run this model: one sample at a time
                self.mode = "loop"
        if ref is None:
            ref = _per_sample_loop(fn, batch, used, n, w)
        ref_out, ref_inputs, ref_grads = ref
        finite = out.detach().nan_to_num(0.0, 0.0, 0.0)
        scale = finite.abs().amax() if out.numel() else None
        self._add(close_flag(out.detach(), ref_out.reshape(out.shape) if ref_out.numel() == out.numel() else ref_out,
                             self.check_tol, scale), "the model's outputs")
        for m, g, ri, rg in zip(used, grads, ref_inputs, ref_grads):
            name = type(m).__name__
            self._add(close_flag(records[m][0].inp, ri, self.tol), f"the input of {name}")
            summed = torch.zeros_like(rg) if g is None else torch.tensordot(w.to(g.dtype), g, dims=1)
            self._add(close_flag(summed, rg, self.check_tol), f"the gradient at the output of {name}")

    def own_use(self, out: Tensor, used: list[nn.Module], records: dict[nn.Module, list[Record]],
                grads: list[Tensor | None], params: dict[nn.Module, list[Tensor]]) -> None:
        """Each planned parameter's gradient of the weighted outputs summed over the block, through every use,
        must equal its gradient through its module's call alone."""
        if not out.requires_grad:
            return
        w = weights(out)
        mods = [m for m, g in zip(used, grads) if g is not None and params.get(m)]
        flat = [p for m in mods for p in params[m]]
        if not flat:
            return
        total = torch.autograd.grad(out, flat, w.expand_as(out), allow_unused=True, retain_graph=True)
        k = 0
        for m, g in zip(used, grads):
            if m not in mods:
                continue
            mine = params[m]
            with torch.enable_grad():  # the module's own call, on its recorded input: the rule's view of it
                own = m(records[m][0].inp)
            via = torch.autograd.grad(own, mine, torch.tensordot(w.to(g.dtype), g, dims=1).to(own.dtype),
                                      allow_unused=True)
            for p, t, v in zip(mine, total[k:k + len(mine)], via):
                t = torch.zeros_like(p) if t is None else t
                v = torch.zeros_like(p) if v is None else v
                self._add(close_flag(t, v, self.check_tol), f"the uses of {type(m).__name__}'s parameters")
            k += len(mine)

    def failed(self) -> str | None:
        """``None`` if every check passed (one host synchronisation), else what failed first."""
        if not self.flags:
            return None
        if bool(torch.stack([f.to(self.flags[0].device) for f in self.flags]).all()):
            return None
        for flag, label in zip(self.flags, self.labels):
            if not bool(flag):
                return label
        return "a check"
