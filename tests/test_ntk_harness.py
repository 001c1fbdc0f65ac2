"""Differential harness: ``interference.ntk`` (and gradient_covariance / per_sample_grads / explain) against an
independent per-sample autograd reference on every pattern of :mod:`ntk_patterns`.

For each pattern and implementation the result equals the reference to 1e-10 (relative, max norm) or the call
raises its documented error: ``layerwise`` a ValueError "does not cover" when a selected parameter is not on a rule
(or, on a model that is not a per-sample function beyond what the dry runs see, a RuntimeError suggesting ``auto``);
``func`` a RuntimeError naming vmap when ``torch.func.vmap`` cannot run the model. ``auto`` and ``loop`` never raise.
The reference is computed once per pattern (cached); ``auto`` gets every combination (outputs, x != xt, xt=None,
chunked and unchunked), the other implementations a few. A pattern with ``refuses`` (a random or stateful forward)
has no reference: every entry point must raise its ValueError. After every call the model is as it was (parameter
objects, flags, gradients, module and tensor hooks, parametrizations, buffers) and so are the caller's inputs; a
pattern's parameter tensor hooks still act on a later ``backward()``.
"""

from __future__ import annotations

import copy
import functools
import re
import warnings
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.nn.utils import parametrize

import interference
import ntk_patterns as P

NAMES = sorted(P.PATTERNS)
RTOL = 1e-10


# ----------------------------------------------------------------------------------------------- helpers
@dataclass
class Case:
    """A pattern's inputs and reference results (computed once; none for a pattern the engine must refuse)."""

    p: P.Pattern
    x: P.Batch
    xt: P.Batch
    names: list[str]
    k_xxt: Tensor | None  # full (N, M, O, O)
    k_xx: Tensor | None  # full (N, N, O, O)
    loss_grads: Tensor | None  # (N, P) per-sample loss gradients on x


@functools.lru_cache(maxsize=None)
def case(name: str) -> Case:
    p = P.PATTERNS[name]
    model = P.build_model(p, reference=True)
    x, xt = P.make_inputs(p, p.n, 1), P.make_inputs(p, p.m, 2)
    names = P.selected_names(model, p.params)
    if p.refuses is not None:  # random or stateful: there is no kernel to compare with
        return Case(p, x, xt, names, None, None, None)
    fn = P.model_fn(model)
    j1 = P.reference_jacobian(fn, model, x, names)
    j2 = P.reference_jacobian(fn, model, xt, names)
    grads = P.reference_loss_grads(model, p.loss, x, names) if p.loss is not None else None
    return Case(p, x, xt, names, P.kernel_from_jacobians(j1, j2, "full"), P.kernel_from_jacobians(j1, j1, "full"),
                grads)


def reduce(full: Tensor, output: str) -> Tensor:
    if output == "full":
        return full
    diag = full.diagonal(dim1=2, dim2=3)
    return diag if output == "diagonal" else diag.sum(-1)


def assert_close(got: Tensor, ref: Tensor, what: str) -> None:
    assert isinstance(got, Tensor), f"{what}: got {type(got).__name__}"
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != reference {tuple(ref.shape)}"
    assert got.dtype == torch.float64, f"{what}: dtype {got.dtype}"
    ok, rel = P.close(got, ref, RTOL)
    assert ok, f"{what}: relative error {rel:.2e} > {RTOL:g} (max |ref| {float(ref.abs().max()):.3g})"


def vmap_warnings(records: list[warnings.WarningMessage]) -> list[str]:
    """The engine's fallback warnings (UserWarning naming vmap); functorch's own performance notes are ignored."""
    return [str(w.message) for w in records
            if issubclass(w.category, UserWarning) and "vmap" in str(w.message)
            and "There is a performance drop" not in str(w.message)]


def per_sample_warnings(records: list[warnings.WarningMessage]) -> list[str]:
    """The engine's warnings that a block was not a per-sample function of its samples (beyond the dry runs)."""
    return [str(w.message) for w in records
            if issubclass(w.category, UserWarning) and "not a per-sample function" in str(w.message)]


def run(fn, *args, **kwargs):
    """Call ``fn`` recording warnings (so the test output stays clean); returns (result, records)."""
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        result = fn(*args, **kwargs)
    return result, records


def snapshot(model: nn.Module) -> dict:
    return {
        "state": {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()},
        "requires_grad": {k: p.requires_grad for k, p in model.named_parameters()},
        # every name a parameter is reachable under (aliased submodules too): the same object, still a Parameter
        "objects": {k: (id(p), type(p)) for k, p in model.named_parameters(remove_duplicate=False)},
        "grads": {k: None if p.grad is None else p.grad.clone() for k, p in model.named_parameters()},
        "hooks": {k: (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks),
                      len(m._backward_pre_hooks)) for k, m in model.named_modules()},
        # tensor hooks on the parameters (id and function) and the modules' parametrizations
        "param_hooks": {k: None if getattr(p, "_backward_hooks", None) is None else tuple(p._backward_hooks.items())
                        for k, p in model.named_parameters(remove_duplicate=False)},
        "parametrized": {k: parametrize.is_parametrized(m) for k, m in model.named_modules()},
        "training": {k: m.training for k, m in model.named_modules()},
    }


