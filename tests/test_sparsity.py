import json
from pathlib import Path

import pytest
import torch
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


def test_reference_copy_matches_paper_table():
    """The project's copy of the paper's numbers agrees with the mechanical transcription, when it is present."""
    shared = Path(__file__).resolve().parents[2] / "shared" / "reference" / "paper_tables.json"
    if not shared.exists():
        pytest.skip("shared/reference is not beside this checkout")
    rows = json.loads(shared.read_text())["tb:activation"][1:]
    frac = lambda s: eval(s, {})  # "1/2" -> 0.5
    assert {r[0]: (frac(r[1]), frac(r[2])) for r in rows} == TABLE


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
