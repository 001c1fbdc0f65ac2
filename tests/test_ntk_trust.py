"""Cases that used to give unclear errors, misleading warnings or other kernels, outside the pattern registry of
:mod:`ntk_patterns` (a context around the call, an error from every implementation, inputs that are not a plain
batch): each is exact where it can be, or raises one clear error from every implementation, and leaves the model
as it was.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

import interference
import ntk_patterns as P
from test_ntk_harness import assert_close, assert_unchanged, per_sample_warnings, run, snapshot

IMPLEMENTATIONS = ("auto", "func", "loop", "layerwise")


def build(factory: Callable[[], nn.Module], seed: int = 0) -> nn.Module:
    """``factory()`` in float64 under ``seed``, in eval mode."""
    with torch.random.fork_rng(devices=[]), P._float64():
        torch.manual_seed(seed)
        model = factory()
    return model.eval()


def vec(n: int, seed: int, f: int = 4) -> Tensor:
    return torch.randn(n, f, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def raises_everywhere(model: nn.Module, x: Tensor, error: type[Exception], match: str,
                      impls=IMPLEMENTATIONS, explain: bool = True) -> None:
    """Every implementation of ``ntk`` (and ``explain``) raises ``error`` matching ``match``; the model is left as
    it was."""
    before = snapshot(model)
    calls = [(f"ntk({impl})", interference.ntk, {"implementation": impl}) for impl in impls]
    if explain:
        calls.append(("explain", interference.explain, {}))
    for what, fn, kw in calls:
        try:
            run(fn, model, x, **kw)
        except error as err:
            assert re.search(match, str(err)), f"{what}: {type(err).__name__} does not match {match!r}: {err}"
        except Exception as err:  # noqa: BLE001
            raise AssertionError(f"{what}: must raise {error.__name__} matching {match!r}, raised"
                                 f" {type(err).__name__}: {err}") from err
        else:
            raise AssertionError(f"{what}: must raise {error.__name__} matching {match!r}, returned a result")
        assert_unchanged(before, model)


# ----------------------------------------------------------------------------------------------- parametrize.cached
@pytest.mark.parametrize("name", ["orthogonal", "new-weight-norm-linear", "new-weight-norm-conv",
                                  "new-spectral-norm-linear", "custom-parametrization"])
def test_inside_parametrize_cached(name):
    """ntk (auto, func, loop), explain, gradient_covariance and per_sample_grads called inside
    ``parametrize.cached()`` (its cache already filled by a forward) give what they give outside it, and the
    model's own forwards inside the context still work afterwards."""
    p = P.PATTERNS[name]
    model = P.build_model(p)
    x, xt = P.make_inputs(p, 3, 1), P.make_inputs(p, 2, 2)
    names = P.selected_names(model, None)
    ref = P.reference_ntk(model, x, xt, names)
    ref_trace = P.reference_ntk(model, x, None, names, output="trace")
    g = P.reference_loss_grads(model, P.default_loss, x, names)
    outside, _ = run(interference.explain, model, x, xt)
    with torch.no_grad():
        y = model(x)
    before = snapshot(model)
    with parametrize.cached():
        model(x)  # fills the cache, with a graph, as a training step inside the context would
        for impl in ("auto", "func", "loop"):
            got, records = run(interference.ntk, model, x, xt, implementation=impl)
            assert_close(got, ref, f"ntk({impl}) inside parametrize.cached()")
            assert not per_sample_warnings(records), f"ntk({impl}): {per_sample_warnings(records)}"
            got, _ = run(interference.ntk, model, x, output="trace", implementation=impl)
            assert_close(got, ref_trace, f"ntk({impl}, xt=None, trace) inside parametrize.cached()")
        plan, _ = run(interference.explain, model, x, xt)
        assert {k: v.path for k, v in plan.paths.items()} == {k: v.path for k, v in outside.paths.items()}
        got, _ = run(interference.gradient_covariance, model, P.default_loss, x, normalize=False)
        assert_close(got, g @ g.T, "gradient_covariance(auto) inside parametrize.cached()")
        got, _ = run(interference.per_sample_grads, model, P.default_loss, x)
        for k, v in P.split_grads(model, g, names).items():
            assert_close(got[k], v, f"per_sample_grads[{k}] inside parametrize.cached()")
        assert_unchanged(before, model)
        out = model(x)
        out.sum().backward()  # the cached weights still carry their graph to the parameters
        assert all(q.grad is not None for q in model.parameters() if q.requires_grad)
        assert torch.allclose(out.detach(), y, rtol=1e-12, atol=0)


# ----------------------------------------------------------------------------------------------- checkpoint
@pytest.mark.parametrize("on_input", [False, True], ids=["on-hidden", "on-input"])
def test_reentrant_checkpoint_raises_everywhere(on_input):
    """``checkpoint(block, h, use_reentrant=True)`` supports only ``loss.backward()``: every implementation (and
    explain) raises a RuntimeError that says to pass ``use_reentrant=False`` (the registry's
    ``checkpoint-nonreentrant`` patterns are exact)."""
    model = build(lambda: P.Checkpointed(use_reentrant=True, on_input=on_input))
    raises_everywhere(model, vec(3, 1), RuntimeError, r"use_reentrant=False")