def assert_unchanged(before: dict, model: nn.Module) -> None:
    after = snapshot(model)
    assert after["objects"] == before["objects"], "parameter objects were replaced (a layer would stop training)"
    assert after["requires_grad"] == before["requires_grad"], "requires_grad flags changed"
    for k, g in before["grads"].items():
        now = after["grads"][k]
        assert (g is None) == (now is None) and (g is None or torch.equal(g, now)), f"{k}.grad changed"
    assert after["hooks"] == before["hooks"], "hooks were left on the model"
    for k, hooks in before["param_hooks"].items():
        assert after["param_hooks"][k] == hooks, (f"{k}'s tensor hooks changed: {hooks} before, "
                                                  f"{after['param_hooks'][k]} after")
    assert after["parametrized"] == before["parametrized"], "parametrizations were added or removed"
    assert after["training"] == before["training"], "train/eval mode changed"
    assert before["state"].keys() == after["state"].keys()
    for k, v in before["state"].items():
        assert torch.equal(v, after["state"][k]), f"{k} changed"


def run_on(model: nn.Module, before: dict, fn, *args, **kwargs):
    """``run``, then assert the model is as ``before`` (whether the call returned or raised)."""
    try:
        return run(fn, *args, **kwargs)
    finally:
        assert_unchanged(before, model)


def assert_inputs_unchanged(c: Case, what: str) -> None:
    """The caller's batches hold what the pattern made (a forward writing its input in place must not reach them)."""
    for got, made in ((c.x, P.make_inputs(c.p, c.p.n, 1)), (c.xt, P.make_inputs(c.p, c.p.m, 2))):
        for a, b in zip(P.tree_leaves(got), P.tree_leaves(made)):
            assert torch.equal(a, b), f"{what}: the caller's input was modified"


def check_refusal(p: P.Pattern, model: nn.Module, before: dict, what: str, fn, *args, **kwargs) -> None:
    """A random or stateful forward: ``fn`` raises a ValueError matching ``p.refuses`` and leaves the model as it
    was (its buffers hold their values from before)."""
    try:
        run(fn, *args, **kwargs)
    except ValueError as err:
        assert re.search(p.refuses, str(err)), f"{what}: the ValueError does not match {p.refuses!r}: {err}"
    except Exception as err:  # noqa: BLE001
        raise AssertionError(f"{what}: must raise a ValueError matching {p.refuses!r}, raised"
                             f" {type(err).__name__}: {err}") from err
    else:
        raise AssertionError(f"{what}: must raise a ValueError matching {p.refuses!r}, returned a result")
    assert_unchanged(before, model)


def assert_param_hooks_work(p: P.Pattern, model: nn.Module, batch: P.Batch) -> None:
    """The parameters' tensor hooks still act after the engine's calls: ``loss.backward()`` gives the gradients of
    the same model never measured (hooks applied). Leaves ``.grad`` as it was (None)."""
    if p.reference_build is None:
        return
    fresh = P.build_model(p)
    for m in (model, fresh):
        m.zero_grad(set_to_none=True)
        P.default_loss(m, batch).sum().backward()
    for (k, a), (_, b) in zip(model.named_parameters(), fresh.named_parameters()):
        assert (a.grad is None) == (b.grad is None), f"{k}: .grad after backward"
        if a.grad is not None:
            assert torch.allclose(a.grad, b.grad, rtol=1e-12, atol=0), f"{k}: its tensor hooks no longer act"
    model.zero_grad(set_to_none=True)


def leaf_calls(model: nn.Module, batch: P.Batch) -> tuple[Tensor, dict[str, list[Tensor | None]]]:
    """One forward without gradients: ``(n, O)`` outputs and each leaf module's first tensor argument per call."""
    calls: dict[str, list[Tensor | None]] = {}

    def hook(name: str):
        return lambda mod, args, out: calls.setdefault(name, []).append(
            args[0].detach().clone() if args and isinstance(args[0], Tensor) else None)

    handles = [m.register_forward_hook(hook(k)) for k, m in model.named_modules() if not any(m.children())]
    try:
        with torch.no_grad():
            out = model(P.tree_map(torch.clone, batch))
    finally:
        for h in handles:
            h.remove()
    return out.reshape(out.shape[0], -1), calls


def rows_are_samples(model: nn.Module, batch: P.Batch) -> bool:
    """Whether the batch's forward is each sample's alone, row by row: outputs, and the rows of every leaf module's
    input (the same modules called as often, each input's row ``i`` that of sample ``i`` alone)."""
    n = P.batch_len(batch)
    out, calls = leaf_calls(model, batch)
    for i in range(n):
        alone, own = leaf_calls(model, P.take(batch, i))
        if not torch.allclose(out[i:i + 1], alone, rtol=1e-10, atol=1e-12) or own.keys() != calls.keys():
            return False
        for k, ins in calls.items():
            if len(ins) != len(own[k]):
                return False
            for a, b in zip(ins, own[k]):
                if a is None or b is None or (a.shape[0] == 0 and b.shape[0] == 0):
                    continue
                if a.shape[0] != n or b.shape[0] != 1 or a.shape[1:] != b.shape[1:] or \
                        not torch.allclose(a[i:i + 1], b, rtol=1e-10, atol=1e-12):
                    return False
    return True


def func_refuses(p: P.Pattern) -> bool | None:
    """``implementation="func"`` must raise (True), must not (False), or may (None): vmap cannot run the model, or
    functional_call cannot see a parameter's use (hidden_use), which the engine detects against autograd."""
    return True if p.hidden_use else p.vmap_fails


