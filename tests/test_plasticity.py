"""Plasticity and interference measures against values computed by hand on small cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from interference import (condition_number, dormant_scores, dormant_units, effective_rank, feature_norm,
                          interference_mass, kernel_effective_rank, srank)
from probes import make_probe
from probes.probe import ProbeContext


def test_effective_rank_and_srank_of_a_rank_2_feature_matrix():
    # rows built from two orthonormal directions with singular values 3 and 1
    u = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    v = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    features = u @ torch.diag(torch.tensor([3.0, 1.0])) @ v  # (4, 3), rank 2
    p = np.array([0.75, 0.25])
    assert effective_rank(features) == pytest.approx(math.exp(-(p * np.log(p)).sum()))  # 1.7548
    assert srank(features, delta=0.1) == 2 and srank(features, delta=0.3) == 1
    assert effective_rank(torch.eye(5)) == pytest.approx(5.0) and effective_rank(torch.zeros(3, 2)) == 0.0
    with pytest.raises(ValueError, match="delta must be in"):
        srank(features, delta=1.0)


def test_redo_dormancy_of_a_layer_with_known_dormant_units():
    # per-unit mean |h| = 1, 1, 0.01, 0 -> layer mean 0.5025 -> scores 1.990, 1.990, 0.0199, 0
    h = torch.tensor([[1.0, -1.0, 0.02, 0.0], [-1.0, 1.0, 0.0, 0.0]])
    scores = dormant_scores(h)
    assert scores.tolist() == pytest.approx([1 / 0.5025, 1 / 0.5025, 0.01 / 0.5025, 0.0])
    assert dormant_units(h, tau=0.025).tolist() == [False, False, True, True]
    assert dormant_units(h, tau=0.0).tolist() == [False, False, False, True]  # dead: zero on every input
    assert dormant_units(torch.zeros(2, 3), tau=0.0).all()


def test_feature_norm_kernel_rank_and_condition_number():
    assert feature_norm(torch.tensor([[3.0, 4.0], [0.0, 1.0]])) == pytest.approx(3.0)  # (5 + 1) / 2
    k = torch.diag(torch.tensor([4.0, 1.0]))
    p = np.array([0.8, 0.2])
    assert kernel_effective_rank(k) == pytest.approx(math.exp(-(p * np.log(p)).sum()))
    assert condition_number(k) == pytest.approx(4.0)
    assert condition_number(torch.tensor([[1.0, 1.0], [1.0, 1.0]])) == pytest.approx(1 / (2 * 2.220446049250313e-16))
    assert condition_number(torch.zeros(2, 2)) == math.inf


def test_interference_mass_of_small_covariances():
    assert interference_mass(torch.tensor([[1.0, -0.5], [-0.5, 1.0]])) == (1.0, 0.0)
    c = torch.tensor([[1.0, 0.2, -0.6], [0.2, 1.0, 0.1], [-0.6, 0.1, 1.0]])  # |off| sum 1.8, negative 1.2
    negative, positive = interference_mass(c)
    assert negative == pytest.approx(2 / 3) and positive == pytest.approx(1 / 3)
    assert all(math.isnan(v) for v in interference_mass(torch.eye(3)))


class _Log:
    def __init__(self) -> None:
        self.records: list[tuple[str, int, dict]] = []

    def append(self, probe: str, step: int, **values) -> None:
        self.records.append((probe, step, values))


def test_the_plasticity_probe_measures_the_penultimate_features_and_stores_its_thresholds():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    with torch.no_grad():
        net[2].bias.fill_(-100.0)  # the second hidden layer is dead: every unit dormant, features all zero
    ctx = ProbeContext(step=10, model=net, inputs=torch.randn(16, 3))
    probe = make_probe("plasticity", every=10, delta=0.05, tau=0.1)
    fields = probe.fields(ctx)
    assert probe.settings()["layers"] == ["1", "3"] and probe.settings()["linear_layers"] == ["0", "2", "4"]
    assert probe.settings()["delta"] == 0.05 and probe.settings()["tau"] == 0.1
    log = _Log()
    assert probe.on_step(ctx, log)
    (_, step, values), = log.records
    assert step == 10 and set(values) == set(fields)
    assert values["effective_rank"] == 0.0 and values["srank"] == 0 and values["feature_norm"] == 0.0
    assert values["dormant"][1] == 1.0 and 0.0 <= values["dormant"][0] < 1.0
    assert values["weight_norm"] == pytest.approx([net[i].weight.norm().item() for i in (0, 2, 4)])
    assert np.isfinite(values["ntk_effective_rank"])


def _low_rank_kernel(n=12, r=4, seed=0):
    """``K = J J^T`` in float64 of a ``J (n, r)`` with singular values 10 .. 0.1: rank r, condition number 1e4."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.normal(size=(n, r)))
    v, _ = np.linalg.qr(rng.normal(size=(r, r)))
    j = u @ np.diag(np.geomspace(10.0, 0.1, r)) @ v.T
    return j, j @ j.T


