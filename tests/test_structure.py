"""interference.structure: the structural proof that rows do not interact, against its slow twin (every registry
pattern it proves runs each sample alone to the same rows), and each thing that must stop the proof."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import interference
from interference import Elephant, mlp
from interference.structure import ROWWISE, rows_proven

import ntk_patterns as reg


def _cnn() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         mlp(4 * 4 * 4, [12], 10, "elephant", {"d": 4.0}, layer_norm=True, output_bias=False))


def _batch(shape: tuple[int, ...], n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, *shape), torch.randint(0, 10, (n,))


@pytest.mark.parametrize("name", sorted(reg.PATTERNS))
def test_every_pattern_it_proves_is_row_by_row(name: str) -> None:
    """Slow twin: a pattern the structure proves gives, on a batch of 7, each row that sample's own output."""
    p = reg.PATTERNS[name]
    model = reg.build_model(p)
    x = reg.make_inputs(p, 7, seed=1)
    if not rows_proven(model, x):
        return
    with torch.no_grad():
        whole = model(x)
        alone = torch.cat([model(x[i:i + 1]) for i in range(7)])
    torch.testing.assert_close(whole, alone, rtol=1e-10, atol=1e-12)


def test_proven_models_and_losses() -> None:
    x, y = _batch((1, 8, 8))
    assert rows_proven(_cnn(), (x, y), interference.cross_entropy)
    assert rows_proven(_cnn(), x)
    model = nn.Sequential(nn.Linear(3, 5), nn.LayerNorm(5), Elephant(num_units=5), nn.Dropout(0.5).eval(),
                          nn.Sequential(nn.Tanh(), nn.Linear(5, 2)), nn.LogSoftmax(dim=-1))
    assert rows_proven(model, torch.randn(4, 3))
    assert rows_proven(nn.Sequential(nn.Conv1d(2, 3, 3), nn.Flatten(-2, -1)), torch.randn(4, 2, 5))


class MyLinear(nn.Linear):
    pass


class Custom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x)


def _with_forward_hook() -> nn.Module:
    m = nn.Sequential(nn.Linear(3, 2))
    m[0].register_forward_hook(lambda mod, args, out: out - out.mean(0))
    return m


def _with_instance_forward() -> nn.Module:
    m = nn.Sequential(nn.Linear(3, 2))
    lin = m[0]
    m[0].forward = lambda x: nn.Linear.forward(lin, x - x.mean(0))
    return m


def _parametrized() -> nn.Module:
    m = nn.Sequential(nn.Linear(3, 2))
    torch.nn.utils.parametrizations.weight_norm(m[0])
    return m


NOT_PROVEN = {
    "a subclass": (lambda: nn.Sequential(MyLinear(3, 2)), (3,)),
    "a custom module": (Custom, (3,)),
    "a forward hook": (_with_forward_hook, (3,)),
    "a forward set on the instance": (_with_instance_forward, (3,)),
    "a parametrization": (_parametrized, (3,)),
    "BatchNorm": (lambda: nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2).eval()), (3,)),
    "Dropout in training": (lambda: nn.Sequential(nn.Linear(3, 2), nn.Dropout(0.5)), (3,)),
    "Flatten over the batch": (lambda: nn.Sequential(nn.Flatten(0), nn.Unflatten(0, (1, -1))), (3,)),
    "Softmax over the batch": (lambda: nn.Sequential(nn.Linear(3, 2), nn.Softmax(dim=0)), (3,)),
    "Softmax without a dim": (lambda: nn.Sequential(nn.Linear(3, 2), nn.Softmax()), (3,)),
    "a Conv2d taking the batch as channels": (lambda: nn.Sequential(nn.Conv2d(4, 2, 1), nn.Flatten()), (3, 3)),
    "a LayerNorm over the batch": (lambda: nn.Sequential(nn.Linear(3, 2), nn.LayerNorm((4, 2))), (3,)),
    "a 3-D output": (lambda: nn.Sequential(nn.Conv1d(1, 2, 1)), (1, 3)),
    "an Elephant with per-row parameters": (lambda: nn.Sequential(_elephant_2d()), (3,)),
}


def _elephant_2d() -> Elephant:
    e = Elephant()
    e.log_h = nn.Parameter(torch.zeros(4, 3))
    return e


@pytest.mark.parametrize("case", sorted(NOT_PROVEN))
def test_what_stops_the_proof(case: str) -> None:
    build, shape = NOT_PROVEN[case]
    assert not rows_proven(build(), torch.randn(4, *shape))


def test_losses_batches_hooks_and_modes_stop_the_proof() -> None:
    model = _cnn()
    x, y = _batch((1, 8, 8))
    assert not rows_proven(model, (x, y), lambda m, b: interference.cross_entropy(m, b))  # an unknown loss
    assert not rows_proven(model, (x, y.float()), interference.cross_entropy)
    assert not rows_proven(model, (x, y[:3]), interference.cross_entropy)
    assert not rows_proven(model, [x, y], interference.cross_entropy)
    assert not rows_proven(model, x[0])  # one unbatched image
    assert not rows_proven(model, {"x": x})
    handle = nn.modules.module.register_module_forward_hook(lambda mod, args, out: out)
    try:
        assert not rows_proven(model, x)
    finally:
        handle.remove()
    with TorchFunctionMode():
        assert not rows_proven(model, x)
    with TorchDispatchMode():
        assert not rows_proven(model, x)
    assert rows_proven(model, x)


def test_every_rowwise_layer_has_a_rule() -> None:
    assert all(callable(rule) for rule in ROWWISE.values())
    assert nn.BatchNorm1d not in ROWWISE and nn.Module not in ROWWISE


def test_ntk_and_gradient_covariance_skip_the_check_only_where_proven(row_checks: list[int]) -> None:
    """With the proof, ntk and gradient_covariance run no every-row check and still equal per-sample autograd."""
    torch.manual_seed(5)
    model = _cnn().double()
    x, y = torch.randn(6, 1, 8, 8, dtype=torch.float64), torch.randint(0, 10, (6,))
    names = [k for k, _ in model.named_parameters()]
    k = interference.ntk(model, x, implementation="layerwise")
    torch.testing.assert_close(k, reg.reference_ntk(model, x, None, names, "full"))
    c = interference.gradient_covariance(model, interference.cross_entropy, (x, y), normalize=False,
                                         implementation="layerwise")
    g = reg.reference_loss_grads(model, interference.cross_entropy, (x, y), names)
    torch.testing.assert_close(c, g @ g.T)
    assert row_checks == []
    interference.gradient_covariance(model, lambda m, b: interference.cross_entropy(m, b), (x, y),
                                     implementation="layerwise")
    assert row_checks == [6]