def expect_raise(p: P.Pattern, impl: str, must: set[str], maybe: set[str], names: list[str]) -> bool | None:
    """True: the documented error is required; False: it is forbidden; None: either (spec leaves it open)."""
    if impl in ("auto", "loop"):
        return False
    if impl == "func":
        return func_refuses(p)  # None: shape-dependent, either
    uncovered = set(names) - must
    if not uncovered:
        return False
    return True if uncovered - maybe else None


def check_error(err: Exception, impl: str, name: str, p: P.Pattern | None = None) -> None:
    if impl == "layerwise":
        if p is not None and p.fallback_warns and isinstance(err, RuntimeError):
            assert "implementation='layerwise'" in str(err) and "'auto'" in str(err), f"{name}: layerwise raised {err!r}"
            return
        assert isinstance(err, ValueError) and "does not cover" in str(err), f"{name}: layerwise raised {err!r}"
    elif impl == "func":
        assert isinstance(err, RuntimeError) and "vmap" in str(err), f"{name}: func raised {err!r}"
        assert "loop" in str(err), f"{name}: func's error should suggest implementation='loop': {err}"
    else:
        raise AssertionError(f"{name}: implementation={impl!r} must not raise, got {type(err).__name__}: {err}")


def max_fallback_warnings(p: P.Pattern) -> int:
    """``auto`` may warn once when it falls back from vmap to the loop, and only then."""
    return 0 if func_refuses(p) is False else 1


def max_per_sample_warnings(p: P.Pattern) -> int:
    """``auto`` may warn once that the model is not per-sample beyond the dry runs (``fallback_warns``), and only
    then."""
    return 1 if p.fallback_warns else 0


def check_auto_warnings(p: P.Pattern, records: list[warnings.WarningMessage], what: str) -> None:
    falls, mixes = vmap_warnings(records), per_sample_warnings(records)
    assert len(falls) <= max_fallback_warnings(p), f"{what}: warnings {falls}"
    assert len(mixes) <= max_per_sample_warnings(p), f"{what}: warnings {mixes}"


def exact_paths(p: P.Pattern) -> set[str]:
    """The exact path ``explain(auto)`` may name for parameters not on a rule."""
    return {True: {"loop"}, False: {"func"}, None: {"func", "loop"}}[func_refuses(p)]


def expected_rules(name: str, loss: bool = False) -> tuple[set[str], set[str]]:
    c = case(name)
    return P.expected_rule(c.p, P.build_model(c.p), c.names, loss=loss)


def params_kw(p: P.Pattern) -> dict:
    return {"params": list(p.params)} if p.params is not None else {}


