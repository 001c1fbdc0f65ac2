import math

import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from torch.nn import functional as F

from interference import (
    dormant_units,
    function_sparsity,
    gradient_sparsity,
    representation_sparsity,
    saturated_units,
    sparsity_limit,
)
from interference.activations import elephant
from interference.demo import PAPER_SPARSITY
from interference.sparsity import derivative, sparse_measure
from reports import paper

# The paper's Table "function sparsity and gradient sparsity" (appendix, tb:activation).
TABLE = {"relu": (0.5, 0.5), "sigmoid": (0.5, 1.0), "tanh": (0.0, 1.0), "elu": (0.0, 0.5), "elephant": (1.0, 1.0)}
FUNCS = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "elu": F.elu,
         "elephant": lambda x: elephant(x, 1.0, 0.2, 4.0)}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_paper_sparsity_table(name):
    f, g = TABLE[name]
    assert sparsity_limit(FUNCS[name]).estimate == pytest.approx(f, abs=1e-3)
    assert sparsity_limit(FUNCS[name], gradient=True).estimate == pytest.approx(g, abs=1e-3)


def test_closed_forms_of_s_eps_c():
    # ReLU: |relu(x)| <= eps on [-C, eps]  ->  (C + eps) / 2C.
    assert function_sparsity(torch.relu, 0.1, 3.0) == pytest.approx(3.1 / 6.0, abs=1e-10)
    # Tanh: |tanh(x)| <= eps on |x| <= atanh(eps).
    eps, c = 0.3, 5.0
    assert function_sparsity(torch.tanh, eps, c) == pytest.approx(2 * torch.atanh(torch.tensor(eps)).item() / (2 * c))
    # Elephant(h=1): value <= eps for |x| >= a (1/eps - 1)^(1/d) (the paper's Lemma 2 bound is exact here).
    a, d = 0.2, 4.0
    r = a * (1 / eps - 1) ** (1 / d)
    assert function_sparsity(lambda x: elephant(x, 1.0, a, d), eps, c) == pytest.approx((c - r) / c, abs=1e-10)
    # Sigmoid': s(1-s) <= eps outside the two roots of s(1-s) = eps.
    s_hi = (1 + (1 - 4 * eps * 0.5) ** 0.5) / 2  # eps=0.15 -> roots of s^2 - s + eps
    eps2 = 0.15
    s_hi = (1 + (1 - 4 * eps2) ** 0.5) / 2
    x_hi = torch.logit(torch.tensor(s_hi, dtype=torch.float64)).item()
    assert gradient_sparsity(torch.sigmoid, eps2, c) == pytest.approx((c - x_hi) / c, abs=1e-10)


def test_sparsity_table_matches_the_projects_copy_of_the_paper():
    """TABLE above and the demo's table agree with the project's copy of the paper's tb:activation
    (reports.paper.ACTIVATION_SPARSITY)."""
    copy = {name: (float(f), float(g)) for name, (f, g) in paper.ACTIVATION_SPARSITY.items()}
    assert TABLE == copy
    assert PAPER_SPARSITY == copy


def test_representation_measures():
    h = torch.tensor([[0.0, 1.0, 0.0], [0.0, 2.0, 0.001]])
    assert representation_sparsity(h, eps=0.01) == pytest.approx(4 / 6)
    assert dormant_units(h, tau=0.0).tolist() == [True, False, False]
    assert dormant_units(h, tau=0.01).tolist() == [True, False, True]
    d = torch.tensor([[0.0, 0.5, 1e-9], [0.0, 0.0, 1e-9]])
    assert saturated_units(d, eps=1e-6).tolist() == [True, False, True]
    assert saturated_units(d, eps=1e-6, fraction=0.5).tolist() == [True, True, True]
    with pytest.raises(ValueError, match=r"\(N, units\)"):
        representation_sparsity(torch.zeros(3), eps=0.1)
    with pytest.raises(ValueError, match="eps must be > 0"):
        function_sparsity(torch.tanh, 0.0, 1.0)


def _elephant_grad_closed(eps, c, a=0.2, d=4.0):
    """S_eps,C of Elephant(h=1)': |f'| = (d/a) u^(d-1) / (1 + u^d)^2 (u = |x|/a) is <= eps outside its two roots."""
    g = lambda u: d / a * u ** (d - 1) / (1 + u ** d) ** 2 - eps
    peak = ((d - 1) / (d + 1)) ** (1 / d)
    u0, u1 = brentq(g, 0.0, peak, xtol=1e-15), brentq(g, peak, 1e9, xtol=1e-15, rtol=1e-15)
    return (a * u0 + c - a * u1) / c