# ----------------------------------------------------------------------------------------------- batch norm
class _NoRunningStats(nn.Module):
    def __init__(self, two_d: bool) -> None:
        super().__init__()
        self.two_d = two_d
        if two_d:
            self.front = nn.Conv2d(1, 2, 3)
            self.bn = nn.BatchNorm2d(2, track_running_stats=False)
            self.head = nn.Linear(8, 2)
        else:
            self.front = nn.Linear(4, 5)
            self.bn = nn.BatchNorm1d(5, track_running_stats=False)
            self.head = nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.bn(self.front(x))).flatten(1))


@pytest.mark.parametrize("two_d", [False, True], ids=["1d", "2d"])
def test_batchnorm_without_running_stats_raises(two_d):
    """BatchNorm with ``track_running_stats=False`` normalises by the batch even in eval mode: every
    implementation and explain raise a ValueError naming ``track_running_stats``."""
    model = build(lambda: _NoRunningStats(two_d))
    x = torch.randn(3, 1, 4, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64) if two_d \
        else vec(3, 1)
    raises_everywhere(model, x, ValueError, r"track_running_stats")


# ----------------------------------------------------------------------------------------------- zero outputs
class _ZeroWidth(nn.Module):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.l = nn.Linear(4, 3)
        self.shape = shape

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.l(x))[:, :0].reshape(x.shape[0], *self.shape)


@pytest.mark.parametrize("shape", [(0,), (2, 0)], ids=["N-0", "N-2-0"])
def test_zero_outputs_raise(shape):
    """A model whose output has no entries per sample: a ValueError saying so from every implementation (and
    explain), not an error from deep inside the kernel or an empty kernel."""
    model = build(lambda: _ZeroWidth(shape))
    raises_everywhere(model, vec(3, 1), ValueError, r"0 outputs|no outputs|nothing to differentiate")


# ----------------------------------------------------------------------------------------------- NaN in a sample
def _elephant_mlp() -> nn.Module:
    return interference.mlp(4, [5], 2, "elephant", {"a": 0.7})


@pytest.mark.parametrize("factory", [lambda: interference.mlp(4, [5, 4], 2, "tanh"), _elephant_mlp],
                         ids=["tanh-mlp", "elephant-mlp"])
def test_nan_in_one_sample(factory):
    """A NaN in one sample of x (or xt): ``auto`` gives the reference (NaN exactly where it has NaN: the rows and
    columns of that sample) and does not warn that the model is not a per-sample function."""
    model = build(factory)
    x, xt = vec(4, 1), vec(3, 2)
    x[2, 1] = float("nan")
    xt[0, 3] = float("nan")
    names = P.selected_names(model, None)
    for what, args in (("x, xt", (x, xt)), ("x, xt=None", (x,)), ("clean x, xt", (vec(4, 3), xt))):
        ref = P.reference_ntk(model, args[0], args[-1] if len(args) == 2 else None, names)
        assert ref.isnan().any() and not ref.isnan().all()
        for output in ("full", "trace"):
            got, records = run(interference.ntk, model, *args, output=output)
            want = ref if output == "full" else ref.diagonal(dim1=2, dim2=3).sum(-1)
            assert got.shape == want.shape, f"{what} {output}: shape {tuple(got.shape)}"
            assert torch.equal(got.isnan(), want.isnan()), f"{what} {output}: NaN where the reference has none"
            scale = float(want.nan_to_num().abs().max())
            assert torch.allclose(got, want, rtol=1e-10, atol=1e-12 * scale, equal_nan=True), f"{what} {output}"
            assert not per_sample_warnings(records), f"{what} {output}: {per_sample_warnings(records)}"


# ----------------------------------------------------------------------------------------------- inputs with grad
def _conv() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8, 2))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("kind", ["mlp", "conv"])
def test_inputs_requiring_grad(kind, impl):
    """``x.requires_grad_()`` (and xt): the kernel is exact, carries no graph (``requires_grad`` False, no
    ``grad_fn``), and the inputs get no ``.grad``."""
    if kind == "mlp":
        model = build(lambda: interference.mlp(4, [5], 2, "tanh"))
        x, xt = vec(3, 1), vec(2, 2)
    else:
        model = build(_conv)
        g = torch.Generator().manual_seed(1)
        x, xt = (torch.randn(k, 1, 4, 4, generator=g, dtype=torch.float64) for k in (3, 2))
    names = P.selected_names(model, None)
    ref = P.reference_ntk(model, x, xt, names)
    ref_xx = P.reference_ntk(model, x, None, names)
    x.requires_grad_()
    xt.requires_grad_()
    before = snapshot(model)
    for what, args, want in (("x, xt", (x, xt), ref), ("x", (x,), ref_xx)):
        got, _ = run(interference.ntk, model, *args, implementation=impl)
        assert not got.requires_grad and got.grad_fn is None, f"ntk({impl}) {what}: the kernel carries a graph"
        assert_close(got, want, f"ntk({impl}) {what}")
    assert x.grad is None and xt.grad is None
    assert_unchanged(before, model)