# ----------------------------------------------------------------------------------------------- the registry
def test_registry_is_broad_and_tiny():
    assert len(P.PATTERNS) >= 60
    tags = {t for p in P.PATTERNS.values() for t in p.tags}
    for needed in ("tying", "parametrization", "time-major", "vmap", "mixing", "hooks", "subclass", "conv",
                   "elephant", "embedding", "pytree", "params", "attention", "recurrent", "output", "buffers",
                   "batch-coupling", "random", "stateful", "param-hooks", "sharing", "checkpoint"):
        assert needed in tags, needed
    for p in P.PATTERNS.values():
        assert p.n <= (8 if "batch-coupling" in p.tags else 4) and p.m <= 4, p.name
        assert (p.refuses is None) == ("random" not in p.tags and "stateful" not in p.tags), p.name
        assert (p.reference_build is None) == ("param-hooks" not in p.tags), p.name
        model = P.build_model(p)
        assert not model.training and not any(m.training for m in model.modules()), p.name
        assert all(t.dtype == torch.float64 for t in model.parameters()), p.name
        assert sum(t.numel() for t in model.parameters()) <= 600, p.name
        again = P.build_model(p)
        for (k, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
            assert torch.equal(a, b), f"{p.name}: {k} differs between builds (factory not seeded)"


@pytest.mark.parametrize("name", NAMES)
def test_reference_is_self_consistent(name):
    """The autograd-row reference equals torch.autograd.functional.jacobian of one flat parameter vector, and the
    pattern's vmap_fails flag is what torch.func actually does. A pattern with parameter hooks: its reference model
    is the model without them, and the hooks change the gradients autograd gives (the pattern tests something)."""
    c = case(name)
    if c.p.refuses is not None:
        pytest.skip("the engine must refuse this model: no reference")
    model = P.build_model(c.p, reference=True)
    if c.p.zero_kernel:
        assert c.k_xxt.abs().max() == 0 and c.k_xx.abs().max() == 0, "zero_kernel, but the reference is not zero"
    else:
        assert c.k_xxt.abs().max() > 0, "reference kernel is zero: the pattern tests nothing"
    if c.p.reference_build is not None:
        hooked = P.build_model(c.p)
        plain = dict(model.named_parameters())
        assert [k for k, _ in hooked.named_parameters()] == list(plain), "the reference model has other parameters"
        for k, v in hooked.named_parameters():
            assert torch.equal(v, plain[k]), f"{k} differs from the reference model's (not the same seed?)"
            assert not getattr(plain[k], "_backward_hooks", None), f"the reference model's {k} has tensor hooks"
        assert any(getattr(v, "_backward_hooks", None) for v in hooked.parameters()), "no parameter has a hook"
        j = P.reference_jacobian(P.model_fn(hooked), hooked, c.x, c.names)
        assert not P.close(P.kernel_from_jacobians(j, j, "full"), c.k_xx, 1e-6)[0], \
            "the hooks do not change autograd's gradients: the pattern tests nothing"
    if "batch-coupling" in c.p.tags:  # the batch is not its samples; "dry-run-blind": a pair (either order) is
        assert not rows_are_samples(model, c.x), "the batch's rows are its samples alone: the pattern tests nothing"
        if "dry-run-blind" in c.p.tags:
            for order in ([0, 1], [1, 0]):
                pair = P.tree_map(lambda t: t[order].clone(), c.x)
                assert rows_are_samples(model, pair), f"samples {order} together differ from each alone"
    if not c.p.hidden_use:
        j = P.functional_jacobian(P.model_fn(model), model, c.x, c.names)
        jt = P.functional_jacobian(P.model_fn(model), model, c.xt, c.names)
        ok, rel = P.close(P.kernel_from_jacobians(j, jt, "full"), c.k_xxt, 1e-12)
        assert ok, f"references disagree: {rel:.2e}"
    named = dict(model.named_parameters())
    params = {k: named[k].detach() for k in c.names}

    def single(prm, sample):
        one = P.tree_map(lambda t: t.unsqueeze(0), sample)
        return torch.func.functional_call(model, prm, (one,)).reshape(-1)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.func.vmap(torch.func.jacrev(single), in_dims=(None, 0))(params, P.tree_map(torch.clone, c.x))
        vmap_ok = True
    except Exception:  # noqa: BLE001
        vmap_ok = False
    if c.p.vmap_fails is not None:  # None: shape-dependent
        assert vmap_ok != c.p.vmap_fails, (f"vmap_fails={c.p.vmap_fails} but torch.func.vmap"
                                           f" {'ran' if vmap_ok else 'failed'}")


# ----------------------------------------------------------------------------------------------- ntk
@pytest.mark.parametrize("name", NAMES)
def test_auto_all_combinations(name):
    c = case(name)
    model = P.build_model(c.p)
    before = snapshot(model)
    kw = params_kw(c.p)
    combos = [("full", True, None), ("diagonal", True, None), ("trace", True, None),
              ("full", True, 2), ("trace", True, 1), ("diagonal", True, 2),
              ("full", False, None), ("trace", False, 2), ("diagonal", False, 1)]
    for output, with_xt, chunk in combos:
        what = f"auto output={output} xt={'yes' if with_xt else 'None'} chunk_size={chunk}"
        args = (model, c.x, c.xt) if with_xt else (model, c.x)
        if c.p.refuses is not None:
            check_refusal(c.p, model, before, what, interference.ntk, *args, output=output, chunk_size=chunk, **kw)
            continue
        got, records = run_on(model, before, interference.ntk, *args, output=output, chunk_size=chunk, **kw)
        assert_close(got, reduce(c.k_xxt if with_xt else c.k_xx, output), what)
        check_auto_warnings(c.p, records, what)
    assert_inputs_unchanged(c, "auto")
    assert_param_hooks_work(c.p, model, c.x)


@pytest.mark.parametrize("impl", ["func", "loop", "layerwise"])
@pytest.mark.parametrize("name", NAMES)
def test_other_implementations(name, impl):
    c = case(name)
    model = P.build_model(c.p)
    before = snapshot(model)
    kw = params_kw(c.p)
    if c.p.refuses is None:
        must, maybe = expected_rules(name)
        want_error = expect_raise(c.p, impl, must, maybe, c.names)
    for output, with_xt, chunk in (("full", True, None), ("trace", False, 2)):
        what = f"{impl} output={output} xt={'yes' if with_xt else 'None'} chunk_size={chunk}"
        args = (model, c.x, c.xt) if with_xt else (model, c.x)
        if c.p.refuses is not None:
            check_refusal(c.p, model, before, what, interference.ntk, *args, output=output, chunk_size=chunk,
                          implementation=impl, **kw)
            continue
        try:
            got, records = run_on(model, before, interference.ntk, *args, output=output, chunk_size=chunk,
                                  implementation=impl, **kw)
        except Exception as err:  # noqa: BLE001
            assert want_error is not False, f"{what} raised {type(err).__name__}: {err}"
            check_error(err, impl, what, c.p)
            continue
        assert want_error is not True, f"{what} should raise its documented error, returned a kernel"
        assert_close(got, reduce(c.k_xxt if with_xt else c.k_xx, output), what)
        assert not vmap_warnings(records), f"{what}: {vmap_warnings(records)}"
        assert not per_sample_warnings(records), f"{what}: {per_sample_warnings(records)}"
    assert_inputs_unchanged(c, impl)
    assert_param_hooks_work(c.p, model, c.x)


@pytest.mark.parametrize("name", NAMES)
def test_identical_samples(name):
    """Every sample the same (no pair to compare in the dry runs): still exact."""
    c = case(name)
    model = P.build_model(c.p)
    before = snapshot(model)
    one = P.take(c.x, 0)
    x = P.tree_map(lambda t: t.expand(2, *t.shape[1:]).contiguous(), one)
    kw = params_kw(c.p)
    if c.p.refuses is not None:
        check_refusal(c.p, model, before, "auto, identical samples", interference.ntk, model, x, output="full", **kw)
        return
    got, _ = run_on(model, before, interference.ntk, model, x, output="full", **kw)
    k1 = c.k_xx[:1, :1]
    assert_close(got, k1.expand(2, 2, *k1.shape[2:]), "auto, identical samples")
    assert_param_hooks_work(c.p, model, c.x)


# ----------------------------------------------------------------------------------------------- explain
def check_paths(plan, model: nn.Module, names: list[str], must: set[str], maybe: set[str], exact: set[str],
                what: str) -> None:
    paths = plan.paths
    assert set(paths) == set(names), f"{what}: explain covers {sorted(paths)}, selected {sorted(names)}"
    owner = {}
    for mod in model.modules():
        for local, prm in mod.named_parameters(recurse=False):
            owner.setdefault(id(prm), type(mod).__name__)
    named = dict(model.named_parameters())
    on_rule = {k for k, v in paths.items() if v.path == "rule"}
    assert must <= on_rule, f"{what}: expected on a rule but not: {sorted(must - on_rule)} " + "; ".join(
        f"{k}: {paths[k].reason}" for k in sorted(must - on_rule))
    wrong = on_rule - must - maybe
    assert not wrong, f"{what}: on a rule but must not be: {sorted(wrong)}"
    for k, v in paths.items():
        assert v.path in ("rule", "func", "loop"), f"{what}: {k} path {v.path!r}"
        if v.path == "rule":
            assert v.rule == owner[id(named[k])], f"{what}: {k} rule {v.rule!r}"
        else:
            assert v.rule is None, f"{what}: {k} is on {v.path} but names rule {v.rule!r}"
            assert isinstance(v.reason, str) and v.reason, f"{what}: {k} has no reason"
            assert v.path in exact, f"{what}: {k} path {v.path!r}, expected {sorted(exact)} ({v.reason})"


@pytest.mark.parametrize("name", NAMES)
def test_explain_paths(name):
    c = case(name)
    model = P.build_model(c.p)
    before = snapshot(model)
    kw = params_kw(c.p)
    if c.p.refuses is not None:
        for impl in ("auto", "loop", "func"):
            check_refusal(c.p, model, before, f"explain({impl})", interference.explain, model, c.x, c.xt,
                          implementation=impl, **kw)
        return
    must, maybe = expected_rules(name)
    plan, _ = run_on(model, before, interference.explain, model, c.x, c.xt, **kw)
    check_paths(plan, model, c.names, must, maybe, exact_paths(c.p), "explain(auto)")
    assert str(plan)
    plan, _ = run_on(model, before, interference.explain, model, c.x, implementation="loop", **kw)
    check_paths(plan, model, c.names, set(), set(), {"loop"}, "explain(loop)")
    plan, _ = run_on(model, before, interference.explain, model, c.x, implementation="func", **kw)
    check_paths(plan, model, c.names, set(), set(), {"func"}, "explain(func)")
    assert_inputs_unchanged(c, "explain")
    assert_param_hooks_work(c.p, model, c.x)


# ----------------------------------------------------------------------------------------------- gradcov
LOSS_NAMES = [k for k in NAMES if P.PATTERNS[k].loss is not None]


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_gradient_covariance(name):
    c = case(name)
    model = P.build_model(c.p)
    before = snapshot(model)
    kw = params_kw(c.p)
    if c.p.refuses is not None:
        for impl in ("auto", "func", "loop"):
            for normalize in (False, True):
                check_refusal(c.p, model, before, f"gradient_covariance({impl}, normalize={normalize})",
                              interference.gradient_covariance, model, c.p.loss, c.x, normalize=normalize,
                              implementation=impl, **kw)
        check_refusal(c.p, model, before, "explain(auto, loss_fn)", interference.explain, model, c.x,
                      loss_fn=c.p.loss, **kw)
        return
    g = c.loss_grads
    gram = g @ g.T
    norm = g.norm(dim=1)
    assert (norm > 0).all(), "a sample has a zero loss gradient: pick another loss or input"
    cov = gram / norm[:, None] / norm[None, :]
    got, records = run_on(model, before, interference.gradient_covariance, model, c.p.loss, c.x, normalize=False,
                          **kw)
    assert_close(got, gram, "gradient_covariance(auto, normalize=False)")
    check_auto_warnings(c.p, records, "gradient_covariance(auto, normalize=False)")
    got, _ = run_on(model, before, interference.gradient_covariance, model, c.p.loss, c.x, **kw)
    assert_close(got, cov, "gradient_covariance(auto)")
    must, maybe = expected_rules(name, loss=True)
    plan, _ = run_on(model, before, interference.explain, model, c.x, loss_fn=c.p.loss, **kw)
    check_paths(plan, model, c.names, must, maybe, exact_paths(c.p), "explain(auto, loss_fn)")
    for impl in ("func", "loop"):
        try:
            got, _ = run_on(model, before, interference.gradient_covariance, model, c.p.loss, c.x, normalize=False,
                            implementation=impl, **kw)
        except Exception as err:  # noqa: BLE001
            assert impl == "func" and func_refuses(c.p) is not False, f"gradient_covariance({impl}) raised {err!r}"
            check_error(err, impl, f"gradient_covariance({impl})")
            continue
        assert not (impl == "func" and func_refuses(c.p)), f"gradient_covariance(func) should raise on {name}"
        assert_close(got, gram, f"gradient_covariance({impl}, normalize=False)")
    assert_inputs_unchanged(c, "gradient_covariance")
    assert_param_hooks_work(c.p, model, c.x)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_per_sample_grads(name):
    c = case(name)
    model = P.build_model(c.p)
    before = snapshot(model)
    kw = params_kw(c.p)
    if c.p.refuses is not None:
        for impl in ("auto", "func", "loop"):
            check_refusal(c.p, model, before, f"per_sample_grads({impl})", interference.per_sample_grads, model,
                          c.p.loss, c.x, implementation=impl, **kw)
        return
    ref = P.split_grads(model, c.loss_grads, c.names)
    for impl in ("auto", "func", "loop"):
        try:
            got, records = run_on(model, before, interference.per_sample_grads, model, c.p.loss, c.x,
                                  implementation=impl, **kw)
        except Exception as err:  # noqa: BLE001
            assert impl == "func" and func_refuses(c.p) is not False, f"per_sample_grads({impl}) raised {err!r}"
            check_error(err, impl, f"per_sample_grads({impl})")
            continue
        assert not (impl == "func" and func_refuses(c.p)), f"per_sample_grads(func) should raise on {name}"
        assert set(got) == set(c.names), f"per_sample_grads({impl}) keys {sorted(got)}"
        for k in c.names:
            assert_close(got[k], ref[k], f"per_sample_grads({impl})[{k}]")
        if impl == "auto":
            check_auto_warnings(c.p, records, f"per_sample_grads({impl})")
    assert_inputs_unchanged(c, "per_sample_grads")
    assert_param_hooks_work(c.p, model, c.x)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_squared_grad_sum(name):
    """``sum_n g_n^2`` per parameter (both implementations) against the reference's per-sample loss gradients."""
    c = case(name)
    model = P.build_model(c.p)
    before = snapshot(model)
    kw = params_kw(c.p)
    for impl in ("auto", "exact"):
        what = f"squared_grad_sum({impl})"
        if c.p.refuses is not None:
            check_refusal(c.p, model, before, what, interference.squared_grad_sum, model, c.p.loss, c.x,
                          implementation=impl, **kw)
            continue
        ref = P.split_grads(model, c.loss_grads ** 2, c.names)
        got, records = run_on(model, before, interference.squared_grad_sum, model, c.p.loss, c.x,
                              implementation=impl, **kw)
        assert set(got) == set(c.names), f"{what} keys {sorted(got)}"
        for k in c.names:
            assert_close(got[k], ref[k].sum(0), f"{what}[{k}]")
        check_auto_warnings(c.p, records, what)
    assert_inputs_unchanged(c, "squared_grad_sum")
    assert_param_hooks_work(c.p, model, c.x)


# ----------------------------------------------------------------------------------------------- beyond the registry
# Cases that cannot be registry patterns: they change global state (the rule registry, nn.Linear's class forward),
# raise for every implementation, or are not float64 models.
def exact_everywhere(model: nn.Module, x: Tensor, xt: Tensor, what: str, impls=("auto", "func", "loop"),
                     **kw) -> None:
    names = P.selected_names(model, kw.get("params"))
    ref = P.reference_ntk(model, x, xt, names)
    for impl in impls:
        got, _ = run(interference.ntk, model, x, xt, implementation=impl, **kw)
        assert_close(got, ref, f"{what}: {impl}")


class _Scale(nn.Module):
    """``y = x * s``: a user's module type, taught to the engine through register_rule."""

    def __init__(self, f: int) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.linspace(0.5, 1.5, f, dtype=torch.float64))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.s


