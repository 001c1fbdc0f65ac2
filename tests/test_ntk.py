import math

import pytest
import torch
from torch import nn

import interference as itf
from interference import mlp, ntk, one_hidden_layer_ntk
from interference.activations import Elephant, elephant
from interference.sparsity import derivative
from reference_models import MODELS, brute_force_ntk, build, inputs


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs().max() / b.abs().max()).detach())


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("implementation", ["auto", "func"])
def test_ntk_matches_brute_force(name, implementation):
    model = build(name)
    x, xt = inputs(name, 5, seed=1), inputs(name, 3, seed=2)
    ref = brute_force_ntk(model, x, xt)
    got = ntk(model, x, xt, implementation=implementation)
    assert got.shape == ref.shape
    assert rel_err(got, ref) < 1e-6


@pytest.mark.parametrize("name", ["mlp-elephant-ln", "cnn", "multi-output", "shared-module"])
def test_outputs_blocks_and_symmetry(name):
    model = build(name)
    x = inputs(name, 7)
    full = ntk(model, x)
    assert rel_err(full, brute_force_ntk(model, x, x)) < 1e-6
    assert torch.allclose(full, full.permute(1, 0, 3, 2))
    diag = ntk(model, x, output="diagonal")
    assert torch.allclose(diag, full.diagonal(dim1=2, dim2=3), rtol=1e-10, atol=1e-12)
    trace = ntk(model, x, output="trace")
    assert torch.allclose(trace, full.diagonal(dim1=2, dim2=3).sum(-1), rtol=1e-10, atol=1e-12)
    blocked = ntk(model, x, inputs(name, 5, seed=3), chunk_size=2)
    assert rel_err(blocked, ntk(model, x, inputs(name, 5, seed=3))) < 1e-12
    assert rel_err(ntk(model, x, chunk_size=3), full) < 1e-12


def test_named_parameter_subset():
    model = build("mlp-elephant-ln")
    x = inputs("mlp-elephant-ln", 4)
    names = ["0.weight", "2.log_a", "6.weight"]
    assert rel_err(ntk(model, x, params=names), brute_force_ntk(model, x, x, names)) < 1e-6


def test_lemma1_closed_form_hadamard():
    torch.manual_seed(0)
    fixed = Elephant(d=8, a=0.5, learnable=False).double()
    for act, sigma in ((nn.Tanh(), torch.tanh), (fixed, lambda z: elephant(z, fixed.h, fixed.a, 8))):
        net = nn.Sequential(nn.Linear(3, 40), act, nn.Linear(40, 1, bias=False)).double()
        x = torch.randn(6, 3, dtype=torch.float64)
        xt = torch.randn(4, 3, dtype=torch.float64)
        closed = one_hidden_layer_ntk(net[0].weight, net[0].bias, net[2].weight[0], sigma, derivative(sigma), x, xt)
        assert rel_err(ntk(net, x, xt)[..., 0, 0], closed) < 1e-10


def test_elephant_ntk_is_local():
    """Theorem 1 in practice: far-apart inputs have a near-zero kernel with Elephant, not with ReLU."""
    x = torch.linspace(0, 2, 101, dtype=torch.float64)[:, None]
    xt = torch.tensor([[1.0]], dtype=torch.float64)
    far = (x[:, 0] - 1.0).abs() > 0.5
    out = {}
    for act, kwargs in (("elephant", {"d": 8, "a": 0.08, "learnable": False}), ("relu", {})):
        torch.manual_seed(0)
        net = mlp(1, [1000], 1, act, kwargs, layer_norm=False, sigma_bias=1.28 if act == "elephant" else None,
                  output_bias=False).double()
        k = ntk(net, x, xt, output="trace")[:, 0]
        out[act] = float(k[far].abs().mean() / k.abs().max())
    assert out["elephant"] < 0.1 and out["relu"] > 0.4


