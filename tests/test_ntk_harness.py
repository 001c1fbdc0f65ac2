"""Differential harness: ``interference.ntk`` (and gradient_covariance / per_sample_grads / explain) against an
independent per-sample autograd reference on every pattern of :mod:`ntk_patterns`.

For each pattern and implementation the result equals the reference to 1e-10 (relative, max norm) or the call
raises its documented error: ``layerwise`` a ValueError "does not cover" when a selected parameter is not on a rule;
``func`` a RuntimeError naming vmap when ``torch.func.vmap`` cannot run the model. ``auto`` and ``loop`` never raise.
The reference is computed once per pattern (cached); ``auto`` gets every combination (outputs, x != xt, xt=None,
chunked and unchunked), the other implementations a few.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

import interference
import ntk_patterns as P

NAMES = sorted(P.PATTERNS)
RTOL = 1e-10


# ----------------------------------------------------------------------------------------------- helpers
@dataclass
class Case:
    """A pattern's inputs and reference results (computed once)."""

    p: P.Pattern
    x: P.Batch
    xt: P.Batch
    names: list[str]
    k_xxt: Tensor  # full (N, M, O, O)
    k_xx: Tensor  # full (N, N, O, O)
    loss_grads: Tensor | None  # (N, P) per-sample loss gradients on x


@functools.lru_cache(maxsize=None)
def case(name: str) -> Case:
    p = P.PATTERNS[name]
    model = P.build_model(p)
    x, xt = P.make_inputs(p, p.n, 1), P.make_inputs(p, p.m, 2)
    names = P.selected_names(model, p.params)
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
        "hooks": {k: (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks),
                      len(m._backward_pre_hooks)) for k, m in model.named_modules()},
        "training": {k: m.training for k, m in model.named_modules()},
    }


def assert_unchanged(before: dict, model: nn.Module) -> None:
    after = snapshot(model)
    assert after["requires_grad"] == before["requires_grad"], "requires_grad flags changed"
    assert after["hooks"] == before["hooks"], "hooks were left on the model"
    assert after["training"] == before["training"], "train/eval mode changed"
    assert before["state"].keys() == after["state"].keys()
    for k, v in before["state"].items():
        assert torch.equal(v, after["state"][k]), f"{k} changed"


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


def check_error(err: Exception, impl: str, name: str) -> None:
    if impl == "layerwise":
        assert isinstance(err, ValueError) and "does not cover" in str(err), f"{name}: layerwise raised {err!r}"
    elif impl == "func":
        assert isinstance(err, RuntimeError) and "vmap" in str(err), f"{name}: func raised {err!r}"
        assert "loop" in str(err), f"{name}: func's error should suggest implementation='loop': {err}"
    else:
        raise AssertionError(f"{name}: implementation={impl!r} must not raise, got {type(err).__name__}: {err}")


def max_fallback_warnings(p: P.Pattern) -> int:
    """``auto`` may warn once when it falls back from vmap to the loop, and only then."""
    return 0 if func_refuses(p) is False else 1


def exact_paths(p: P.Pattern) -> set[str]:
    """The exact path ``explain(auto)`` may name for parameters not on a rule."""
    return {True: {"loop"}, False: {"func"}, None: {"func", "loop"}}[func_refuses(p)]


def expected_rules(name: str, loss: bool = False) -> tuple[set[str], set[str]]:
    c = case(name)
    return P.expected_rule(c.p, P.build_model(c.p), c.names, loss=loss)


