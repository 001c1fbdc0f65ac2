import math

import pytest
import torch
from torch import nn

from interference import Elephant, count_parameters, match_width, mlp, spread_bias_


def test_spread_bias():
    b = spread_bias_(torch.empty(1001), 0.4)
    r = math.sqrt(3) * 0.4
    assert b[0].item() == pytest.approx(-r) and b[-1].item() == pytest.approx(r)
    assert torch.allclose(b.diff(), torch.full((1000,), 2 * r / 1000), atol=1e-6)
    assert b.std().item() == pytest.approx(0.4, rel=2e-3)


def test_mlp_conventions():
    net = mlp(2, [1000], 3, "elephant", {"d": 4, "a": 0.2})
    assert [type(m) for m in net] == [nn.Linear, nn.LayerNorm, Elephant, nn.Linear]
    r = math.sqrt(3) * 0.4
    assert net[0].bias.min().item() == pytest.approx(-r) and net[0].bias.max().item() == pytest.approx(r)
    assert net[2].num_units == 1000 and net[3].bias.abs().sum() == 0
    assert net[0].weight.abs().max() <= 1 / math.sqrt(2)  # PyTorch default U[-1/sqrt(fan_in), 1/sqrt(fan_in)]
    relu = mlp(2, [64, 64], 3, "relu", output_bias=False)
    assert [type(m) for m in relu] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]
    assert relu[0].bias.abs().sum() == 0 and relu[4].bias is None
    no_ln = mlp(1, [10], 1, "elephant", layer_norm=False, sigma_bias=1.28)
    assert not any(isinstance(m, nn.LayerNorm) for m in no_ln)
    assert no_ln[0].bias.max().item() == pytest.approx(math.sqrt(3) * 1.28)
    maxout = mlp(2, [30], 3, "maxout", {"k": 5})
    assert maxout[-1].in_features == 6
    fta = mlp(2, [10], 3, "fta", {"k": 20})
    assert fta[-1].in_features == 200


def test_match_width_reproduces_paper_mountaincar_widths():
    """The paper matches ReLU 1700 / FTA 170 / Maxout 3000 / LWTA 1700 to Elephant 1000 (rounded)."""
    target = count_parameters(mlp(2, [1000], 3, "elephant"))
    paper = {"relu": (1700, {}), "lwta": (1700, {"k": 5}), "fta": (170, {"k": 20}), "maxout": (3000, {"k": 5})}
    for act, (width, kwargs) in paper.items():
        w = match_width(act, 2, 3, act_kwargs=kwargs)
        assert abs(w - width) / width < 0.1, (act, w)
        assert abs(count_parameters(mlp(2, [w], 3, act, kwargs)) - target) / target < 0.01


def test_match_width_counts_layer_norm_of_the_matched_net():
    target = count_parameters(mlp(2, [1000], 3, "elephant"))
    w = match_width("relu", 2, 3, layer_norm=True)
    assert abs(count_parameters(mlp(2, [w], 3, "relu", layer_norm=True)) - target) <= 6  # one unit = 6 params
    assert w < match_width("relu", 2, 3)


def test_mlp_bad_input():
    with pytest.raises(ValueError, match="hidden width must be a positive int"):
        mlp(2, [0], 3)
    with pytest.raises(ValueError, match="unknown activation"):
        mlp(2, [8], 3, "swish")
    with pytest.raises(ValueError, match="not divisible by k"):
        mlp(2, [12], 3, "maxout", {"k": 5})
