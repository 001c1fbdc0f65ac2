import itertools
import math

import pytest
import torch

from interference import FTA, LWTA, Elephant, Maxout, activation_names, elephant, make_activation
from interference.activations import _elephant_rule


def literal(x, h, a, d):
    return h / (1 + (x / a).abs().pow(d))


@pytest.mark.parametrize("implementation", ["fused", "autograd"])
@pytest.mark.parametrize("d", [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 2.5])
def test_elephant_matches_literal_float64(d, implementation):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 7, generator=g, dtype=torch.float64) * 2
    h = torch.rand(7, generator=g, dtype=torch.float64) + 0.5
    a = torch.rand(7, generator=g, dtype=torch.float64) + 0.1
    vars1 = [t.clone().requires_grad_() for t in (x, h, a)]
    vars2 = [t.clone().requires_grad_() for t in (x, h, a)]
    y1, y2 = elephant(*vars1, d=d, implementation=implementation), literal(*vars2, d)
    assert torch.allclose(y1, y2, rtol=1e-13, atol=1e-15)
    w = torch.randn(y1.shape, generator=g, dtype=torch.float64)
    g1 = torch.autograd.grad((y1 * w).sum(), vars1)
    g2 = torch.autograd.grad((y2 * w).sum(), vars2)
    for a1, a2 in zip(g1, g2):
        assert torch.allclose(a1, a2, rtol=1e-12, atol=1e-14)
    with torch.no_grad():  # inference computes the power in place
        assert torch.allclose(elephant(x, h, a, d, implementation=implementation), y2, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("implementation", ["fused", "autograd"])
@pytest.mark.parametrize("d", [2.0, 3.0, 4.0, 8.0, 2.5])
def test_elephant_gradcheck_x_h_a(d, implementation):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(5, 3, generator=g, dtype=torch.float64) + 0.1).requires_grad_()
    h = (torch.rand(3, generator=g, dtype=torch.float64) + 0.5).requires_grad_()
    a = (torch.rand(3, generator=g, dtype=torch.float64) + 0.3).requires_grad_()
    f = lambda x, h, a: elephant(x, h, a, d, implementation=implementation)
    assert torch.autograd.gradcheck(f, (x, h, a))
    assert torch.autograd.gradgradcheck(f, (x, h, a))


@pytest.mark.parametrize("d", [1.0, 3.0, 4.0, 6.0, 8.0, 2.5])
def test_elephant_module_gradients_match_literal_float64(d):
    """The module's path (the fused function on log h and log a) against autograd through the literal formula."""
    g = torch.Generator().manual_seed(2)
    e = Elephant(d=d, num_units=7).double()
    with torch.no_grad():
        e.log_h.copy_(torch.randn(7, generator=g, dtype=torch.float64) * 0.3)
        e.log_a.copy_(torch.randn(7, generator=g, dtype=torch.float64) * 0.3 - 1.0)
    x = (torch.randn(3, 64, 7, generator=g, dtype=torch.float64) * 2).requires_grad_()
    w = torch.randn(3, 64, 7, generator=g, dtype=torch.float64)
    log_h, log_a = (p.detach().clone().requires_grad_() for p in (e.log_h, e.log_a))
    x2 = x.detach().clone().requires_grad_()
    y, ref = e(x), literal(x2, log_h.exp(), log_a.exp(), d)
    assert type(y.grad_fn).__name__ == "_ElephantFunctionBackward"
    assert torch.allclose(y, ref, rtol=1e-13, atol=1e-15)
    ours = torch.autograd.grad((y * w).sum(), (x, e.log_h, e.log_a))
    theirs = torch.autograd.grad((ref * w).sum(), (x2, log_h, log_a))
    for a1, a2 in zip(ours, theirs):
        assert torch.allclose(a1, a2, rtol=1e-11, atol=1e-13)
    with torch.no_grad():
        assert torch.allclose(e(x), ref, rtol=1e-13, atol=1e-15)
    small = Elephant(d=d, num_units=3).double()
    xs = (torch.randn(4, 3, generator=g, dtype=torch.float64) + 0.1).requires_grad_()
    f = lambda v, lh, la: torch.func.functional_call(small, {"log_h": lh, "log_a": la}, (v,))
    args = (xs, small.log_h.detach().clone().requires_grad_(), small.log_a.detach().clone().requires_grad_())
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)


