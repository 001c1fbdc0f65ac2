"""How the measure of ``{x in [-C, C] : |sigma(x)| <= eps}`` is found (the engine of
:func:`interference.sparsity.sparse_measure`).

``[-C, C]`` is cut into cells: ``(points - 1) // 2`` uniform ones on [-1, 1] and as many geometric ones on each
of [1, C] and [-C, -1] (far out a cell is ``~C/720`` wide at ``C = 1e6``). A cell ``[a, b]`` is sampled at its
ends and at ``m = a + 0.382 (b - a)`` (the golden section: three evenly spaced samples are blind to a period that
divides their spacing, which is how the old grid skipped most sign changes of ``sin`` at large ``C``), for
``sigma`` and ``sigma'`` (autograd, :func:`derivative`; ``sigma''`` when ``sigma`` is itself a derivative). With
``g = |sigma| - eps`` (``g <= 0``: inside the set) the cell's local bound on ``|sigma'|`` is

    ``L = 2 max(|sigma'(a)|, |sigma'(m)|, |sigma'(b)|, |sigma(b) - sigma(a)| / (b - a))``

(a safety factor of 2 on the largest slope seen), and the cell is settled by the first of these tests that holds,
else split into ``[a, m]`` and ``[m, b]`` (each cut into 4 equal parts when at most 64 cells are split: there the
cost is per call, not per point) and sampled again, all cells of a refinement level at once, as arrays:

1. *no crossing*: ``g`` has one sign at ``a``, ``m`` and ``b``; ``|g(a)| + |g(m)| > L (m - a)`` and
   ``|g(m)| + |g(b)| > L (b - m)`` (``>=`` where ``g <= 0``), so that with ``|g'| <= |sigma'| <= L`` neither part
   can cross ``g = 0``; and
   ``|sigma'(m)| <= 2 max(|sigma'(a)|, |sigma'(b)|, |sigma(b) - sigma(a)| / (b - a))`` (a midpoint slope above the
   end-point estimate means the samples do not resolve ``sigma'``: split). The cell is all inside or all outside.
2. *monotone*: the five slopes ``sigma'(a)``, ``sigma'(m)``, ``sigma'(b)`` and the secants over ``[a, m]`` and
   ``[m, b]`` are non-zero with one sign and within a factor 4 of each other, and each secant lies between the
   slopes at the ends of its part (to ``1e-6`` of the largest, plus rounding), as it must when ``sigma'`` is
   monotone there. ``sigma`` is then monotone on the cell: ``{|sigma| <= eps}`` meets it in the interval between
   the crossings of ``sigma = -eps`` and ``sigma = +eps`` (at most one each, in the part where the sign changes).
3. *small*: ``b - a <= h_min = xtol * max(1, C)``; a part ``[a, m]`` or ``[m, b]`` where ``g`` changes sign is
   taken to hold one crossing.

All crossings are then located at once by a vectorised ITP root finder (secant steps, superlinear, never more than
one step slower than bisection) to within ``tol(x) = max(xtol, 4 ulp(x))``.

When the bound is true: ``L >= |sigma'|`` on the cell whenever ``|sigma'|`` on each part stays below twice the
larger slope sampled at that part's ends, in particular whenever ``sigma'`` is monotone on each part (``sigma``
convex or concave there: the largest ``|sigma'|`` is then at a sample and the factor 2 is spare); test 2 is exact
whenever ``sigma'`` is monotone on each part. For smooth ``sigma`` both hold once cells are short next to the
distance over which ``sigma'`` changes by its own size, which the refinement reaches (it splits cells whose
samples disagree). They fail only for a feature that leaves no trace at three samples: a spike narrower than a
cell between samples whose slopes and secants are all small (test 1), or a dip of ``sigma'`` through zero
between samples whose five slopes agree within a factor 4 (test 2). ``sigma`` is taken to be continuous: a jump
is seen where it changes the side of ``g`` between samples (the derivative of ReLU at 0, then refined down to
``h_min``) or shows in the secant, not otherwise. ``sigma`` must be finite on ``[-C, C]`` (a clear error
otherwise); a slope autograd cannot give (``nan``, ``inf``) only keeps its cells from being settled by tests 1
and 2, and more than 2^24 unsettled cells in a level is an error rather than a hang.

Error that remains when the bound is true: at most ``tol(x)`` per crossing, and at most ``b - a <= h_min`` per
cell settled by test 3 (its parts could hide an even number of further crossings), so ``S_eps,C`` is within
``(n_crossings * tol + n_small * h_min) / 2C``. For ``sin`` with ``eps = 0.1`` at ``C = 1e6``: 1.27e6 crossings
within ``4 ulp(1e6) = 4.7e-10`` each and no small cells, ``|error| <= 3e-10`` (the old fixed grid, which took
each grid interval to hold at most one crossing, got 0.0028 instead of 0.0638).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["derivative", "measures", "ScalarFn"]

ScalarFn = Callable[[Tensor], Tensor]

_SAFETY = 2.0  # factor on the largest sampled |sigma'| in the local bound L
_SPREAD = 4.0  # the monotone test wants its five slopes within this factor of each other
_SLOPE_RTOL = 1e-6  # relative slack of the monotone test's secant check
_ULP = float(np.finfo(np.float64).eps)
_GOLDEN = (3.0 - math.sqrt(5.0)) / 2.0  # 0.382: where a cell is sampled inside, and split
_FEW, _FAN = 64, 4  # up to _FEW cells to split are each cut into 2 * _FAN parts at once
_MAX_CELLS = 1 << 24  # more cells than this in one refinement level is an error (about 1.3 GB of samples)


def derivative(fn: ScalarFn) -> ScalarFn:
    """Elementwise derivative of an elementwise function, by autograd (exact, not finite differences).

    On an input that requires grad the result is itself differentiable, so ``derivative(derivative(fn))`` is
    ``fn''``; on any other input it is a plain tensor.
    """

    def d(x: Tensor) -> Tensor:
        nested = x.requires_grad
        with torch.enable_grad():
            xg = x if nested else x.detach().requires_grad_(True)
            y = fn(xg)
            if not y.requires_grad:  # fn does not depend on x (a constant)
                return torch.zeros_like(x)
            (g,) = torch.autograd.grad(y.sum(), xg, create_graph=nested, allow_unused=True)
        return torch.zeros_like(x) if g is None else g

    return d


def _values(fn: ScalarFn, x: np.ndarray) -> np.ndarray:
    """``fn(x)`` in float64, as a new array shaped like ``x``."""
    with torch.no_grad():
        y = fn(torch.from_numpy(x)).detach().to(torch.float64).numpy()
    return y if y.flags.writeable and not np.shares_memory(y, x) else y.copy()


def _values_and_slopes(fn: ScalarFn, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``fn(x)`` and ``fn'(x)`` in float64 from one autograd pass (``fn'`` is 0 where ``fn`` ignores ``x``, and
    ``inf`` where autograd gives no finite number, so that no test can settle a cell on it)."""
    t = torch.from_numpy(x).requires_grad_(True)
    with torch.enable_grad():
        y = fn(t)
        dy = torch.autograd.grad(y.sum(), t, allow_unused=True)[0] if y.requires_grad else None
    slope = np.zeros_like(x) if dy is None else dy.to(torch.float64).numpy()
    return y.detach().to(torch.float64).numpy(), np.nan_to_num(slope, nan=np.inf, posinf=np.inf, neginf=-np.inf)