def test_bad_inputs():
    model = build("mlp-relu")
    x = inputs("mlp-relu", 3)
    with pytest.raises(TypeError, match="torch.Tensor"):
        ntk(model, [[0.0] * 4])
    with pytest.raises(ValueError, match="mismatched feature shapes"):
        ntk(model, x, torch.zeros(2, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="output must be one of"):
        ntk(model, x, output="diag")
    with pytest.raises(ValueError, match="implementation must be one of"):
        ntk(model, x, implementation="fast")
    with pytest.raises(ValueError, match="unknown parameter names"):
        ntk(model, x, params=["nope.weight"])
    frozen = build("mlp-relu").requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        ntk(frozen, x)
    with pytest.raises(ValueError, match="does not cover parameters"):
        ntk(build("unknown-module"), inputs("unknown-module", 2), implementation="layerwise")
    with pytest.raises(ValueError, match="first dimension"):
        ntk(nn.Sequential(nn.Linear(4, 3), nn.Flatten(0)).double(), x)
    bn = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3)).double().train()
    with pytest.raises(ValueError, match="model.eval"):
        ntk(bn, x)
    with pytest.raises(MemoryError, match="needs about 2.46 KiB"):
        ntk(model, x, max_memory=10)
    with pytest.raises(ValueError, match="chunk_size"):
        ntk(model, x, chunk_size=0)


def test_float32_model_gives_float32_kernel():
    torch.manual_seed(0)
    net = mlp(4, [16], 2, "elephant")
    k = ntk(net, torch.randn(3, 4))
    assert k.dtype == torch.float32 and k.shape == (3, 3, 2, 2) and torch.isfinite(k).all()
    assert not math.isnan(float(k.sum()))


@pytest.mark.parametrize("name", ["mlp-elephant-ln", "cnn"])
def test_large_symmetric_kernel_blocks(name):
    """N >= 128 takes the blocked symmetric path (upper blocks computed, lower mirrored)."""
    model = build(name)
    x = inputs(name, 130)
    full = ntk(model, x)
    assert rel_err(full, brute_force_ntk(model, x, x)) < 1e-6
    assert torch.allclose(ntk(model, x, output="diagonal"), full.diagonal(dim1=2, dim2=3), rtol=1e-10, atol=1e-12)
    assert torch.allclose(ntk(model, x, output="trace"), full.diagonal(dim1=2, dim2=3).sum(-1), rtol=1e-10, atol=1e-12)


def test_public_rule_seam(monkeypatch):
    """A user's own module type gets a rule through register_rule; explain shows it and the kernel stays exact."""
    from interference import rules
    from reference_models import Scale

    monkeypatch.setattr(rules, "_RULES", dict(rules._RULES))
    calls = []

    def scale_rule(mod, inp, gout, use):
        calls.append(tuple(inp.shape))
        return [itf.Factor.dense(gout * inp)]

    itf.register_rule(Scale, scale_rule, params=("s",))
    model = build("unknown-module")
    x, xt = inputs("unknown-module", 5), inputs("unknown-module", 3, seed=2)
    plan = itf.explain(model, x, xt)
    assert plan.paths["1.s"].path == "rule" and plan.paths["1.s"].rule == "Scale"
    assert rel_err(ntk(model, x, xt), brute_force_ntk(model, x, xt)) < 1e-10 and calls
    with pytest.raises(ValueError, match="already registered"):
        itf.register_rule(Scale, scale_rule, params=("s",))
    with pytest.raises(ValueError, match="non-empty tuple"):
        itf.register_rule(Scale, scale_rule, params="s", replace=True)


def test_clear_errors_for_bad_arguments():
    model = build("mlp-relu")
    x = inputs("mlp-relu", 3)
    for bad in ("abc", float("inf"), float("nan"), 0, -5, True):
        with pytest.raises(ValueError, match="max_memory"):
            ntk(model, x, max_memory=bad)
    for bad in (True, 1.5, "2"):
        with pytest.raises(ValueError, match="chunk_size"):
            ntk(model, x, chunk_size=bad)
    with pytest.raises(MemoryError, match=r"needs about [\d.]+ KiB"):
        ntk(model, x, max_memory=100)
    drop = nn.Sequential(nn.Linear(4, 3), nn.Dropout(0.5)).double().train()
    with pytest.raises(ValueError, match="Dropout.*model.eval"):
        ntk(drop, x)
    assert itf.nature_cnn is itf.nets.nature_cnn