def _scale_rule(mod, inp, gout, use):
    return [interference.Factor.dense((gout * inp).reshape(*gout.shape[:2], -1, inp.shape[-1]).sum(2))]


def _other_norm(lin: nn.Linear) -> Tensor:
    return lin.weight.sum(1).tanh()


class _ScaleReadsOther(nn.Module):
    """``y = x * s * tanh(other.weight.sum(1))``: reads another Linear's weight (``other`` is no submodule)."""

    def __init__(self, f: int, other: nn.Linear) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.linspace(0.5, 1.5, f, dtype=torch.float64))
        self.__dict__["other"] = other

    def forward(self, x: Tensor) -> Tensor:
        return x * self.s * _other_norm(self.other)


def _scale_reads_other_rule(mod, inp, gout, use):
    """Right for ``s`` (the other weight's factor is a constant to it); says nothing about ``other.weight``."""
    g = gout * inp * _other_norm(mod.other)
    return [interference.Factor.dense(g.reshape(*gout.shape[:2], -1, inp.shape[-1]).sum(2))]


class _ScaleNet(nn.Module):
    def __init__(self, scale: type = _Scale) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.l = nn.Linear(3, 4).double()
        self.sc = scale(4, self.l) if scale is _ScaleReadsOther else scale(4)
        self.head = nn.Linear(4, 2).double()

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.sc(self.l(x))))


