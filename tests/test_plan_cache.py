"""The plan cache: a plan serves a later call only when nothing its proofs rest on changed.

Each test changes one thing the key holds and checks that the next call makes a new plan and stays exact (against
the per-sample autograd reference of :mod:`ntk_patterns`); a plan made on one batch that a later batch contradicts
is made again on that batch.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor, nn

import interference
from interference import plan_cache
import ntk_patterns as P


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.l1 = nn.Linear(3, 5).double()
        self.l2 = nn.Linear(5, 2).double()

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.tanh(self.l1(x)))


def _x(n: int = 4, seed: int = 1, f: int = 3) -> Tensor:
    return torch.randn(n, f, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def plans(model: nn.Module) -> list:
    return list(plan_cache._PLANS.get(model, {}).values())


def exact(model: nn.Module, x: Tensor, **kw) -> Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = interference.ntk(model, x, **kw)
    names = P.selected_names(model, kw.get("params"))
    ref = P.reference_ntk(model, x, None, names)
    ok, rel = P.close(got, ref, 1e-10)
    assert ok, f"relative error {rel:.2e}"
    return got


def test_second_call_reuses_the_plan():
    model, x = Net().eval(), _x()
    exact(model, x)
    (first,) = plans(model)
    exact(model, _x(seed=2))  # another batch of the same shape: the same plan
    exact(model, _x(n=7, seed=3))  # another batch size: the same plan
    assert plans(model) == [first]


def _hook(model: Net) -> None:
    model.l1.register_forward_hook(lambda m, a, out: out * 2.0)


def _pre_hook(model: Net) -> None:
    model.l2.register_forward_pre_hook(lambda m, a: (a[0] * 0.5,))


def _new_weight(model: Net) -> None:
    model.l2.weight = nn.Parameter(model.l2.weight.detach() * 3.0)


def _freeze(model: Net) -> None:
    model.l1.bias.requires_grad_(False)


def _train_mode(model: Net) -> None:
    model.l1.train()


def _instance_forward(model: Net) -> None:
    lin = model.l2
    model.l2.forward = lambda x: nn.functional.linear(x, lin.weight * 2.0, lin.bias)


def _parametrize(model: Net) -> None:
    torch.nn.utils.parametrizations.weight_norm(model.l1)


def _new_child(model: Net) -> None:
    model.l1 = nn.Sequential(nn.Linear(3, 4).double(), nn.Tanh(), nn.Linear(4, 5).double())


def _global_hook(model: Net):
    return nn.modules.module.register_module_forward_hook(lambda m, a, out: out)


CHANGES = {"forward hook": _hook, "forward pre-hook": _pre_hook, "new parameter object": _new_weight,
           "requires_grad": _freeze, "training flag": _train_mode, "forward on the instance": _instance_forward,
           "parametrization": _parametrize, "new submodule": _new_child, "global module hook": _global_hook}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_makes_a_new_plan(change):
    model, x = Net().eval(), _x()
    exact(model, x)
    (first,) = plans(model)
    handle = CHANGES[change](model)
    try:
        exact(model, x)
        assert first not in plans(model)[1:], f"{change}: the old plan served the changed model"
        assert len(plans(model)) == 2 or not plans(model)[-1].cacheable or change == "global module hook"
    finally:
        if handle is not None:
            handle.remove()


def test_inputs_and_selection_make_new_plans():
    model = Net().eval()
    exact(model, _x())
    exact(model, _x(), params=["l2.weight"])
    assert len(plans(model)) == 2
    wide = nn.Linear(4, 2).double().eval()
    exact(wide, _x(f=4))
    assert len(plans(wide)) == 0  # the model itself is on a rule: not kept (the plan would keep it alive)


def test_new_rule_makes_a_new_plan(monkeypatch):
    monkeypatch.setattr(interference.rules, "_RULES", dict(interference.rules._RULES))
    model, x = Net().eval(), _x()
    exact(model, x)
    (first,) = plans(model)

    def doubled(mod, inp, gout, use):  # a wrong rule: the new plan must use it (and the exact result shows it)
        return [interference.Factor.linear(inp, gout, "bias" in use)]

    interference.register_rule(nn.Linear, doubled, ("weight", "bias"), replace=True)
    exact(model, x)
    assert first not in plans(model)[1:] and len(plans(model)) == 2


class LaterBatchesMix(nn.Module):
    """Centres the hidden layer over the batch when any input exceeds 3: the first batch does not, the second does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.l1 = nn.Linear(3, 4).double()
        self.l2 = nn.Linear(4, 2).double()

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.l1(x))
        if bool((x > 3).any()):
            h = h - h.mean(0)
        return self.l2(h)


def test_a_cached_plan_contradicted_by_a_later_batch():
    model = LaterBatchesMix().eval()
    exact(model, _x())
    (first,) = plans(model)
    big = _x(n=8, seed=5)
    big[5, 0] = 4.0
    exact(model, big)
    assert not any(p is first for p in plans(model)), "the contradicted plan was kept"


def test_the_cache_does_not_keep_models_alive():
    import gc
    import weakref

    model = Net().eval()
    exact(model, _x())
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None