def test_explain_names_each_refusal():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(4, 6)
            self.head = nn.Linear(6, 5)

        def forward(self, x):
            return self.head(torch.tanh(self.body(x))) + nn.functional.embedding(torch.tensor([1]), self.head.weight)[:, :5]

    torch.manual_seed(0)
    model = Tied().double()
    x = inputs("mlp-relu", 3)
    plan = itf.explain(model, x)
    assert {k: p.path for k, p in plan.paths.items()} == {
        "body.weight": "rule", "body.bias": "rule", "head.weight": "func", "head.bias": "rule"}
    assert "used outside" in plan.paths["head.weight"].reason
    assert "head.weight" in str(plan) and "rule:Linear" in str(plan)
    assert rel_err(ntk(model, x), brute_force_ntk(model, x, x)) < 1e-10
    assert {p.path for p in itf.explain(model, x, implementation="loop").paths.values()} == {"loop"}


class _ComplexWeight(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 2, dtype=torch.complex64))
        self.head = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head((x.to(torch.complex64) @ self.w).real)


@pytest.mark.parametrize("call", ["ntk-auto", "ntk-func", "ntk-loop", "per_sample_grads", "gradient_covariance",
                                  "squared_grad_sum"])
def test_complex_parameters_are_refused_naming_them(call):
    """A real kernel of complex parameters (no conjugation) would be silently wrong: every entry refuses them."""
    model, x = _ComplexWeight(), torch.randn(4, 3)
    loss = lambda m, b: m(b).sum(1)  # noqa: E731
    calls = {"ntk-auto": lambda: itf.ntk(model, x), "ntk-func": lambda: itf.ntk(model, x, implementation="func"),
             "ntk-loop": lambda: itf.ntk(model, x, implementation="loop"),
             "per_sample_grads": lambda: itf.per_sample_grads(model, loss, x),
             "gradient_covariance": lambda: itf.gradient_covariance(model, loss, x),
             "squared_grad_sum": lambda: itf.squared_grad_sum(model, loss, x)}
    with pytest.raises(TypeError, match=r"^complex parameters are not supported: w \(torch.complex64\)"):
        calls[call]()
    assert itf.ntk(model, x, params=["head.weight", "head.bias"]).shape == (4, 4, 1, 1)  # the real ones alone


def test_small_models_run_func_where_it_is_proven(monkeypatch):
    """Under ``auto``, a model whose one-sample Jacobian has at most SMALL_JACOBIAN entries takes ``func`` for every
    parameter (cheaper than the layer-wise pass and its check) when ``func`` is proven; it stays exact."""
    monkeypatch.setattr("interference.plan.SMALL_JACOBIAN", 4096)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2)).double().eval()
    x = torch.randn(5, 3, dtype=torch.float64)
    plan = itf.explain(net, x)
    assert {p.path for p in plan.paths.values()} == {"func"}
    assert all("small model" in p.reason for p in plan.paths.values())
    monkeypatch.setattr("interference.plan.SMALL_JACOBIAN", 0)
    ref = itf.ntk(net, x, implementation="loop")
    monkeypatch.setattr("interference.plan.SMALL_JACOBIAN", 4096)
    assert torch.allclose(itf.ntk(net, x), ref, rtol=1e-10, atol=1e-12)
    big = nn.Sequential(nn.Linear(3, 2000), nn.Tanh(), nn.Linear(2000, 2)).double().eval()
    assert {p.path for p in itf.explain(big, x).paths.values()} == {"rule"}  # 2 x 10,002 entries
    gru = nn.GRU(3, 4, batch_first=True).double().eval()

    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn, self.head = gru, nn.Linear(4, 2).double()

        def forward(self, s: torch.Tensor) -> torch.Tensor:
            return self.head(self.rnn(s)[0][:, -1])

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        paths = itf.explain(Head().eval(), torch.randn(4, 3, 3, dtype=torch.float64)).paths
    assert paths["head.weight"].path == "rule", "func is not proven for the GRU: the head keeps its rule"