def _vec(n: int, seed: int, f: int = 3) -> Tensor:
    return torch.randn(n, f, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_registered_rule_module_reading_another_weight(monkeypatch):
    """A registered module that reads another Linear's weight in its forward: its own parameter stays on its rule,
    the other weight (used outside its module's call) does not, and the kernel is exact."""
    monkeypatch.setattr(interference.rules, "_RULES", dict(interference.rules._RULES))
    interference.register_rule(_Scale, _scale_rule, params=("s",))
    interference.register_rule(_ScaleReadsOther, _scale_reads_other_rule, params=("s",))
    x, xt = _vec(3, 1), _vec(2, 2)

    plain = _ScaleNet(_Scale)
    exact_everywhere(plain, x, xt, "user rule (Scale)")
    plan, _ = run(interference.explain, plain, x, xt)
    assert {k: v.path for k, v in plan.paths.items()} == dict.fromkeys(P.selected_names(plain, None), "rule")
    assert plan.paths["sc.s"].rule == "_Scale"

    model = _ScaleNet(_ScaleReadsOther)
    exact_everywhere(model, x, xt, "user rule reading l.weight")
    got, records = run(interference.ntk, model, x, xt)
    assert not vmap_warnings(records) and not per_sample_warnings(records)
    plan, _ = run(interference.explain, model, x, xt)
    assert plan.paths["l.weight"].path == "func", f"l.weight: {plan.paths['l.weight']}"
    assert plan.paths["sc.s"].path == "rule" and plan.paths["sc.s"].rule == "_ScaleReadsOther"
    assert plan.paths["l.bias"].path == "rule" and plan.paths["head.weight"].path == "rule"
    g = P.reference_loss_grads(model, P.default_loss, x, P.selected_names(model, None))
    got, _ = run(interference.gradient_covariance, model, P.default_loss, x, normalize=False)
    assert_close(got, g @ g.T, "gradient_covariance(auto)")


class _BadScale(_Scale):
    pass


def test_registered_rule_returning_bad_factors_names_the_rule(monkeypatch):
    """A user rule returning a factor of the wrong shape, or a bare tensor, raises a clear error naming the rule's
    module type (not an error deep in the kernel, not a wrong kernel)."""
    monkeypatch.setattr(interference.rules, "_RULES", dict(interference.rules._RULES))
    model = _ScaleNet(_BadScale)
    x = _vec(3, 1)
    interference.register_rule(
        _BadScale, lambda mod, inp, gout, use: [interference.Factor.dense(gout.reshape(gout.shape[0], -1, 1))],
        params=("s",))
    for impl in ("auto", "layerwise"):
        with pytest.raises(ValueError, match=r"rule for _BadScale.*shape"):
            run(interference.ntk, model, x, implementation=impl)
    interference.register_rule(_BadScale, lambda mod, inp, gout, use: gout * inp, params=("s",), replace=True)
    for impl in ("auto", "layerwise"):
        with pytest.raises(TypeError, match=r"rule for _BadScale.*list of interference.Factor.*Tensor"):
            run(interference.ntk, model, x, implementation=impl)
    for impl in ("func", "loop"):  # no rule is used: exact
        exact_everywhere(model, x, _vec(2, 2), "bad rule unused", impls=(impl,))


def test_class_level_patched_linear_forward(monkeypatch):
    """``nn.Linear.forward`` replaced on the class (as adapter / quantisation libraries do): the modules are still
    exactly ``nn.Linear``, but the Linear rule was written for the original forward, so no weight is on it."""
    monkeypatch.setattr(nn.Linear, "forward", lambda self, x: F.linear(x, self.weight * 2.0, self.bias))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double().eval()
    x, xt = _vec(3, 1), _vec(2, 2)
    exact_everywhere(model, x, xt, "patched Linear.forward")
    plan, _ = run(interference.explain, model, x, xt)
    check_paths(plan, model, P.selected_names(model, None), set(), set(), {"func"}, "explain(auto)")
    g = P.reference_loss_grads(model, P.default_loss, x, P.selected_names(model, None))
    got, _ = run(interference.gradient_covariance, model, P.default_loss, x, normalize=False)
    assert_close(got, g @ g.T, "gradient_covariance(auto)")


class _IntOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(3, 2).double()

    def forward(self, x: Tensor) -> Tensor:
        return self.l(x).argmax(1, keepdim=True)


def test_integer_output_raises_type_error():
    """An integer output cannot be differentiated: a clear TypeError from every implementation and from explain."""
    model = _IntOutput().eval()
    x = _vec(3, 1)
    for impl in ("auto", "func", "loop", "layerwise"):
        with pytest.raises(TypeError, match="floating-point"):
            run(interference.ntk, model, x, implementation=impl)
    with pytest.raises(TypeError, match="floating-point"):
        run(interference.explain, model, x)


class _Float32Float64Output(nn.Module):
    """float32 parameters, float64 output (a conv front, then the head's output cast up)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 2)
        self.l = nn.Linear(2 * 3 * 3, 2)

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(self.conv.weight.dtype)
        return self.l(torch.tanh(self.conv(x)).flatten(1)).to(torch.float64)


class _Float64Float32Output(nn.Module):
    """float64 parameters, float32 output."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(3, 4)
        self.l2 = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.tanh(self.l1(x.to(self.l1.weight.dtype)))).to(torch.float32)