# S_eps,C in closed form for the paper's activations (value, derivative): the whole sparsity_limit table must match
# to 1e-9, i.e. the adaptive refinement leaves these results as the fixed grid had them.
CLOSED = {
    "relu": (lambda e, c: (c + e) / (2 * c), lambda e, c: 0.5),
    "sigmoid": (lambda e, c: (c + math.log(e / (1 - e))) / (2 * c),
                lambda e, c: (c - math.log((1 + math.sqrt(1 - 4 * e)) / (1 - math.sqrt(1 - 4 * e)))) / c),
    "tanh": (lambda e, c: math.atanh(e) / c, lambda e, c: (c - math.acosh(e ** -0.5)) / c),
    "elu": (lambda e, c: (e - math.log1p(-e)) / (2 * c), lambda e, c: (c + math.log(e)) / (2 * c)),
    "elephant": (lambda e, c: (c - 0.2 * (1 / e - 1) ** 0.25) / c, _elephant_grad_closed),
}


@pytest.mark.parametrize("name", sorted(CLOSED))
@pytest.mark.parametrize("gradient", [False, True])
def test_sparsity_limit_tables_match_closed_forms(name, gradient):
    r = sparsity_limit(FUNCS[name], gradient=gradient)
    want = [[CLOSED[name][gradient](e, c) for c in r.c] for e in r.eps]
    assert np.asarray(r.values) == pytest.approx(np.asarray(want), abs=1e-9, rel=0)
    assert isinstance(r.estimate, float)


EPS = 0.1
ALPHA = math.asin(EPS)


def _sin_measure(t):
    """|{x in [0, t] : |sin x| <= EPS}| for t >= 0."""
    k, rest = divmod(t, math.pi)
    return k * 2 * ALPHA + min(rest, ALPHA) + max(0.0, rest - (math.pi - ALPHA))


OSCILLATING = {  # fn, exact S_eps,C (all three even or odd, so the measure on [-C, C] is twice that on [0, C])
    "sin": (torch.sin, lambda c: _sin_measure(c) / c),
    "cos": (torch.cos, lambda c: (_sin_measure(c + math.pi / 2) - _sin_measure(math.pi / 2)) / c),
    "sin(3x)": (lambda x: torch.sin(3 * x), lambda c: _sin_measure(3 * c) / (3 * c)),
}


@pytest.mark.parametrize("name, c", [("sin", 1e4), ("cos", 1e4), ("sin(3x)", 1e4), ("sin(3x)", 1e5),
                                     ("sin", 1e6), ("cos", 1e6)])
def test_oscillating_functions_at_large_c(name, c):
    """Far out a first cell holds many periods; no crossing may be skipped (the fixed grid gave 0.0028 for sin at
    C = 1e6). The documented error bound: 4 ulp(C) per crossing, over 2C."""
    fn, exact = OSCILLATING[name]
    got = function_sparsity(fn, EPS, c)
    crossings = 4 * 3 * c / math.pi  # at most (sin(3x) has the most)
    bound = crossings * max(1e-12, 4 * np.spacing(c)) / (2 * c) + 1e-13
    assert abs(got - exact(c)) <= bound
    assert got == pytest.approx(2 * ALPHA / math.pi, abs=2 * ALPHA / c)  # and S_eps,C is near its limit


def test_measure_edge_cases():
    c = 10.0
    assert function_sparsity(lambda x: torch.full_like(x, 5.0), EPS, c) == 0.0  # no crossing at all
    assert function_sparsity(lambda x: torch.full_like(x, EPS), EPS, c) == pytest.approx(1.0, abs=1e-12)  # |f| = eps
    assert function_sparsity(torch.sin, 1.0, 100.0) == pytest.approx(1.0, abs=1e-12)  # tangent at every peak
    assert function_sparsity(lambda x: (x > 0.3).double(), 0.5, c) == pytest.approx(10.3 / 20, abs=1e-12)  # jump
    assert function_sparsity(lambda x: torch.sqrt(x.abs()), EPS, c) == pytest.approx(1e-3, abs=1e-12)  # cusp
    assert sparse_measure(torch.relu, EPS, 0.5) == pytest.approx(0.6, abs=1e-12)  # c <= 1: one uniform piece
    for points in (3, 4, 10):
        assert function_sparsity(torch.relu, EPS, 3.0, points=points) == pytest.approx(3.1 / 6.0, abs=1e-10)
    second = derivative(derivative(torch.sin))  # derivatives nest: fn'' for the bound of gradient_sparsity
    x = torch.linspace(-3, 3, 7, dtype=torch.float64)
    assert torch.allclose(second(x), -torch.sin(x))


