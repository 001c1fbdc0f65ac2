"""interference.squared_grad_sum against its slow twin: a float64 per-sample autograd loop, on a registry of models."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import interference
from interference import fisher, mlp

import reference_models


def _nll(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def reference(model: nn.Module, batch, loss_fn=_nll, power: int = 2) -> dict[str, torch.Tensor]:
    """sum_n (d loss_n / d theta)^power by one float64 backward per sample (power 1: the summed gradient)."""
    model = model.double()
    x, y = batch
    named = {k: p for k, p in model.named_parameters() if p.requires_grad}
    out = {k: torch.zeros_like(p) for k, p in named.items()}
    for i in range(len(y)):
        loss = loss_fn(model, (x[i:i + 1].double(), y[i:i + 1]))[0]
        for (k, p), g in zip(named.items(), torch.autograd.grad(loss, list(named.values()), allow_unused=True)):
            if g is not None:
                out[k] += g.pow(power)
    return out


class Tied(nn.Module):
    """The output layer reuses the input layer's weight: not a rule's case (the exact path)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(10, 10)
        self.act = nn.Tanh()

    def forward(self, x):
        return F.linear(self.act(self.inp(x)), self.inp.weight)


class Centered(nn.Module):
    """Subtracts the batch mean: samples interact, no layer-wise rule may claim the first layer."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(10, 16), nn.Linear(16, 10)

    def forward(self, x):
        h = self.a(x)
        return self.b(torch.relu(h - h.mean(0, keepdim=True)))


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         mlp(4 * 4 * 4, [12], 10, "elephant", {"d": 4.0}, layer_norm=True, sigma_bias=0.1,
                             output_bias=False))


MODELS = {
    "mlp-relu": (lambda: mlp(10, [32], 10, "relu", output_bias=False), (10,)),
    "emlp-layernorm": (lambda: mlp(10, [32], 10, "elephant", {"d": 4.0, "learnable": True}, layer_norm=True,
                                   sigma_bias=0.2, output_bias=False), (10,)),
    "cnn-elephant": (_cnn, (1, 8, 8)),
    "tied": (Tied, (10,)),
    "centered": (Centered, (10,)),
}


# _nll: every batch is checked row by row; interference.cross_entropy: the structure proves the Sequential ones
LOSSES = {"own loss": _nll, "interference.cross_entropy": interference.cross_entropy}


@pytest.mark.parametrize("loss", sorted(LOSSES))
@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("implementation", ["auto", "exact"])
def test_matches_per_sample_loop(name: str, implementation: str, loss: str) -> None:
    build, shape = MODELS[name]
    torch.manual_seed(0)
    model = build()
    batch = (torch.randn(9, *shape), torch.randint(0, 10, (9,)))
    got = interference.squared_grad_sum(model, LOSSES[loss], batch, implementation=implementation)
    moments = interference.grad_moments(model, LOSSES[loss], batch, implementation=implementation)
    losses = _nll(model, batch).detach()
    want, sums = reference(model, batch), reference(model, batch, power=1)  # (model in float64 from here)
    assert set(got) == set(want) == set(moments.squares) == set(moments.grad)
    for k in want:
        assert got[k].shape == want[k].shape == moments.grad[k].shape
        torch.testing.assert_close(got[k].double(), want[k], rtol=2e-4, atol=1e-9, msg=f"{name}: {k}")
        torch.testing.assert_close(moments.squares[k].double(), want[k], rtol=2e-4, atol=1e-9, msg=f"{name}: {k}")
        torch.testing.assert_close(moments.grad[k].double(), sums[k], rtol=2e-4, atol=2e-5,  # float32 sums
                                   msg=f"{name}: {k}")
    torch.testing.assert_close(moments.loss, losses)


def test_a_structure_it_proves_skips_the_every_row_check(row_checks: list[int]) -> None:
    """The every-row check runs for a loss the engine does not know, and not for interference.cross_entropy on a
    Sequential of ROWWISE layers; a Sequential with another module is still checked (and caught) with that loss."""
    torch.manual_seed(4)
    model = _cnn()
    batch = (torch.randn(9, 1, 8, 8), torch.randint(0, 10, (9,)))
    interference.grad_moments(model, _nll, batch)
    assert row_checks == [9]
    interference.grad_moments(model, interference.cross_entropy, batch)
    assert row_checks == [9]
    coupled = nn.Sequential(nn.Linear(10, 6), FlipFromFive(), nn.Tanh(), nn.Linear(6, 10))
    with pytest.warns(UserWarning, match="not a per-sample function"):
        interference.squared_grad_sum(coupled, interference.cross_entropy, (torch.randn(9, 10), batch[1]))
    assert row_checks == [9, 9]


class FlipFromFive(nn.Module):
    """Reverses the rows of a batch of five or more: unknown to the structural proof, so every row is checked."""

    def forward(self, x):
        return x.flip(0) if x.shape[0] >= 5 else x


def test_linear_layers_never_form_per_sample_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wide Linear layer's sums come from (b^2)^T (a^2): per_sample_grads is asked only for what no rule covers."""
    asked: list[str] = []
    real = fisher.per_sample_grads

    def spy(model, loss_fn, batch, *, params=None, **kw):
        asked.extend(params)
        return real(model, loss_fn, batch, params=params, **kw)

    monkeypatch.setattr(fisher, "per_sample_grads", spy)
    torch.manual_seed(1)
    model = mlp(20, [2000], 10, "relu", output_bias=False)
    batch = (torch.randn(64, 20), torch.randint(0, 10, (64,)))
    interference.squared_grad_sum(model, _nll, batch)
    assert asked == []
    torch.manual_seed(1)
    interference.squared_grad_sum(Tied(), _nll, (torch.randn(5, 10), torch.randint(0, 10, (5,))))
    assert asked == ["inp.weight"]  # tied: the exact path; its bias stays on the Linear rule


def test_params_and_bad_input() -> None:
    torch.manual_seed(2)
    model = mlp(10, [8], 10, "relu", output_bias=False)
    batch = (torch.randn(4, 10), torch.randint(0, 10, (4,)))
    only = interference.squared_grad_sum(model, _nll, batch, params=["0.weight"])
    assert list(only) == ["0.weight"]
    torch.testing.assert_close(only["0.weight"].double(), reference(model, batch)["0.weight"], rtol=2e-4, atol=1e-9)
    with pytest.raises(ValueError, match="implementation"):
        interference.squared_grad_sum(model, _nll, batch, implementation="fast")
    with pytest.raises(ValueError, match="one loss per sample"):
        interference.squared_grad_sum(model.float(), lambda m, b: _nll(m, b).mean(), batch)


class Scale(reference_models.Scale):
    """The reference ``Scale`` under its own type, for a rule (registered below) whose factor reverses the
    parameter's layout."""


def _reversed_rule(mod, inp, gout, use):
    return [interference.Factor.dense((gout * inp).flip(-1))]


def test_a_rule_with_the_wrong_layout_is_caught() -> None:
    """Gram matrices cannot see a permuted layout; squared_grad_sum checks sum_n w_n g_n against autograd and hands
    the parameter to the per-sample path."""
    interference.register_rule(Scale, _reversed_rule, params=("s",), replace=True)
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 5), Scale(5), nn.Tanh(), nn.Linear(5, 3, bias=False))
    batch = (torch.randn(7, 6), torch.randint(0, 3, (7,)))
    with pytest.warns(UserWarning, match="layout"):
        got = interference.squared_grad_sum(model, _nll, batch)
    want = reference(model, batch)
    for k in want:
        torch.testing.assert_close(got[k].double(), want[k], rtol=2e-4, atol=1e-9)