def test_condition_number_on_the_nonzero_spectrum_matches_numpy_in_float64():
    from interference.plasticity import nonzero_condition_number, nonzero_spectrum, numerical_rank

    j, k = _low_rank_kernel()
    kernel = torch.tensor(k, dtype=torch.float64)
    # numpy's numerical rank (tolerance S.max() * N * eps) and the condition number of the non-zero spectrum
    e = np.linalg.eigvalsh(k)[::-1]
    kept = e[e > e[0] * len(k) * np.finfo(np.float64).eps]
    assert numerical_rank(kernel) == np.linalg.matrix_rank(k, hermitian=True) == len(kept) == 4
    assert nonzero_spectrum(kernel).numpy() == pytest.approx(kept, rel=1e-10)
    assert nonzero_condition_number(kernel) == pytest.approx(kept[0] / kept[-1], rel=1e-8)
    assert nonzero_condition_number(kernel) == pytest.approx(np.linalg.cond(j) ** 2, rel=1e-6)  # 1e4 by design
    # the floored condition number reads the round-off floor 1 / (N eps) of any singular kernel instead
    assert condition_number(kernel) == pytest.approx(1 / (12 * np.finfo(np.float64).eps), rel=1e-6)
    # a full-rank kernel: both are numpy's condition number
    full = k + np.eye(12)
    assert nonzero_condition_number(torch.tensor(full)) == pytest.approx(np.linalg.cond(full), rel=1e-8)
    assert condition_number(torch.tensor(full)) == pytest.approx(np.linalg.cond(full), rel=1e-8)


def test_the_tolerance_is_the_kernels_own_round_off():
    from interference.plasticity import nonzero_condition_number, numerical_rank

    _, k = _low_rank_kernel()
    k32 = torch.tensor(k, dtype=torch.float32)  # eigenvalues of float32 round-off (~1e-7 of the top) are not kept
    assert numerical_rank(k32) == np.linalg.matrix_rank(k32.numpy(), hermitian=True) == 4
    assert nonzero_condition_number(k32) == pytest.approx(1e4, rel=1e-2)
    assert numerical_rank(torch.tensor(k), rtol=1e-3) == 3  # eigenvalues 100, 4.6, 0.22 of 100 .. 0.01 above 0.1
    assert numerical_rank(torch.zeros(3, 3)) == 0 and math.isnan(nonzero_condition_number(torch.zeros(3, 3)))
    assert nonzero_condition_number(torch.ones(3, 3)) == 1.0  # rank 1
    with pytest.raises(ValueError, match="rtol must be"):
        numerical_rank(torch.eye(2), rtol=1.5)
    with pytest.raises(ValueError, match="square kernel"):
        numerical_rank(torch.ones(2, 3))


def test_the_plasticity_probe_logs_the_ntk_on_its_nonzero_spectrum_in_float64():
    from interference.ntk import ntk
    from probes import PROBES

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1)).double()  # 13 parameters, 16 inputs
    ctx = ProbeContext(step=1, model=net, inputs=torch.randn(16, 2, dtype=torch.float64))
    probe = make_probe("plasticity", every=1)
    fields = probe.fields(ctx)
    assert {"ntk_numerical_rank", "ntk_condition_nonzero"} <= set(fields) and "ntk_condition" not in fields
    log = _Log()
    probe.on_step(ctx, log)
    (_, _, values), = log.records
    k = ntk(net, ctx.inputs, output="trace").numpy()
    e = np.linalg.eigvalsh(k)[::-1]
    kept = e[e > e[0] * 16 * np.finfo(np.float64).eps]
    rank = np.linalg.matrix_rank(k, hermitian=True)
    assert values["ntk_numerical_rank"] == rank == len(kept) and rank <= 13  # singular: more inputs than parameters
    assert values["ntk_condition_nonzero"] == pytest.approx(np.log10(kept[0] / kept[-1]), rel=1e-5)
    assert values["ntk_condition_nonzero"] < 12  # not the float64 round-off floor log10(1 / (16 eps)) = 14.45
    schema = PROBES["plasticity"].schema
    assert "numerically non-zero spectrum" in schema.doc("ntk_condition_nonzero").meaning
    assert schema.doc("ntk_condition").units == "log10"  # older logs' field: still documented for reports