# ----------------------------------------------------------------------------------------------- the registry
def test_registry_is_broad_and_tiny():
    assert len(P.PATTERNS) >= 60
    tags = {t for p in P.PATTERNS.values() for t in p.tags}
    for needed in ("tying", "parametrization", "time-major", "vmap", "mixing", "hooks", "subclass", "conv",
                   "elephant", "embedding", "pytree", "params", "attention", "recurrent", "output", "buffers"):
        assert needed in tags, needed
    for p in P.PATTERNS.values():
        assert p.n <= 4 and p.m <= 4
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
    pattern's vmap_fails flag is what torch.func actually does."""
    c = case(name)
    model = P.build_model(c.p)
    assert c.k_xxt.abs().max() > 0, "reference kernel is zero: the pattern tests nothing"
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
            torch.func.vmap(torch.func.jacrev(single), in_dims=(None, 0))(params, c.x)
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
    kw = {"params": list(c.p.params)} if c.p.params is not None else {}
    combos = [("full", True, None), ("diagonal", True, None), ("trace", True, None),
              ("full", True, 2), ("trace", True, 1), ("diagonal", True, 2),
              ("full", False, None), ("trace", False, 2), ("diagonal", False, 1)]
    for output, with_xt, chunk in combos:
        what = f"auto output={output} xt={'yes' if with_xt else 'None'} chunk_size={chunk}"
        args = (model, c.x, c.xt) if with_xt else (model, c.x)
        got, records = run(interference.ntk, *args, output=output, chunk_size=chunk, **kw)
        assert_close(got, reduce(c.k_xxt if with_xt else c.k_xx, output), what)
        falls = vmap_warnings(records)
        assert len(falls) <= max_fallback_warnings(c.p), f"{what}: warnings {falls}"
    assert_unchanged(before, model)


@pytest.mark.parametrize("impl", ["func", "loop", "layerwise"])
@pytest.mark.parametrize("name", NAMES)
def test_other_implementations(name, impl):
    c = case(name)
    model = P.build_model(c.p)
    before = snapshot(model)
    must, maybe = expected_rules(name)
    want_error = expect_raise(c.p, impl, must, maybe, c.names)
    kw = {"params": list(c.p.params)} if c.p.params is not None else {}
    for output, with_xt, chunk in (("full", True, None), ("trace", False, 2)):
        what = f"{impl} output={output} xt={'yes' if with_xt else 'None'} chunk_size={chunk}"
        args = (model, c.x, c.xt) if with_xt else (model, c.x)
        try:
            got, records = run(interference.ntk, *args, output=output, chunk_size=chunk, implementation=impl, **kw)
        except Exception as err:  # noqa: BLE001
            assert want_error is not False, f"{what} raised {type(err).__name__}: {err}"
            check_error(err, impl, what)
            continue
        assert want_error is not True, f"{what} should raise its documented error, returned a kernel"
        assert_close(got, reduce(c.k_xxt if with_xt else c.k_xx, output), what)
        assert not vmap_warnings(records), f"{what}: {vmap_warnings(records)}"
    assert_unchanged(before, model)


@pytest.mark.parametrize("name", NAMES)
def test_identical_samples(name):
    """Every sample the same (no pair to compare in the dry runs): still exact."""
    c = case(name)
    model = P.build_model(c.p)
    one = P.take(c.x, 0)
    x = P.tree_map(lambda t: t.expand(2, *t.shape[1:]).contiguous(), one)
    kw = {"params": list(c.p.params)} if c.p.params is not None else {}
    got, _ = run(interference.ntk, model, x, output="full", **kw)
    k1 = c.k_xx[:1, :1]
    assert_close(got, k1.expand(2, 2, *k1.shape[2:]), "auto, identical samples")


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
    must, maybe = expected_rules(name)
    kw = {"params": list(c.p.params)} if c.p.params is not None else {}
    plan, _ = run(interference.explain, model, c.x, c.xt, **kw)
    check_paths(plan, model, c.names, must, maybe, exact_paths(c.p), "explain(auto)")
    assert str(plan)
    plan, _ = run(interference.explain, model, c.x, implementation="loop", **kw)
    check_paths(plan, model, c.names, set(), set(), {"loop"}, "explain(loop)")
    plan, _ = run(interference.explain, model, c.x, implementation="func", **kw)
    check_paths(plan, model, c.names, set(), set(), {"func"}, "explain(func)")