class _Float32Linear3d(nn.Module):
    """A float32 Linear on ``(N, T, F)`` inputs, float64 output (the dense-factor path of the Linear rule)."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.l(x.to(self.l.weight.dtype)).to(torch.float64).flatten(1)


class _MixedDtypes(nn.Module):
    """A float32 front inside a float64 model (mixed parameter dtypes); ``seq``: the front on ``(N, 2, F)``."""

    def __init__(self, seq: bool) -> None:
        super().__init__()
        self.f = nn.Linear(3, 4)
        self.h = nn.Linear(4, 2)
        self.seq = seq

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(self.f.weight.dtype)
        if self.seq:
            x = x.unsqueeze(1).expand(-1, 2, -1)
        out = self.h(torch.tanh(self.f(x)).to(self.h.weight.dtype))
        return out.sum(1) if self.seq else out


def _float32(module: nn.Module) -> nn.Module:
    return module.float()


DTYPE_CASES = {
    # name: (build, set the dtypes, input shape)
    "float32-params-float64-output": (_Float32Float64Output, _float32, (1, 4, 4)),
    "float64-params-float32-output": (_Float64Float32Output, lambda m: m.double(), (3,)),
    "float32-linear-3d-float64-output": (_Float32Linear3d, _float32, (2, 3)),
    "mixed-dtypes-2d": (lambda: _MixedDtypes(False), lambda m: (m.float(), m.h.double())[0], (3,)),
    "mixed-dtypes-seq": (lambda: _MixedDtypes(True), lambda m: (m.float(), m.h.double())[0], (3,)),
}
DTYPE_RTOL = 1e-5


@pytest.mark.parametrize("name", sorted(DTYPE_CASES))
def test_non_float64_models(name):
    """Models whose parameters or outputs are not all float64: auto/func/loop agree with a float64 reference (the
    same model in float64) to float32 accuracy, and the kernel has the parameters' dtype."""
    build, set_dtypes, shape = DTYPE_CASES[name]
    torch.manual_seed(0)
    model = set_dtypes(build()).eval()
    reference = copy.deepcopy(model).double()
    dtypes = {q.dtype for q in model.parameters()}
    g = torch.Generator().manual_seed(1)
    x64, xt64 = torch.randn(3, *shape, generator=g, dtype=torch.float64), torch.randn(2, *shape, generator=g,
                                                                                    dtype=torch.float64)
    in_dtype = torch.float64 if dtypes == {torch.float64} else torch.float32
    x, xt = x64.to(in_dtype), xt64.to(in_dtype)
    names = P.selected_names(model, None)
    j1 = P.reference_jacobian(P.model_fn(reference), reference, x.double(), names).double()
    j2 = P.reference_jacobian(P.model_fn(reference), reference, xt.double(), names).double()
    ref = P.kernel_from_jacobians(j1, j2, "full")
    ref_xx = P.kernel_from_jacobians(j1, j1, "full")
    got_dtypes = set()
    for impl in ("auto", "func", "loop"):
        for output, with_xt, chunk in (("full", True, None), ("trace", False, 2)):
            what = f"{name}: {impl} output={output} xt={'yes' if with_xt else 'None'}"
            args = (model, x, xt) if with_xt else (model, x)
            got, records = run(interference.ntk, *args, output=output, chunk_size=chunk, implementation=impl)
            want = reduce(ref if with_xt else ref_xx, output)
            assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
            ok, rel = P.close(got.double(), want, DTYPE_RTOL)
            assert ok, f"{what}: relative error {rel:.2e} > {DTYPE_RTOL:g}"
            assert not vmap_warnings(records) and not per_sample_warnings(records), what
            got_dtypes.add(got.dtype)
    assert len(got_dtypes) == 1, f"{name}: kernel dtypes differ between implementations: {got_dtypes}"
    (kdtype,) = got_dtypes
    if len(dtypes) == 1:
        assert kdtype in dtypes, f"{name}: kernel dtype {kdtype}, parameters {dtypes}"
    else:  # mixed: the selected parameters' dtypes promoted
        want = functools.reduce(torch.promote_types, dtypes)
        assert kdtype == want, f"{name}: kernel dtype {kdtype}, parameters {dtypes}"
    g_ref = P.reference_loss_grads(reference, P.default_loss, x.double(), names).double()
    for impl in ("auto", "func", "loop"):
        got, _ = run(interference.gradient_covariance, model, P.default_loss, x, normalize=False,
                     implementation=impl)
        ok, rel = P.close(got.double(), g_ref @ g_ref.T, DTYPE_RTOL)
        assert ok, f"{name}: gradient_covariance({impl}) relative error {rel:.2e}"


