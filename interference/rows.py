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
* each planned parameter is consumed in the block's autograd graph as often as in the plan's (a use that only some
  batches take, through Python control flow on the data, changes the graph; counted on the host, no device work).

Rows are compared by fixed positive weighted sums (:func:`rows_flag`), the gradients for fixed positive output
weights ``w``: a defect the check misses must be orthogonal to these weights. The cost is one vmapped forward and
backward of the block (about one training step on it) and a few matrix-vector products; the result is one boolean
on the device, read once per engine call. Where the model's structure proves the rows independent
(:mod:`interference.structure`) the check is skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils import _pytree as pytree

__all__ = ["Record", "NotPerSample", "capture", "output_grads", "weights", "rows_flag", "RowCheck"]

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


class NotPerSample(Exception):
    """A block disagrees with its samples alone: the model is not a per-sample function of its batch beyond what the
    dry runs saw (or a layer's input changed in place after the layer ran)."""


_PROJECTIONS: dict[tuple[int, torch.dtype, torch.device], Tensor] = {}


def _projection(size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A fixed vector of ``size`` weights in [0.5, 1.5] (one per dtype and device, made once)."""
    key = (size, dtype, device)
    if key not in _PROJECTIONS:
        g = torch.Generator().manual_seed(size)
        _PROJECTIONS[key] = (torch.rand(size, generator=g, dtype=torch.float64) + 0.5).to(dtype=dtype, device=device)
    return _PROJECTIONS[key]


def rows_flag(a: Tensor, b: Tensor, tol: float) -> Tensor:
    """A 0-d boolean tensor on the device: the rows of ``a`` and ``b`` ``(n, ...)`` agree, compared by one weighted
    sum per row (fixed positive weights ``r``): ``|r.(a_i - b_i)| <= tol max_j r.|a_j|``, non-finite sums equal.

    A row that differs escapes only if its difference is orthogonal to ``r``. No host synchronisation."""
    if a.shape != b.shape:
        return torch.zeros((), dtype=torch.bool, device=a.device)
    if not a.numel():
        return torch.ones((), dtype=torch.bool, device=a.device)
    if not a.is_floating_point():
        return torch.eq(a, b).all()
    a2, b2 = a.reshape(a.shape[0], -1), b.reshape(a.shape[0], -1).to(a.dtype)
    r = _projection(a2.shape[1], a.dtype, a.device)
    pa, pb = a2 @ r, b2 @ r
    bound = tol * (a2.abs() @ r).nan_to_num(0.0, 0.0, 0.0).amax().clamp_min(torch.finfo(a.dtype).tiny)
    return (((pa - pb).abs() <= bound) | (pa == pb) | (pa.isnan() & pb.isnan())).all()


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
            raise NotPerSample("a layer ran another number of times for one sample alone than in its block")
        probes = [records[m][0].probe for m in used]
        got = torch.autograd.grad(out, probes, w.to(out.dtype).expand_as(out), allow_unused=True) \
            if out.requires_grad else [None] * len(used)
        outs.append(out.detach())
        for k, m in enumerate(used):
            inputs[k].append(records[m][0].inp)
            grads[k].append(torch.zeros_like(probes[k]) if got[k] is None else got[k])
    return torch.cat(outs), [torch.cat(t) for t in inputs], [torch.cat(g) for g in grads]


class RowCheck:
    """Accumulates the every-row checks of one engine call as device booleans; :meth:`failed` reads them once.

    ``mode`` is how the per-sample reference runs: ``"vmap"`` until ``vmap`` fails on the model, then ``"loop"``
    (kept in the plan, so a cached plan does not try ``vmap`` again). ``proven``: the rows are independent by the
    model's structure (:mod:`interference.structure`), so :meth:`block` checks nothing."""

    def __init__(self, tol: float, check_tol: float, mode: str = "vmap", proven: bool = False) -> None:
        self.tol, self.check_tol, self.mode, self.proven = tol, check_tol, mode, proven
        self.flags: list[Tensor] = []
        self.labels: list[str] = []

    def _add(self, flag: Tensor, label: str) -> None:
        self.flags.append(flag)
        self.labels.append(label)

    def block(self, fn: Callable[[Batch], Tensor], batch: Batch, out: Tensor, used: list[nn.Module],
              records: dict[nn.Module, list[Record]], grads: list[Tensor | None]) -> None:
        """Check a block's pass (``out`` (n, O), the modules' records and output gradients) on every row."""
        if self.proven:
            return
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
            try:
                ref = _per_sample_loop(fn, batch, used, n, w)
            except NotPerSample:
                raise
            except Exception as err:  # noqa: BLE001 - a sample alone fails where the block ran: not per-sample
                raise NotPerSample(f"a sample alone fails where its block ran ({type(err).__name__}: {err})") from err
        ref_out, ref_inputs, ref_grads = ref
        self._add(rows_flag(out.detach(), ref_out.reshape(out.shape) if ref_out.numel() == out.numel() else ref_out,
                            self.check_tol), "the model's outputs")
        for m, g, ri, rg in zip(used, grads, ref_inputs, ref_grads):
            name = type(m).__name__
            self._add(rows_flag(records[m][0].inp, ri, self.tol), f"the input of {name}")
            summed = torch.zeros_like(rg) if g is None else torch.tensordot(w.to(g.dtype), g, dims=1)
            self._add(rows_flag(summed, rg, self.check_tol), f"the gradient at the output of {name}")

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
