"""Property test: random architectures from a small grammar of layers; ``ntk(auto)`` equals the independent
per-sample autograd reference (1e-10 relative) and ``explain``'s rule claims are exactly the layers the grammar
knows to be rule-eligible (plain Linear / zero-padded ungrouped Conv2d / LayerNorm / Elephant, called once on
batch-first rows, no hooks, no tying, nothing mixing samples anywhere).
"""

from __future__ import annotations

import random
import warnings

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor, nn
from torch.nn import functional as F

import interference
import ntk_patterns as P

N, M, T = 3, 2, 2
Elephant = interference.Elephant


# ----------------------------------------------------------------------------------------------- steps
class Fn(nn.Module):
    """A parameter-free step given by name."""

    def __init__(self, op: str, arg: tuple = ()) -> None:
        super().__init__()
        self.op, self.arg = op, arg

    def forward(self, x: Tensor) -> Tensor:
        op = self.op
        if op == "relu":
            return torch.relu(x)
        if op == "tanh":
            return torch.tanh(x)
        if op == "gelu":
            return F.gelu(x)
        if op == "flip":
            return x.flip(0)
        if op == "center":
            return x - x.mean(0)
        if op == "to_seq":
            return x.reshape(x.shape[0], *self.arg)
        if op == "flatten":
            return x.flatten(1)
        if op == "pool":
            return x.mean(1)
        raise ValueError(op)


class Apply(nn.Module):
    def __init__(self, mod: nn.Module) -> None:
        super().__init__()
        self.mod = mod

    def forward(self, x: Tensor) -> Tensor:
        return self.mod(x)


class ResidualStep(nn.Module):
    def __init__(self, f: int) -> None:
        super().__init__()
        self.lin = nn.Linear(f, f)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.lin(torch.tanh(x))


class TimeMajor(nn.Module):
    """A Linear applied to the time-major view ``(T, N, F)`` of a ``(N, T, F)`` sequence, and back."""

    def __init__(self, f: int, g: int) -> None:
        super().__init__()
        self.lin = nn.Linear(f, g)

    def forward(self, x: Tensor) -> Tensor:
        return self.lin(x.transpose(0, 1)).transpose(0, 1)


class Twice(nn.Module):
    def __init__(self, f: int) -> None:
        super().__init__()
        self.lin = nn.Linear(f, f)

    def forward(self, x: Tensor) -> Tensor:
        return self.lin(torch.tanh(self.lin(x)))


class TiedPair(nn.Module):
    def __init__(self, f: int) -> None:
        super().__init__()
        self.a = nn.Linear(f, f)
        self.b = nn.Linear(f, f)
        self.b.weight = self.a.weight

    def forward(self, x: Tensor) -> Tensor:
        return self.b(torch.tanh(self.a(x)))


class UsedOutside(nn.Module):
    """The Linear's weight is also used outside its call."""

    def __init__(self, f: int) -> None:
        super().__init__()
        self.lin = nn.Linear(f, f)

    def forward(self, x: Tensor) -> Tensor:
        return self.lin(x) + 0.1 * x @ self.lin.weight.T


def _scale_hook(mod: nn.Module, args: tuple, out: Tensor) -> Tensor:
    return out * 1.3


# ----------------------------------------------------------------------------------------------- grammar
@st.composite
def architectures(draw: st.DrawFn) -> list[tuple]:
    """A list of steps (plain data); :func:`build` turns it into a module. The choices come from a
    ``random.Random`` seeded by hypothesis, so every layer kind is drawn about as often as its weight says
    (hypothesis' own draws lean hard on boundary values: most architectures would mix samples)."""
    rnd = random.Random(str(draw(st.lists(st.integers(0, 2**32 - 1), min_size=4, max_size=4))))
    kind = rnd.choice(["vec", "seq", "img"])
    steps: list[tuple] = [("start", kind)]
    mixed = False
    ops = {"vec": ["linear", "layernorm", "elephant", "residual", "to_seq", "twice", "tied", "outside", "hook",
                   "act"],
           "seq": ["linear", "layernorm", "elephant", "time_major", "pool", "flatten", "act"],
           "img": ["conv", "conv", "conv", "elephant", "flatten", "act"]}
    for _ in range(rnd.randint(1, 5)):
        if not mixed and rnd.random() < 0.08:
            mixed = True
            steps.append((rnd.choice(["flip", "center"]),))
            continue
        op = rnd.choice(ops[kind])
        if op == "act":
            steps.append(("act", rnd.choice(["relu", "tanh", "gelu"])))
        elif op in ("linear", "time_major"):
            steps.append((op, rnd.randint(2, 5)))
        elif op == "elephant":
            steps.append((op, rnd.random() < 0.5, rnd.random() < 0.8))  # per-unit, learnable
        elif op == "conv":
            steps.append((op, rnd.randint(1, 3), rnd.randint(1, 3), rnd.randint(1, 2), rnd.randint(0, 1),
                          rnd.randint(1, 2), rnd.random() < 0.3, rnd.choice(["zeros", "zeros", "reflect"])))
        else:
            steps.append((op,))
        if op == "to_seq":
            kind = "seq"
        elif op in ("pool", "flatten"):
            kind = "vec"
    steps.append(("head", rnd.randint(1, 3)))
    return steps


def build(steps: list[tuple], seed: int) -> tuple[nn.Module, tuple[int, ...], set[str], bool]:
    """The model, one sample's input shape, the names of the parameters a rule must claim, and whether the model
    mixes samples."""
    with P._float64():
        return _build(steps, seed)