@pytest.mark.parametrize("call, error, match", [
    (lambda: function_sparsity(torch.tanh, 0.1, math.inf), ValueError, r"function_sparsity: c must be > 0 and finite"),
    (lambda: function_sparsity(torch.tanh, 0.1, math.nan), ValueError, r"c must be > 0 and finite, got nan"),
    (lambda: function_sparsity(torch.tanh, 0.1, -1.0), ValueError, r"c must be > 0"),
    (lambda: sparse_measure(torch.tanh, math.inf, 1.0), ValueError, r"sparse_measure: eps must be > 0 and finite"),
    (lambda: sparse_measure(torch.tanh, math.nan, 1.0), ValueError, r"eps must be > 0 and finite, got nan"),
    (lambda: sparse_measure(torch.tanh, -0.1, 1.0), ValueError, r"eps must be > 0"),
    (lambda: gradient_sparsity(torch.tanh, True, 1.0), TypeError, r"gradient_sparsity: eps must be a real number"),
    (lambda: gradient_sparsity(torch.tanh, 0.1, "10"), TypeError, r"c must be a real number"),
    (lambda: function_sparsity(torch.tanh, 0.1, 1.0, points=2), ValueError, r"points must be an int >= 3, got 2"),
    (lambda: function_sparsity(torch.tanh, 0.1, 1.0, points=True), TypeError, r"points must be an int >= 3"),
    (lambda: function_sparsity(torch.tanh, 0.1, 1.0, points=101.0), TypeError, r"points must be an int >= 3"),
    (lambda: function_sparsity(torch.tanh, 0.1, 1.0, xtol=0.0), ValueError, r"xtol must be > 0"),
    (lambda: function_sparsity("tanh", 0.1, 1.0), TypeError, r"fn must be an elementwise callable"),
    (lambda: function_sparsity(torch.log, 0.1, 10.0), ValueError,
     r"function_sparsity: fn must be finite on \[-C, C\], but fn\(-10.0\) = nan"),
    (lambda: sparsity_limit(torch.tanh, eps=(1e-2, math.nan)), ValueError, r"sparsity_limit: eps\[1\] must be > 0"),
    (lambda: sparsity_limit(torch.tanh, c=(1e2, math.inf)), ValueError, r"sparsity_limit: c\[1\] must be > 0"),
    (lambda: sparsity_limit(torch.tanh, c=(1e2, 0.0)), ValueError, r"c\[1\] must be > 0"),
    (lambda: sparsity_limit(torch.tanh, eps=()), ValueError, r"eps must be a non-empty sequence"),
    (lambda: sparsity_limit(torch.tanh, c=1e4), ValueError, r"c must be a non-empty sequence"),
    (lambda: sparsity_limit(torch.tanh, gradient="yes"), TypeError, r"gradient must be a bool"),
])
def test_bad_arguments_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("call, match", [
    (lambda h: representation_sparsity(h, eps=0.1), r"representation_sparsity: the batch is empty"),
    (lambda h: dormant_units(h, tau=0.1), r"dormant_units: the batch is empty"),
    (lambda h: saturated_units(h, eps=0.1), r"saturated_units: the batch is empty"),
])
def test_empty_batches_are_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.empty(0, 5))
    with pytest.raises(ValueError, match=match.split(":")[0] + ": there are no units"):
        call(torch.empty(4, 0))


def test_bad_thresholds_are_errors():
    h = torch.ones(3, 2)
    with pytest.raises(ValueError, match=r"representation_sparsity: eps must be >= 0 and finite, got -0.1"):
        representation_sparsity(h, eps=-0.1)
    with pytest.raises(ValueError, match=r"dormant_units: tau must be >= 0 and finite, got nan"):
        dormant_units(h, tau=math.nan)
    with pytest.raises(ValueError, match=r"dormant_units: tau must be >= 0 and finite, got inf"):
        dormant_units(h, tau=math.inf)
    with pytest.raises(ValueError, match=r"saturated_units: eps must be >= 0 and finite"):
        saturated_units(h, eps=math.nan)
    with pytest.raises(ValueError, match=r"saturated_units: fraction must be in \(0, 1\], got nan"):
        saturated_units(h, eps=0.1, fraction=math.nan)
    with pytest.raises(TypeError, match=r"representation_sparsity: eps must be a real number"):
        representation_sparsity(h, eps=None)
    assert representation_sparsity(h, eps=0) == 0.0  # eps = 0 counts exact zeros