def test_elephant_module_parameters_and_freezing():
    e = Elephant(d=4, h=2.0, a=0.3, num_units=5)
    assert {n for n, _ in e.named_parameters()} == {"log_h", "log_a"}
    assert torch.allclose(e.h, torch.full((5,), 2.0)) and torch.allclose(e.a, torch.full((5,), 0.3))
    frozen = Elephant(num_units=5, learnable=False)
    assert list(frozen.parameters()) == [] and {n for n, _ in frozen.named_buffers()} == {"log_h", "log_a"}
    x = torch.randn(4, 5, dtype=torch.float64)
    assert torch.allclose(e.double()(x), literal(x, 2.0, 0.3, 4.0))
    with pytest.raises(ValueError, match="last input dimension 5"):
        e(torch.randn(2, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="a must be a positive"):
        Elephant(a=0.0)


@pytest.mark.parametrize("rows", [4, 40000])
def test_elephant_under_torch_func(rows):
    e = Elephant(d=8, num_units=3).double()
    x = torch.randn(rows, 3, dtype=torch.float64)
    jac = torch.func.vmap(torch.func.jacrev(lambda v: e(v)))(x)
    diag = torch.func.vmap(torch.func.grad(lambda v: e(v).sum()))(x)
    assert torch.allclose(jac.diagonal(dim1=-2, dim2=-1), diag)


def test_maxout_lwta_fta():
    x = torch.tensor([[1.0, 3.0, 2.0, -1.0, -5.0, 0.0]])
    assert Maxout(3)(x).tolist() == [[3.0, 0.0]]
    assert LWTA(3)(x).tolist() == [[0.0, 3.0, 0.0, 0.0, 0.0, 0.0]]
    fta = FTA(k=4, bound=2.0)  # tiles start at -2, -1, 0, 1 with width 1 and fuzziness 1
    out = fta(torch.tensor([[0.5]]))
    assert out.shape == (1, 4)
    assert torch.allclose(out, torch.tensor([[0.0, 0.5, 1.0, 0.5]]))


def test_registry_and_errors():
    assert set(activation_names()) >= {"relu", "tanh", "sigmoid", "elu", "elephant", "maxout", "lwta", "fta"}
    assert isinstance(make_activation("ELEPHANT", d=8), Elephant)
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        make_activation("swish")
    with pytest.raises(ValueError, match="does not take k; it takes no arguments"):
        make_activation("relu", k=3)
    with pytest.raises(ValueError, match="bound must be a positive"):
        make_activation("fta", bound=0)
    with pytest.raises(ValueError, match="not divisible by k"):
        make_activation("maxout", k=4)(torch.zeros(2, 10))
    with pytest.raises(ValueError, match="k must be a positive int"):
        make_activation("lwta", k=0)
    with pytest.raises(ValueError, match="implementation must be"):
        elephant(torch.zeros(2), implementation="cuda")


@pytest.mark.parametrize("implementation", ["fused", "autograd"])
def test_elephant_second_derivatives_under_torch_func(implementation):
    x = torch.linspace(-1, 1, 7, dtype=torch.float64)
    h, a = torch.tensor(1.3, dtype=torch.float64), torch.tensor(0.4, dtype=torch.float64)
    hessian = lambda f: torch.func.jacrev(torch.func.jacrev(f))
    ours = hessian(lambda v: elephant(v, h, a, 4.0, implementation=implementation).sum())(x)
    ref = hessian(lambda v: literal(v, h, a, 4.0).sum())(x)
    assert torch.allclose(ours, ref, rtol=1e-10, atol=1e-12)


def test_fused_elephant_with_full_shape_h_and_a():
    """h and a of the same shape as x (no reduction in the backward) must not alias the input gradient."""
    g = torch.Generator().manual_seed(3)
    x, h, a = (torch.rand(6, generator=g, dtype=torch.float64) + 0.2 for _ in range(3))
    args = [t.clone().requires_grad_() for t in (x, h, a)]
    assert torch.autograd.gradcheck(lambda x, h, a: elephant(x, h, a, 4.0, implementation="fused"), args)


@pytest.mark.parametrize("h_shape", [(1, 3), (4, 3)])
def test_fused_elephant_with_h_wider_than_x(h_shape):
    """``h`` may broadcast the output to more dimensions than ``x / a`` has: values and gradients still match."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, generator=g, dtype=torch.float64).requires_grad_()
    h = (torch.rand(h_shape, generator=g, dtype=torch.float64) + 0.5).requires_grad_()
    a = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    assert torch.allclose(elephant(x, h, a, 4.0, implementation="fused"), literal(x, h, a, 4.0))
    assert torch.autograd.gradcheck(lambda x, h, a: elephant(x, h, a, 4.0, implementation="fused"), (x, h, a))


def test_elephant_output_can_be_modified_in_place():
    """The fused function does not save its output, so in-place ops after it (ReLU(inplace=True), add_) work."""
    e = Elephant(num_units=3).double()
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    e(x).add_(1.0).sum().backward()
    ref = torch.autograd.grad(literal(x, e.h, e.a, 4.0).sum(), x)[0]
    assert torch.allclose(x.grad, ref)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # torch's forward AD
def test_elephant_forward_mode_ad_matches_literal_jvp():
    import torch.autograd.forward_ad as fwad

    g = torch.Generator().manual_seed(5)
    x = torch.randn(5, 3, generator=g, dtype=torch.float64)
    h = torch.rand(3, generator=g, dtype=torch.float64) + 0.5
    a = torch.rand(3, generator=g, dtype=torch.float64) + 0.2
    e = Elephant(d=4, num_units=3).double()
    log_h, log_a = e.log_h.detach(), e.log_a.detach()
    tangents = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in (x, h, a)]
    ref_fn = torch.func.jvp(lambda *v: literal(*v, 4.0), (x, h, a), tuple(tangents))[1]
    ref_mod = torch.func.jvp(lambda v, lh, la: literal(v, lh.exp(), la.exp(), 4.0), (x, log_h, log_a),
                             tuple(tangents))[1]
    module = lambda v, lh, la: torch.func.functional_call(e, {"log_h": lh, "log_a": la}, (v,))
    with fwad.dual_level():
        duals = [fwad.make_dual(t, dt) for t, dt in zip((x, h, a), tangents)]
        got_fn = fwad.unpack_dual(elephant(*duals, 4.0, implementation="fused")).tangent
        duals = [fwad.make_dual(t, dt) for t, dt in zip((x, log_h, log_a), tangents)]
        got_mod = fwad.unpack_dual(module(*duals)).tangent
    assert torch.allclose(got_fn, ref_fn, rtol=1e-12, atol=1e-14)
    assert torch.allclose(got_mod, ref_mod, rtol=1e-12, atol=1e-14)


# ----------------------------------------------------------------------------------- numerical safety
_HALF = (torch.float16, torch.bfloat16)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_XS = [0.0, 1e-30, 1e-6, 0.1, 0.2, 0.5, 1.0, 2.0, 10.0, 100.0, 1e3, 1e4]
_XS = _XS + [-v for v in _XS[1:]]
_HA = [(1.0, 0.2), (3.0, 1.0), (0.5, 0.05)]  # (h, a): |u| = |x / a| up to 2e5


def _reference(x, h, a, d):
    """(y, dy/dx, dy/dh, dy/da) at float64 points, in 40-digit mpmath: the closed forms, rounded once to float64."""
    import mpmath

    rows = []
    with mpmath.workdps(40):
        for xv, hv, av in zip(*(t.double().tolist() for t in (x, h, a))):
            xv, hv, av = mpmath.mpf(xv), mpmath.mpf(hv), mpmath.mpf(av)
            u = xv / av
            p, q = abs(u) ** d, abs(u) ** (d - 1) if d != 1 else mpmath.mpf(1)
            s = 1 / (1 + p)
            rows.append([float(v) for v in (hv * s, -(d / av) * hv * mpmath.sign(u) * q * s * s, s,
                                            (d / av) * hv * p * s * s)])
    return torch.tensor(rows, dtype=torch.float64).T


def _tolerance(dtype, d):
    """``|got - ref| <= rtol |ref| + atol * scale``. Half types are computed in float32 and rounded once, so
    ``rtol = eps`` (one ulp; measured <= 0.5 ulp). float32 and float64 compute natively: rounding ``u = x/a`` and
    the powers is amplified by the condition number of ``|u|^d`` (up to ``d``), so ``rtol = 4 d eps`` (measured
    <= 2 d eps). ``atol`` is the dtype's smallest normal, times the quantity's scale (``h`` for y, ``h d / a`` for
    dy/dx and dy/da, 1 for dy/dh): below it lie subnormals, and an ``|u|^d`` that overflows float32 flushes
    ``s < 1 / max`` to 0."""
    fi = torch.finfo(dtype)
    return (fi.eps if dtype in _HALF else 4 * d * fi.eps), fi.tiny


def _assert_close(got, ref, rtol, atol, what):
    got = got.double()
    assert torch.isfinite(got).all(), f"{what}: not finite: {got}"
    bad = (got - ref).abs() > rtol * ref.abs() + atol
    assert not bad.any(), f"{what}: got {got[bad].tolist()}, want {ref[bad].tolist()}"


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_elephant_values_and_gradients_are_finite_and_accurate(dtype):
    """Every dtype, d = 1..16, |x| from 0 to 1e4: the functional (fused, autograd and no-grad) and the module
    against 40-digit references; the issue's NaNs were float32 d=16 x=100 and float16 d=4 x=10."""
    for d, (h0, a0) in itertools.product(range(1, 17), _HA):
        rtol, tiny = _tolerance(dtype, d)
        x = torch.tensor(_XS, dtype=dtype)
        h, a = torch.full_like(x, h0), torch.full_like(x, a0)
        y_ref, dx_ref, dh_ref, da_ref = _reference(x, h, a, d)
        scales = (h0, h0 * d / a0, 1.0, h0 * d / a0)
        for implementation in ("fused", "autograd"):
            args = [t.clone().requires_grad_() for t in (x, h, a)]
            y = elephant(*args, d, implementation=implementation)
            assert y.dtype == dtype
            grads = torch.autograd.grad(y.sum(), args)
            for what, got, ref, scale in zip(("y", "dx", "dh", "da"), (y.detach(), *grads),
                                             (y_ref, dx_ref, dh_ref, da_ref), scales):
                _assert_close(got, ref, rtol, tiny * scale, f"{dtype} d={d} h={h0} a={a0} {implementation} {what}")
        with torch.no_grad():
            _assert_close(elephant(x, h, a, d), y_ref, rtol, tiny * h0, f"{dtype} d={d} no-grad y")
        # the module: log h and log a stored in dtype, one unit per point
        e = Elephant(d=d, num_units=len(_XS)).to(dtype)
        with torch.no_grad():
            e.log_h.fill_(math.log(h0))
            e.log_a.fill_(math.log(a0))
        hm, am = e.log_h.detach().double().exp(), e.log_a.detach().double().exp()
        y_ref, dx_ref, dh_ref, da_ref = _reference(x, hm, am, d)
        xm = x.unsqueeze(0).requires_grad_()
        y = e(xm)
        grads = torch.autograd.grad(y.sum(), (xm, e.log_h, e.log_a))
        for what, got, ref, scale in zip(("y", "dx", "dlog_h", "dlog_a"), (y.detach()[0], grads[0][0], *grads[1:]),
                                         (y_ref, dx_ref, dh_ref * hm, da_ref * am), (h0, h0 * d / a0, h0, h0 * d)):
            _assert_close(got, ref, rtol, tiny * scale, f"{dtype} d={d} h={h0} a={a0} module {what}")
        with torch.no_grad():
            _assert_close(e(x.unsqueeze(0))[0], _reference(x, hm, am, d)[0], rtol, tiny * h0, f"{dtype} module no-grad")


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_elephant_under_torch_func_is_finite_and_matches_fused(dtype):
    """vmap(jacrev) (the plain-ops formula) at the extreme points: finite, and equal to the fused gradients."""
    x = torch.tensor(_XS, dtype=dtype)
    for d in range(1, 17):
        rtol, tiny = _tolerance(dtype, d)
        e = Elephant(d=d, a=0.2).to(dtype)
        lh, la = e.log_h.detach().expand(x.shape), e.log_a.detach().expand(x.shape)
        f = lambda v, p, q: torch.func.functional_call(e, {"log_h": p, "log_a": q}, (v,))
        jac = torch.func.vmap(torch.func.jacrev(f, argnums=(0, 1, 2)))(x, lh, la)
        args = [t.clone().requires_grad_() for t in (x, lh, la)]
        fused = torch.autograd.grad(f(*args).sum(), args)
        assert type(f(*args).grad_fn).__name__ in ("_ElephantFunctionBackward", "ToCopyBackward0")
        for what, got, want, scale in zip(("dx", "dlog_h", "dlog_a"), jac, fused, (d / 0.2, 1.0, d)):
            _assert_close(got, want.double(), 2 * rtol, 2 * tiny * scale, f"{dtype} d={d} torch.func {what}")


@pytest.mark.parametrize("d", [1.0, 2.0, 3.0, 4.0, 5.0, 8.0, 12.0, 16.0, 2.5])
def test_elephant_gradcheck_and_gradgradcheck_at_extremes(d):
    """float64 first and second derivatives, also where |x/a|^d is ~1e80 (fused, autograd, module)."""
    x = torch.tensor([1e-3, -0.1, 0.2, -0.3, 2.0, -10.0, 100.0, -1e4], dtype=torch.float64, requires_grad=True)
    h = torch.full_like(x, 1.5).requires_grad_()
    a = torch.full_like(x, 0.2).requires_grad_()
    for implementation in ("fused", "autograd"):
        f = lambda x, h, a: elephant(x, h, a, d, implementation=implementation)
        assert torch.autograd.gradcheck(f, (x, h, a))
        assert torch.autograd.gradgradcheck(f, (x, h, a))
    e = Elephant(d=d, num_units=len(x)).double()
    f = lambda v, lh, la: torch.func.functional_call(e, {"log_h": lh, "log_a": la}, (v,))
    args = (x, e.log_h.detach().clone().requires_grad_(), e.log_a.detach().clone().requires_grad_())
    assert torch.autograd.gradcheck(f, args)
    assert torch.autograd.gradgradcheck(f, args)


def test_elephant_issue_examples_are_finite():
    for dtype, d, x in ((torch.float32, 16, 100.0), (torch.float16, 4, 10.0)):
        v = torch.tensor([x, -x], dtype=dtype, requires_grad=True)
        e = Elephant(d=d, num_units=2).to(dtype)
        e(v).sum().backward()
        for t in (v.grad, e.log_h.grad, e.log_a.grad):
            assert torch.isfinite(t).all() and t.abs().max() < 1e-6  # nan before; the true values are ~1e-7 or less


def test_elephant_rejects_bools():
    for name in ("d", "h", "a", "num_units"):
        with pytest.raises(ValueError, match=f"Elephant: {name} must be"):
            Elephant(**{name: True})
    with pytest.raises(ValueError, match="d must be a number"):
        elephant(torch.zeros(2), d=True)


@pytest.mark.parametrize("num_units", [None, 3])
def test_elephant_ntk_rule_matches_autograd(num_units):
    """The registered rule: per-sample gradients of every output w.r.t. log h and log a, summed over positions."""
    from interference.rules import rule_for

    assert rule_for(Elephant()).fn is _elephant_rule and rule_for(Elephant()).params == {"log_h", "log_a"}
    g = torch.Generator().manual_seed(6)
    e = Elephant(d=16, num_units=num_units).double()
    with torch.no_grad():
        e.log_h.add_(torch.randn(e.log_h.shape, generator=g, dtype=torch.float64) * 0.3)
        e.log_a.add_(torch.randn(e.log_a.shape, generator=g, dtype=torch.float64) * 0.3)
    inp = torch.randn(4, 5, 3, generator=g, dtype=torch.float64)
    inp[0, 0] = torch.tensor([0.0, 100.0, -1e4])  # overflowing powers: the old rule's inf * 0
    gout = torch.randn(2, 4, 5, 3, generator=g, dtype=torch.float64)
    factors = _elephant_rule(e, inp, gout, frozenset({"log_h", "log_a"}))
    p = 1 if num_units is None else 3
    for factor, param in zip(factors, (e.log_h, e.log_a)):
        assert factor.g.shape == (2, 4, p) and torch.isfinite(factor.g).all()
        want = torch.stack([torch.stack([torch.autograd.grad((e(inp[i]) * gout[o, i]).sum(), param)[0].reshape(p)
                                         for i in range(4)]) for o in range(2)])
        assert torch.allclose(factor.g, want, rtol=1e-12, atol=1e-300)
    only_a = _elephant_rule(e, inp, gout, frozenset({"log_a"}))
    assert len(only_a) == 1 and torch.equal(only_a[0].g, factors[1].g)
    for dtype in (torch.float32, torch.float16):  # finite where the old rule gave nan
        out = _elephant_rule(e.to(dtype), inp.to(dtype), gout.to(dtype), frozenset({"log_h", "log_a"}))
        assert all(f.g.dtype == dtype and torch.isfinite(f.g).all() for f in out)


def test_activation_specs_declare_the_conventions():
    from interference.activation_spec import activation_spec, activation_types, output_width

    elephant = activation_spec("Elephant")
    assert (elephant.layer_norm, elephant.sigma_bias, elephant.per_unit) == (True, 0.4, True)
    assert elephant.defaults() == {"d": 4.0, "h": 1.0, "a": 0.2, "learnable": True}
    assert elephant.build(7).num_units == 7
    assert (activation_spec("relu").layer_norm, activation_spec("relu").sigma_bias) == (False, None)
    assert output_width(make_activation("maxout", k=4), 12) == 3
    assert output_width(make_activation("fta", k=20), 12) == 240
    with pytest.raises(ValueError, match="not divisible"):
        output_width(make_activation("lwta", k=5), 12)
    assert set(activation_types()) >= {Elephant, Maxout, LWTA, FTA, torch.nn.ReLU, torch.nn.GELU}


def test_activation_spec_registration_is_checked():
    from interference.activation_spec import ActArg, ActivationSpec, register_activation

    with pytest.raises(ValueError, match="registered already"):
        register_activation(ActivationSpec("relu", torch.nn.ReLU))
    with pytest.raises(ValueError, match="lower case"):
        ActivationSpec("ReLU2", torch.nn.ReLU)
    with pytest.raises(ValueError, match="num_units"):
        ActivationSpec("x", torch.nn.ReLU, {"num_units": ActArg(int, "")})
    with pytest.raises(ValueError, match="module_type"):
        ActivationSpec("x", lambda: torch.nn.ReLU())