# ----------------------------------------------------------------------------------------------- gradcov
LOSS_NAMES = [k for k in NAMES if P.PATTERNS[k].loss is not None]


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_gradient_covariance(name):
    c = case(name)
    model = P.build_model(c.p)
    before = snapshot(model)
    kw = {"params": list(c.p.params)} if c.p.params is not None else {}
    g = c.loss_grads
    gram = g @ g.T
    norm = g.norm(dim=1)
    assert (norm > 0).all(), "a sample has a zero loss gradient: pick another loss or input"
    cov = gram / norm[:, None] / norm[None, :]
    got, records = run(interference.gradient_covariance, model, c.p.loss, c.x, normalize=False, **kw)
    assert_close(got, gram, "gradient_covariance(auto, normalize=False)")
    assert len(vmap_warnings(records)) <= max_fallback_warnings(c.p)
    got, _ = run(interference.gradient_covariance, model, c.p.loss, c.x, **kw)
    assert_close(got, cov, "gradient_covariance(auto)")
    must, maybe = expected_rules(name, loss=True)
    plan, _ = run(interference.explain, model, c.x, loss_fn=c.p.loss, **kw)
    check_paths(plan, model, c.names, must, maybe, exact_paths(c.p), "explain(auto, loss_fn)")
    for impl in ("func", "loop"):
        try:
            got, _ = run(interference.gradient_covariance, model, c.p.loss, c.x, normalize=False,
                         implementation=impl, **kw)
        except Exception as err:  # noqa: BLE001
            assert impl == "func" and func_refuses(c.p) is not False, f"gradient_covariance({impl}) raised {err!r}"
            check_error(err, impl, f"gradient_covariance({impl})")
            continue
        assert not (impl == "func" and func_refuses(c.p)), f"gradient_covariance(func) should raise on {name}"
        assert_close(got, gram, f"gradient_covariance({impl}, normalize=False)")
    assert_unchanged(before, model)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_per_sample_grads(name):
    c = case(name)
    model = P.build_model(c.p)
    kw = {"params": list(c.p.params)} if c.p.params is not None else {}
    ref = P.split_grads(model, c.loss_grads, c.names)
    for impl in ("auto", "func", "loop"):
        try:
            got, records = run(interference.per_sample_grads, model, c.p.loss, c.x, implementation=impl, **kw)
        except Exception as err:  # noqa: BLE001
            assert impl == "func" and func_refuses(c.p) is not False, f"per_sample_grads({impl}) raised {err!r}"
            check_error(err, impl, f"per_sample_grads({impl})")
            continue
        assert not (impl == "func" and func_refuses(c.p)), f"per_sample_grads(func) should raise on {name}"
        assert set(got) == set(c.names), f"per_sample_grads({impl}) keys {sorted(got)}"
        for k in c.names:
            assert_close(got[k], ref[k], f"per_sample_grads({impl})[{k}]")
        if impl == "auto":
            assert len(vmap_warnings(records)) <= max_fallback_warnings(c.p)


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
    names = P.selected_names(model, p.params)
    kw = {"params": list(p.params)} if p.params is not None else {}
    ref = P.reference_ntk(model, x, xt, names)
    for output, chunk, impl in (("full", None, "auto"), ("trace", 1, "auto"), ("diagonal", 3, "auto"),
                                ("full", None, "loop")):
        got, _ = run(interference.ntk, model, x, xt, output=output, chunk_size=chunk, implementation=impl, **kw)
        assert_close(got, reduce(ref, output), f"{impl} n={n} m={m} seed={seed} output={output} chunk={chunk}")
    if p.loss is not None and n > 1:
        g = P.reference_loss_grads(model, p.loss, x, names)
        got, _ = run(interference.gradient_covariance, model, p.loss, x, normalize=False, **kw)
        assert_close(got, g @ g.T, "gradient_covariance(auto, normalize=False)")


def test_readme_and_docs_path_tables_are_current():
    """The README's path table and docs/ntk-paths.md are what ``python tests/make_path_table.py --write`` makes."""
    import make_path_table as T

    assert f"{T.START}\n{T.readme_excerpt()}\n{T.END}" in T.README.read_text(), "run: python tests/make_path_table.py --write"
    assert T.DOC.read_text() == T.doc_page(), "run: python tests/make_path_table.py --write"