# ----------------------------------------------------------------------------------------------- sweep
@pytest.mark.sweep
@pytest.mark.parametrize("sizes", [(1, 1), (1, 4), (4, 3), (2, 2)], ids=lambda s: f"n{s[0]}m{s[1]}")
@pytest.mark.parametrize("seed", [3, 11])
@pytest.mark.parametrize("name", NAMES)
def test_sweep(name, seed, sizes):
    """More sizes and seeds (deselected by default; run with ``pytest -m sweep``)."""
    p = P.PATTERNS[name]
    n, m = sizes
    model = P.build_model(p, seed=seed)
    x, xt = P.make_inputs(p, n, 100 + seed), P.make_inputs(p, m, 200 + seed)
    kw = params_kw(p)
    if p.refuses is not None:
        check_refusal(p, model, snapshot(model), f"auto n={n} m={m} seed={seed}", interference.ntk, model, x, xt,
                      **kw)
        return
    reference = P.build_model(p, seed=seed, reference=True)
    names = P.selected_names(reference, p.params)
    ref = P.reference_ntk(reference, x, xt, names)
    for output, chunk, impl in (("full", None, "auto"), ("trace", 1, "auto"), ("diagonal", 3, "auto"),
                                ("full", None, "loop")):
        got, _ = run(interference.ntk, model, x, xt, output=output, chunk_size=chunk, implementation=impl, **kw)
        assert_close(got, reduce(ref, output), f"{impl} n={n} m={m} seed={seed} output={output} chunk={chunk}")
    if p.loss is not None and n > 1:
        g = P.reference_loss_grads(reference, p.loss, x, names)
        got, _ = run(interference.gradient_covariance, model, p.loss, x, normalize=False, **kw)
        assert_close(got, g @ g.T, "gradient_covariance(auto, normalize=False)")


def test_docs_path_tables_are_current():
    """docs/core/paths.md's path table and docs/ntk-paths.md are what ``python tests/make_path_table.py --write`` makes."""
    import make_path_table as T

    assert f"{T.START}\n{T.excerpt()}\n{T.END}" in T.PATHS.read_text(), "run: python tests/make_path_table.py --write"
    assert T.DOC.read_text() == T.doc_page(), "run: python tests/make_path_table.py --write"
