"""Contraction of per-layer factors into kernels, in an output-major working layout of plain matrix products."""

from __future__ import annotations

import torch
from torch import Tensor

from .rules import Factor

__all__ = ["kernel"]


# Kernels accumulate in an output-major working layout that keeps every contraction a plain matrix product:
# full -> (O*n, O*m) with rows (o, n) and columns (q, m); diagonal -> (O, n, m); trace -> (n, m).
def _work_shape(n: int, m: int, o: int, output: str) -> tuple[int, ...]:
    return {"full": (o * n, o * m), "diagonal": (o, n, m), "trace": (n, m)}[output]


def _from_work(work: Tensor, n: int, m: int, o: int, output: str) -> Tensor:
    if output == "full":
        return work.view(o, n, o, m).permute(1, 3, 0, 2).contiguous()
    return work.permute(1, 2, 0).contiguous() if output == "diagonal" else work


def _dense(f: Factor) -> Tensor | None:
    """The per-sample Jacobian ``(O, n, P)`` of a dense factor; None for a 2-D Linear's factored form."""
    return f.g


def _outer(f1: Factor, f2: Factor) -> Tensor:
    """``A A'^T + 1`` (or its parts) of two 2-D Linear factors: ``(n, m)``."""
    n, m = f1.b.shape[1], f2.b.shape[1]
    outer = (f1.a @ f2.a.T) if f1.a is not None else None
    if f1.bias:
        outer = outer + 1.0 if outer is not None else f1.b.new_ones(n, m)
    return outer


def _full_outer(f1: Factor, f2: Factor) -> Tensor | None:
    """For 2-D Linear factors, ``A A'^T + 1`` repeated to the ``(O*n, O*m)`` working layout; else None."""
    if _dense(f1) is not None:
        return None
    o = f1.b.shape[0]
    return _outer(f1, f2).repeat(o, o)


def _accumulate_full(work: Tensor, f1: Factor, f2: Factor, rows: slice, cols: slice,
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


def _accumulate_reduced(work: Tensor, f1: Factor, f2: Factor, output: str) -> None:
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


def _samples(f: Factor, start: int, stop: int | None = None) -> Factor:
    """Samples ``start:stop`` of a factor."""
    if f.g is not None:
        return Factor(g=f.g[:, start:stop])
    return Factor(a=None if f.a is None else f.a[start:stop], bias=f.bias, b=f.b[:, start:stop])




def kernel(f1: list[Factor], f2: list[Factor] | None, n: int, m: int, o: int, output: str, dtype: torch.dtype,
           device: torch.device) -> Tensor:
    """The kernel between two blocks' factors (``f2=None``: the block with itself), in the output layout.

    With itself the kernel is symmetric: it is computed in row panels, panel ``i`` against the columns from
    panel ``i`` on (a little over half the work with 8 panels), and the rest is mirrored.
    """
    work = torch.zeros(_work_shape(n, m, o, output), dtype=dtype, device=device)
    full = output == "full"
    if f2 is not None:
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
