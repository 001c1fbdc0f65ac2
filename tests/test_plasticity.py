"""Plasticity and interference measures (issue 15) against values computed by hand on small cases."""

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