def _build(steps: list[tuple], seed: int) -> tuple[nn.Module, tuple[int, ...], set[str], bool]:
    torch.manual_seed(seed)
    kind = steps[0][1]
    shape = {"vec": (4,), "seq": (T, 3), "img": (2, 5, 5)}[kind]
    in_shape = shape
    mods: list[nn.Module] = []
    eligible: list[tuple[int, str]] = []  # (step index, module path inside the step) that a rule must claim
    mixed = any(s[0] in ("flip", "center") for s in steps)
    for step in steps[1:-1]:
        op, i = step[0], len(mods)
        f = shape[-1]
        if op == "act":
            mods.append(Fn(step[1]))
        elif op in ("flip", "center"):
            mods.append(Fn(op))
        elif op == "linear":
            mods.append(Apply(nn.Linear(f, step[1])))
            eligible.append((i, "mod"))
            shape = (*shape[:-1], step[1])
        elif op == "time_major":
            mods.append(TimeMajor(f, step[1]))
            shape = (*shape[:-1], step[1])
        elif op == "layernorm":
            mods.append(Apply(nn.LayerNorm(f)))
            eligible.append((i, "mod"))
        elif op == "elephant":
            per_unit, learnable = step[1], step[2]
            mods.append(Apply(Elephant(d=4, a=0.9, num_units=f if per_unit else None, learnable=learnable)))
            eligible.append((i, "mod"))
        elif op == "residual":
            mods.append(ResidualStep(f))
            eligible.append((i, "lin"))
        elif op == "to_seq":
            mods.append(nn.Sequential(nn.Linear(f, T * 3), Fn("to_seq", (T, 3))))
            eligible.append((i, "0"))
            shape = (T, 3)
        elif op == "twice":
            mods.append(Twice(f))
        elif op == "tied":
            mods.append(TiedPair(f))
            eligible.append((i, "a.bias"))
            eligible.append((i, "b.bias"))
        elif op == "outside":
            mods.append(UsedOutside(f))
            eligible.append((i, "lin.bias"))
        elif op == "hook":
            lin = nn.Linear(f, f)
            lin.register_forward_hook(_scale_hook)
            mods.append(Apply(lin))
        elif op == "pool":
            mods.append(Fn("pool"))
            shape = shape[1:]
        elif op == "flatten":
            mods.append(Fn("flatten"))
            shape = (int(torch.tensor(shape).prod()),)
        elif op == "conv":
            c, h = shape[0], shape[1]
            out_c, k, stride, pad, dil, grouped, mode = step[1:]
            groups = c if grouped and c > 1 and out_c % c == 0 else 1
            out_c = out_c if groups == 1 else c
            k = min(k, h)
            dil = dil if dil * (k - 1) + 1 <= h + 2 * pad else 1
            mode = mode if 0 < pad < min(shape[1], shape[2]) else "zeros"
            conv = nn.Conv2d(c, out_c, k, stride=stride, padding=pad, dilation=dil, groups=groups, padding_mode=mode)
            with torch.no_grad():
                shape = tuple(conv(torch.zeros(1, *shape)).shape[1:])
            mods.append(Apply(conv))
            if groups == 1 and mode == "zeros":
                eligible.append((i, "mod"))
        else:
            raise ValueError(op)
    if len(shape) > 1:
        mods.append(Fn("flatten"))
        shape = (int(torch.tensor(shape).prod()),)
    mods.append(Apply(nn.Linear(shape[0], steps[-1][1])))
    eligible.append((len(mods) - 1, "mod"))
    model = nn.Sequential(*mods).eval()
    names = [k for k, _ in model.named_parameters()]
    must = set()
    if not mixed:
        for i, path in eligible:
            prefix = f"{i}.{path}"
            must |= {k for k in names if k == prefix or k.startswith(prefix + ".")}
    return model, in_shape, must, mixed



@settings(derandomize=True, max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=architectures(), seed=st.integers(0, 2**16))
def test_random_architectures_are_exact(steps, seed):
    model, in_shape, must, mixed = build(steps, seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, *in_shape, generator=g, dtype=torch.float64)
    xt = torch.randn(M, *in_shape, generator=g, dtype=torch.float64)
    names = P.selected_names(model, None)
    fn = P.model_fn(model)
    ref = P.kernel_from_jacobians(P.reference_jacobian(fn, model, x, names), P.reference_jacobian(fn, model, xt, names),
                                  "full")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = interference.ntk(model, x, xt)
        trace = interference.ntk(model, x, output="trace", chunk_size=2)
        plan = interference.explain(model, x, xt)
    ok, rel = P.close(got, ref)
    assert ok, f"auto differs from the reference by {rel:.2e}\n{model}\n{plan}"
    ref_trace = P.kernel_from_jacobians(*[P.reference_jacobian(fn, model, x, names)] * 2, "trace")
    ok, rel = P.close(trace, ref_trace)
    assert ok, f"auto (trace, chunk_size=2, xt=None) differs from the reference by {rel:.2e}\n{model}\n{plan}"
    on_rule = {k for k, v in plan.paths.items() if v.path == "rule"}
    assert set(plan.paths) == set(names)
    assert on_rule <= must, f"claimed by a rule but not eligible: {sorted(on_rule - must)}\n{model}\n{plan}"
    assert must <= on_rule, f"eligible but not on a rule: {sorted(must - on_rule)}\n{model}\n{plan}"
    for k, v in plan.paths.items():
        assert v.path in ("rule", "func", "loop") and (v.path == "rule") == (v.rule is not None), (k, v)
    if mixed:
        assert not on_rule