def _pieces(c: float, points: int) -> list[np.ndarray]:
    """Cell ends of the pieces of [-c, c]: uniform on [-1, 1] (where activations bend) and geometric on [-c, -1] and
    [1, c], ``(points - 1) // 2`` cells each (their inner samples make ``points`` nodes per piece)."""
    n = max((points - 1) // 2, 1)
    if c <= 1.0:
        return [np.linspace(-c, c, n + 1)]
    outer = np.geomspace(1.0, c, n + 1)
    return [-outer[::-1], np.linspace(-1.0, 1.0, n + 1), outer]


_CELL_FIELDS = ("a", "m", "b", "sa", "sm", "sb", "da", "dm", "db", "k")


@dataclass
class _Cells:
    """Cells ``[a, b]`` with inner point ``m`` (:func:`_inner`), ``sigma`` (``s*``) and ``sigma'`` (``d*``) at
    ``a, m, b``; ``k`` indexes the ``eps`` a cell is examined for (-1 in the first cells, shared by all)."""

    a: np.ndarray
    m: np.ndarray
    b: np.ndarray
    sa: np.ndarray
    sm: np.ndarray
    sb: np.ndarray
    da: np.ndarray
    dm: np.ndarray
    db: np.ndarray
    k: np.ndarray

    def take(self, which: np.ndarray) -> _Cells:
        """The cells at indices ``which`` (or where the mask ``which`` holds)."""
        idx = np.flatnonzero(which) if which.dtype == bool else which  # one pass over a mask, not one per field
        return _Cells(*(getattr(self, f)[idx] for f in _CELL_FIELDS))

    @staticmethod
    def join(parts: list[_Cells]) -> _Cells:
        return _Cells(*(np.concatenate([getattr(p, f) for p in parts]) for f in _CELL_FIELDS))


def _inner(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The inner sample of cells ``[a, b]``: the golden section, not the midpoint. Evenly spaced samples are blind
    to a period that divides their spacing; the golden ratio is the number worst approximated by fractions, so no
    period makes both parts of a cell (nearly) whole multiples of it."""
    return a + _GOLDEN * (b - a)


def _first_cells(fn: ScalarFn, x: np.ndarray) -> _Cells:
    """The cells between consecutive ``x``, sampled by one autograd pass over their ends and inner points."""
    m = _inner(x[:-1], x[1:])
    s, d = _values_and_slopes(fn, np.concatenate([x, m]))
    n = len(x)
    return _Cells(x[:-1], m, x[1:], s[: n - 1], s[n:], s[1:n], d[: n - 1], d[n:], d[1:n], np.full(n - 1, -1))


def _split(fn: ScalarFn, cells: _Cells) -> _Cells:
    """The parts of every cell: ``[a, m]`` and ``[m, b]``, each cut further into ``_FAN`` equal parts when there are
    at most ``_FEW`` cells (there the cost is per call, not per point); new ends and inner points are sampled."""
    j = _FAN if cells.a.size <= _FEW else 1
    fractions = np.arange(1, j) / j
    wl, wr = cells.m - cells.a, cells.b - cells.m
    fresh = [cells.a + wl * f for f in fractions] + [cells.m + wr * f for f in fractions]
    x = [cells.a, *fresh[: j - 1], cells.m, *fresh[j - 1:], cells.b]  # the 2j + 1 ends of each cell's parts
    a, b = np.concatenate(x[:-1]), np.concatenate(x[1:])
    m = _inner(a, b)
    s, d = _values_and_slopes(fn, np.concatenate([*fresh, m]))
    size = cells.a.size
    n = size * 2 * (j - 1)
    s_new, d_new = ([v[i:i + size] for i in range(0, n, size)] for v in (s, d))
    sx = [cells.sa, *s_new[: j - 1], cells.sm, *s_new[j - 1:], cells.sb]
    dx = [cells.da, *d_new[: j - 1], cells.dm, *d_new[j - 1:], cells.db]
    cat = np.concatenate
    return _Cells(a, m, b, cat(sx[:-1]), s[n:], cat(sx[1:]), cat(dx[:-1]), d[n:], cat(dx[1:]), np.tile(cells.k, 2 * j))


def _between(v: np.ndarray, p: np.ndarray, q: np.ndarray, slack: np.ndarray) -> np.ndarray:
    return (v >= np.minimum(p, q) - slack) & (v <= np.maximum(p, q) + slack)


@dataclass
class _Tests:
    """Test 1 of the module docstring short of ``eps``, per cell: all inside iff ``inner <= 2 eps``, all outside iff
    ``outer > 2 eps`` (``|g(a)| + |g(m)| >= L wl`` reads ``|sigma(a)| + |sigma(m)| + L wl <= 2 eps`` inside, and
    ``|g(a)| + |g(m)| > L wl`` reads ``|sigma(a)| + |sigma(m)| - L wl > 2 eps`` outside; the samples' own sides
    enter as ``2 |sigma| <= 2 eps`` or ``> 2 eps``)."""

    inner: np.ndarray
    outer: np.ndarray
    width: np.ndarray

    @staticmethod
    def of(c: _Cells) -> _Tests:
        abs_a, abs_m, abs_b = np.abs(c.sa), np.abs(c.sm), np.abs(c.sb)
        wl, wr = c.m - c.a, c.b - c.m
        width = wl + wr
        slope_m = np.abs(c.dm)
        bound = np.subtract(c.sb, c.sa)  # the end-point estimate: largest of |sigma'(a)|, |sigma'(b)|, |secant|
        np.abs(bound, out=bound)
        np.divide(bound, width, out=bound)
        np.maximum(bound, np.abs(c.da), out=bound)
        np.maximum(bound, np.abs(c.db), out=bound)
        unresolved = slope_m > _SAFETY * bound  # the midpoint slope exceeds it: split
        np.maximum(bound, slope_m, out=bound)
        bound *= _SAFETY  # L
        np.multiply(wl, bound, out=wl)
        np.multiply(wr, bound, out=wr)
        left, right = abs_a + abs_m, abs_m + abs_b
        inner = np.maximum(left + wl, right + wr)
        outer = np.minimum(np.subtract(left, wl, out=left), np.subtract(right, wr, out=right))
        extreme = np.maximum(abs_a, abs_m, out=slope_m)
        np.maximum(extreme, abs_b, out=extreme)
        np.maximum(inner, np.multiply(extreme, 2.0, out=extreme), out=inner)
        extreme = np.minimum(abs_a, abs_m, out=abs_a)
        np.minimum(extreme, abs_b, out=extreme)
        np.minimum(outer, np.multiply(extreme, 2.0, out=extreme), out=outer)
        inner[unresolved] = np.inf
        outer[unresolved] = -np.inf
        return _Tests(inner, outer, width)

    def settled(self, eps: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Masks (inside, settled): all inside, and all inside or all outside, by test 1."""
        inside = self.inner <= 2.0 * eps  # touching g = 0 from inside stays inside
        return inside, inside | (self.outer > 2.0 * eps)


def _monotone(c: _Cells) -> np.ndarray:
    """Test 2 of the module docstring (it does not depend on ``eps``), per cell."""
    wl, wr = c.m - c.a, c.b - c.m
    sec_l, sec_r = (c.sm - c.sa) / wl, (c.sb - c.sm) / wr
    slopes = np.stack([c.da, c.dm, c.db, sec_l, sec_r])
    size = np.abs(slopes)
    largest = size.max(axis=0)
    rounding = 8.0 * _ULP * (np.abs(c.sa) + np.abs(c.sm) + np.abs(c.sb)
                             + largest * np.maximum(np.abs(c.a), np.abs(c.b)))
    return ((np.abs(np.sign(slopes).sum(axis=0)) == 5) & (_SPREAD * size.min(axis=0) >= largest)
            & _between(sec_l, c.da, c.dm, _SLOPE_RTOL * largest + rounding / wl)
            & _between(sec_r, c.dm, c.db, _SLOPE_RTOL * largest + rounding / wr))


_BRACKET_FIELDS = ("l", "r", "fl", "fr", "q", "t", "k", "weight", "anchor")


@dataclass
class _Brackets:
    """Intervals ``[l, r]`` with ``f(l) <= 0 < f(r)`` (``fl``, ``fr``) for ``f = q sigma - t`` or ``q |sigma| - t``;
    the crossing ``x`` adds ``weight (x - anchor)`` to the measure for ``eps[k]``."""

    l: np.ndarray
    r: np.ndarray
    fl: np.ndarray
    fr: np.ndarray
    q: np.ndarray
    t: np.ndarray
    k: np.ndarray
    weight: np.ndarray
    anchor: np.ndarray

    @staticmethod
    def join(parts: list[_Brackets]) -> _Brackets:
        return _Brackets(*(np.concatenate([getattr(b, f) for b in parts]) for f in _BRACKET_FIELDS))


def _settle_monotone(c: _Cells, eps: np.ndarray, totals: np.ndarray) -> _Brackets:
    """Test 2's cells: with ``u = sign(sigma') sigma`` increasing, ``{|sigma| <= eps} = {u <= eps}`` minus
    ``{u < -eps}``, ``{u <= t} = [a, x_t]``, and ``u < -eps`` reads ``u <= t`` for ``t`` the float below ``-eps``.
    Adds the ``x_t - a`` known without root finding to ``totals`` and returns brackets of the others."""
    sgn = np.sign(c.dm)
    ua, um, ub = sgn * c.sa, sgn * c.sm, sgn * c.sb
    e = eps[c.k]
    parts = []
    for t, weight in ((e, 1.0), (np.nextafter(-e, -np.inf), -1.0)):
        whole = ub <= t  # x_t = b
        totals += weight * np.bincount(c.k[whole], weights=(c.b - c.a)[whole], minlength=len(totals))
        i = np.flatnonzero((ua <= t) & ~whole)
        left = um[i] > t[i]  # the crossing is in [a, m]
        parts.append(_Brackets(
            l=np.where(left, c.a[i], c.m[i]), r=np.where(left, c.m[i], c.b[i]),
            fl=np.where(left, ua[i], um[i]) - t[i], fr=np.where(left, um[i], ub[i]) - t[i], q=sgn[i], t=t[i],
            k=c.k[i], weight=np.full(i.size, weight), anchor=c.a[i]))
    return _Brackets.join(parts)


def _settle_small(c: _Cells, eps: np.ndarray, totals: np.ndarray) -> _Brackets:
    """Test 3's cells: each part ``[a, m]``, ``[m, b]`` is inside, outside, or holds one crossing (a bracket of
    ``f = |sigma| - eps`` if its low end is inside, else of ``(the float above eps) - |sigma|``)."""
    e = eps[c.k]
    parts = []
    for lo, hi, s_lo, s_hi in ((c.a, c.m, c.sa, c.sm), (c.m, c.b, c.sm, c.sb)):
        in_lo, in_hi = np.abs(s_lo) <= e, np.abs(s_hi) <= e
        both = in_lo & in_hi
        totals += np.bincount(c.k[both], weights=(hi - lo)[both], minlength=len(totals))
        i = np.flatnonzero(in_lo != in_hi)
        q = np.where(in_lo[i], 1.0, -1.0)  # inside from lo: x - lo; inside up to hi: hi - x
        t = np.where(in_lo[i], e[i], -np.nextafter(e[i], np.inf))
        parts.append(_Brackets(l=lo[i], r=hi[i], fl=q * np.abs(s_lo[i]) - t, fr=q * np.abs(s_hi[i]) - t, q=q, t=t,
                               k=c.k[i], weight=q, anchor=np.where(in_lo[i], lo[i], hi[i])))
    return _Brackets.join(parts)


def _itp(fn: ScalarFn, br: _Brackets, xtol: float, absolute: bool) -> np.ndarray:
    """A point within ``tol = max(xtol, 4 ulp)`` of where each bracket's ``f`` changes sign, all brackets at once
    (``f = q |sigma| - t`` if ``absolute`` else ``q sigma - t``).

    ITP (Oliveira & Takahashi 2021; kappa1 = 0.02 / initial width, kappa2 = 2, n0 = 1, and a step of at least tol
    as in Brent's method): a secant step, nudged towards the midpoint and projected into the bisection minmax
    ball, so superlinear on smooth functions and never more than one step slower than bisection.
    """
    out = 0.5 * (br.l + br.r)
    tol = np.maximum(xtol, 4.0 * np.spacing(np.maximum(np.abs(br.l), np.abs(br.r))))
    idx = np.flatnonzero(br.r - br.l > 2.0 * tol)
    l, r, fl, fr, q, t, tol = (v[idx] for v in (br.l, br.r, br.fl, br.fr, br.q, br.t, tol))
    w = r - l
    k1 = 0.02 / w
    steps = np.ceil(np.log2(w / (2.0 * tol))) + 1.0  # n_max
    reach = tol * np.exp2(steps)  # tol 2^n_max
    j = 0
    while idx.size:  # in place where it can be: these arrays hold one entry per crossing
        half_w = 0.5 * w
        x = l + half_w  # the midpoint, for now
        diff = np.subtract(fr, fl)
        np.divide(w, diff, out=diff)
        diff *= fl
        diff += half_w  # midpoint - secant (regula falsi) point
        towards = np.sign(diff)
        shift = np.abs(diff, out=diff)
        # truncate: move max(k1 w^2, tol) from the secant point towards the midpoint ...
        step = k1 * w
        step *= w
        np.maximum(step, tol, out=step)
        shift -= step
        np.maximum(shift, 0.0, out=shift)
        # ... and project: stay within reach 2^-j - w/2 of the midpoint
        np.multiply(reach, 0.5**j, out=step)
        step -= half_w
        np.minimum(shift, step, out=shift)
        shift *= towards
        x -= shift
        y = _values(fn, x)
        if absolute:
            np.abs(y, out=y)
        y *= q
        y -= t
        left = y <= 0
        np.copyto(l, x, where=left)
        np.copyto(fl, y, where=left)
        np.logical_not(left, out=left)
        np.copyto(r, x, where=left)
        np.copyto(fr, y, where=left)
        np.subtract(r, l, out=w)
        j += 1
        going = (w > 2.0 * tol) & (j <= steps + 1)  # at most n_max + 2 steps
        if not going.all():
            out[idx[~going]] = (l + 0.5 * w)[~going]
            idx, l, r, fl, fr, q, t, tol, w, k1, reach, steps = (
                v[going] for v in (idx, l, r, fl, fr, q, t, tol, w, k1, reach, steps))
    return out


def measures(func: str, fn: ScalarFn, eps: Sequence[float], c: float, points: int, xtol: float,
              shared: dict[tuple[float, float, int], tuple[_Cells, _Tests]] | None = None) -> list[float]:
    """``sparse_measure`` for several ``eps`` at one ``c``, every refinement level for all ``eps`` at once; the
    first cells of a piece already in ``shared`` are reused (and new ones put there). ``func`` names the caller in
    errors."""
    e = np.asarray(eps, dtype=np.float64)
    h_min = xtol * max(1.0, c)
    totals = np.zeros(len(e))
    shared = {} if shared is None else shared
    still = []
    for x in _pieces(c, points):
        key = (float(x[0]), float(x[-1]), x.size)
        if key not in shared:
            first = _first_cells(fn, x)
            _check_finite(func, first)
            shared[key] = first, _Tests.of(first)
        cells, tests = shared[key]
        inside, settled = tests.settled(e[:, None])  # (eps, cells): only the decisions depend on eps
        totals += (inside * tests.width).sum(axis=1)
        k, i = np.nonzero(~settled)
        part = cells.take(i)
        part.k = k
        still.append(part)
    cells = _Cells.join(still)
    monotone: list[_Brackets] = []
    small: list[_Brackets] = []
    while True:
        mono = _monotone(cells)
        tiny = ~mono & (cells.b - cells.a <= h_min)
        if mono.any():
            monotone.append(_settle_monotone(cells.take(mono), e, totals))
        if tiny.any():
            small.append(_settle_small(cells.take(tiny), e, totals))
        cells = cells.take(~(mono | tiny))
        if not cells.a.size:
            break
        if cells.a.size > _MAX_CELLS:
            raise ValueError(f"{func}: fn is too rough to resolve on [-C, C] ({cells.a.size} cells still unsettled "
                             "in one refinement level); does its derivative have a finite value everywhere?")
        cells = _split(fn, cells)
        _check_finite(func, cells)
        tests = _Tests.of(cells)
        inside, settled = tests.settled(e[cells.k])
        totals += np.bincount(cells.k[inside], weights=tests.width[inside], minlength=len(e))
        cells = cells.take(~settled)
    for brackets, absolute in ((monotone, False), (small, True)):
        if brackets:
            br = _Brackets.join(brackets)
            x = _itp(fn, br, xtol, absolute)
            totals += np.bincount(br.k, weights=br.weight * (x - br.anchor), minlength=len(e))
    return totals.tolist()


def _check_finite(func: str, cells: _Cells) -> None:
    """A clear error if ``sigma`` is not finite at some sample of ``cells``."""
    for x, v in ((cells.a, cells.sa), (cells.m, cells.sm), (cells.b, cells.sb)):
        bad = ~np.isfinite(v)
        if bad.any():
            i = np.flatnonzero(bad)[0]
            raise ValueError(f"{func}: fn must be finite on [-C, C], but fn({float(x[i])!r}) = {float(v[i])!r}")
