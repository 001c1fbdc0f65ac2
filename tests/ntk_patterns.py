"""A registry of small model patterns for the NTK differential harness, and an independent reference.

Every entry of :data:`PATTERNS` is a :class:`Pattern`: a seeded float64 model in eval mode, an input maker
``(n, seed) -> batch`` (a tensor, or a tuple/dict of tensors with a shared leading dimension), the parameters that
``interference.explain`` must put on a layer rule under ``implementation="auto"`` and flags such as ``vmap_fails``.

The reference shares nothing with the package: each sample runs alone (a batch of 1) and the rows of its Jacobian
are plain ``torch.autograd.grad`` calls on the model's real parameters, so it sees every path autograd sees (tied
weights, parametrizations, views made in ``__init__``, hooks). :func:`functional_jacobian` recomputes the same
Jacobian with ``torch.autograd.functional.jacobian`` of one flat parameter vector swapped in by
``torch.func.functional_call``; the harness checks the two agree wherever the functional view can see every use of
the parameters (``Pattern.hidden_use`` is False).

Two kinds of pattern have no kernel to compare: those the engine must refuse (``Pattern.refuses``: forwards that draw
random numbers or change the model's buffers), whose reference is never computed; and those whose parameters carry
tensor hooks (``Pattern.reference_build``: the kernel is of the function, so the reference is the same model built
without the hooks, under the same seed).
"""

from __future__ import annotations

import contextlib
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from interference import Elephant, NoisyLinear, mlp
from interference.nets import hidden_layer

Batch = Any
LossFn = Callable[[nn.Module, Batch], Tensor]

ALL = "*"
"""``Pattern.rule`` value: every selected parameter is on a rule."""


# ----------------------------------------------------------------------------------------------- batches
def tree_map(fn: Callable[[Tensor], Any], batch: Batch) -> Batch:
    if isinstance(batch, Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: tree_map(fn, v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(tree_map(fn, v) for v in batch)
    raise TypeError(f"unsupported batch leaf {type(batch).__name__}")


def tree_leaves(batch: Batch) -> list[Tensor]:
    out: list[Tensor] = []
    tree_map(out.append, batch)
    return out


def batch_len(batch: Batch) -> int:
    return tree_leaves(batch)[0].shape[0]


def take(batch: Batch, i: int) -> Batch:
    """Sample ``i`` alone, as a batch of one (a copy: a forward that writes its input in place leaves ``batch``)."""
    return tree_map(lambda t: t[i:i + 1].clone(), batch)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def vec(f: int) -> Callable[[int, int], Tensor]:
    return lambda n, seed: torch.randn(n, f, generator=_gen(seed), dtype=torch.float64)


def shaped(*shape: int, scale: float = 1.0) -> Callable[[int, int], Tensor]:
    return lambda n, seed: scale * torch.randn(n, *shape, generator=_gen(seed), dtype=torch.float64)


def ids(length: int, vocab: int) -> Callable[[int, int], Tensor]:
    return lambda n, seed: torch.randint(0, vocab, (n, length), generator=_gen(seed))


def ids_and_vec(length: int, vocab: int, f: int, as_dict: bool = False) -> Callable[[int, int], Batch]:
    def make(n: int, seed: int) -> Batch:
        g = _gen(seed)
        tok = torch.randint(0, vocab, (n, length), generator=g)
        x = torch.randn(n, f, generator=g, dtype=torch.float64)
        return {"ids": tok, "x": x} if as_dict else (tok, x)
    return make


# ----------------------------------------------------------------------------------------------- losses
def sample_weight(batch: Batch) -> Tensor:
    """A per-sample target weight ``(n,)`` read from the batch itself (so one sample alone gets the same one)."""
    leaf = next((t for t in tree_leaves(batch) if t.is_floating_point()), tree_leaves(batch)[0])
    flat = leaf.reshape(leaf.shape[0], -1).to(torch.float64)
    return 1.0 + 0.5 * torch.tanh(flat.sum(1) / 3.0)


def default_loss(model: nn.Module, batch: Batch) -> Tensor:
    """Per-sample ``w_i * sum_o (f(x_i)_o - 0.25)^2``; ``w_i`` comes from the sample itself."""
    out = model(batch)
    out = out.reshape(out.shape[0], -1)
    return sample_weight(batch) * ((out - 0.25) ** 2).sum(1)


# ----------------------------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class Pattern:
    """One model pattern.

    ``rule``: parameter names (or module prefixes: ``"l1"`` means every parameter under ``l1``) that ``explain``
    must put on a rule under ``implementation="auto"``; :data:`ALL` for every selected parameter, or a callable
    ``(model, selected_names) -> names``. Every other selected parameter must not be on a rule, except those in
    ``maybe_rule`` (the spec leaves them open; the result must be exact either way).
    ``vmap_fails``: ``torch.func.vmap`` cannot run the model (``implementation="func"`` must raise, ``auto`` must
    still give the exact result, falling back to the loop for what is not on a rule); ``None``: it depends on the
    shapes (``func`` may raise its documented error or be exact; ``explain`` may say ``func`` or ``loop``).
    ``hidden_use``: a parameter reaches the output through a tensor made outside ``forward`` (a view made in
    ``__init__``), which ``torch.func.functional_call`` cannot swap.
    ``loss``: per-sample loss for gradient_covariance / per_sample_grads (``None``: not tested);
    ``loss_rule``: what is on a rule under ``explain(..., loss_fn=loss)`` when it differs from ``rule``.
    ``fallback_warns``: the model is not a per-sample function of its batch in a way the dry runs (one or two
    samples) cannot see (it branches on the batch's values or size); ``auto`` must still be exact and may warn once
    that it falls back to the exact path, and ``layerwise`` may refuse with a RuntimeError suggesting ``auto``.
    ``zero_kernel``: the output does not depend on the parameters through autograd (detached, or made under
    ``no_grad``): the reference kernel is zero, and the harness checks it is (instead of that it is not).
    ``refuses``: a regex the ValueError of every entry point (every implementation) must match; the model must be
    left as it was (buffers included), and no reference is computed.
    ``reference_build``: the same model without its parameters' tensor hooks (built under the same seed, so the
    parameters are equal): the reference is computed on it, since the kernel is of the model's function.
    """

    name: str
    build: Callable[[], nn.Module]
    inputs: Callable[[int, int], Batch]
    rule: Any = ALL
    maybe_rule: tuple[str, ...] = ()
    params: tuple[str, ...] | None = None
    vmap_fails: bool | None = False
    hidden_use: bool = False
    loss: LossFn | None = default_loss
    loss_rule: Any = None
    fallback_warns: bool = False
    zero_kernel: bool = False
    refuses: str | None = None
    reference_build: Callable[[], nn.Module] | None = None
    n: int = 3
    m: int = 2
    tags: tuple[str, ...] = ()
    note: str = ""


PATTERNS: dict[str, Pattern] = {}


def register(name: str, build: Callable[[], nn.Module], inputs: Callable[[int, int], Batch], **kw: Any) -> Pattern:
    if name in PATTERNS:
        raise ValueError(f"duplicate pattern {name!r}")
    for key in ("rule", "loss_rule"):
        if key in kw and isinstance(kw[key], (list, set, tuple)):
            kw[key] = tuple(kw[key])
    if "maybe_rule" in kw:
        kw["maybe_rule"] = tuple(kw["maybe_rule"])
    if "params" in kw and kw["params"] is not None:
        kw["params"] = tuple(kw["params"])
    if "tags" in kw:
        kw["tags"] = tuple(kw["tags"])
    p = Pattern(name, build, inputs, **kw)
    PATTERNS[name] = p
    return p


@contextlib.contextmanager
def _float64() -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_model(p: Pattern | str, seed: int = 0, reference: bool = False) -> nn.Module:
    """The pattern's model: built under a seed derived from its name, float64, eval mode; ``reference``: the model
    the reference is computed on (``Pattern.reference_build`` under the same seed, if the pattern has one)."""
    p = PATTERNS[p] if isinstance(p, str) else p
    build = p.reference_build if reference and p.reference_build is not None else p.build
    with torch.random.fork_rng(devices=[]), _float64(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecations of the old-style weight_norm / spectral_norm
        torch.manual_seed(zlib.crc32(p.name.encode()) + 7919 * seed)
        model = build()
    model.eval()
    return model


def make_inputs(p: Pattern | str, n: int, seed: int) -> Batch:
    p = PATTERNS[p] if isinstance(p, str) else p
    return p.inputs(n, seed)


def selected_names(model: nn.Module, params: Iterable[str] | None) -> list[str]:
    named = dict(model.named_parameters())
    if params is None:
        return [k for k, v in named.items() if v.requires_grad]
    return list(params)


def _matches(name: str, spec: Iterable[str]) -> bool:
    return any(name == s or name.startswith(s + ".") for s in spec)


def expected_rule(p: Pattern, model: nn.Module, names: list[str], loss: bool = False) -> tuple[set[str], set[str]]:
    """``(must, maybe)``: selected names that must be on a rule, and those that may be."""
    spec = p.loss_rule if loss and p.loss_rule is not None else p.rule
    if spec == ALL:
        must = set(names)
    elif callable(spec):
        must = set(spec(model, names))
    else:
        must = {k for k in names if _matches(k, spec)}
    maybe = {k for k in names if _matches(k, p.maybe_rule)} - must
    return must, maybe


# ----------------------------------------------------------------------------------------------- reference
@contextlib.contextmanager
def _requiring_grad(params: list[nn.Parameter]) -> Iterator[None]:
    old = [q.requires_grad for q in params]
    for q in params:
        q.requires_grad_(True)
    try:
        yield
    finally:
        for q, r in zip(params, old):
            q.requires_grad_(r)


def _flat_grad(value: Tensor, params: list[Tensor]) -> Tensor:
    if not value.requires_grad:  # a detached output, or one made under no_grad: no parameter reaches it
        return torch.cat([torch.zeros(q.numel(), dtype=q.dtype) for q in params])
    grads = torch.autograd.grad(value, params, retain_graph=True, allow_unused=True)
    return torch.cat([torch.zeros(q.numel(), dtype=q.dtype) if g is None else
                      (g.to_dense() if g.is_sparse else g).reshape(-1) for g, q in zip(grads, params)])


def reference_jacobian(fn: Callable[[Batch], Tensor], model: nn.Module, batch: Batch, names: list[str]) -> Tensor:
    """``(n, O, P)``: per-sample Jacobians of ``fn(sample).reshape(-1)`` (each sample alone), by autograd rows."""
    named = dict(model.named_parameters())
    params = [named[k] for k in names]
    rows = []
    with torch.enable_grad(), _requiring_grad(params):
        for i in range(batch_len(batch)):
            out = fn(take(batch, i)).reshape(-1)
            rows.append(torch.stack([_flat_grad(out[o], params) for o in range(out.numel())]))
    return torch.stack(rows).detach()


def functional_jacobian(fn: Callable[[Batch], Tensor], model: nn.Module, batch: Batch,
                        names: list[str]) -> Tensor:
    """The same ``(n, O, P)`` by ``torch.autograd.functional.jacobian`` of one flat parameter vector."""
    named = dict(model.named_parameters())
    shapes = [named[k].shape for k in names]
    sizes = [named[k].numel() for k in names]
    theta0 = torch.cat([named[k].detach().reshape(-1) for k in names])

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, b: Batch) -> Tensor:
            return fn(b)

    wrapper = Wrapper()
    rows = []
    with _dense_embeddings(model):
        for i in range(batch_len(batch)):
            sample = take(batch, i)

            def f(theta: Tensor) -> Tensor:
                swapped = {f"model.{k}": t.reshape(s) for k, t, s in zip(names, theta.split(sizes), shapes)}
                return torch.func.functional_call(wrapper, swapped, (sample,)).reshape(-1)

            rows.append(torch.autograd.functional.jacobian(f, theta0, vectorize=False))
    return torch.stack(rows).detach()


@contextlib.contextmanager
def _dense_embeddings(model: nn.Module) -> Iterator[None]:
    """``nn.Embedding(sparse=True)`` as dense for the functional Jacobian (the same function; ``autograd.functional``
    cannot reshape a sparse gradient)."""
    sparse = [m for m in model.modules() if isinstance(m, nn.Embedding) and m.sparse]
    for m in sparse:
        m.sparse = False
    try:
        yield
    finally:
        for m in sparse:
            m.sparse = True


def model_fn(model: nn.Module) -> Callable[[Batch], Tensor]:
    return lambda b: model(b)


def reference_ntk(model: nn.Module, x: Batch, xt: Batch | None, names: list[str],
                  output: str = "full", jac: Callable = reference_jacobian) -> Tensor:
    j1 = jac(model_fn(model), model, x, names)
    j2 = j1 if xt is None else jac(model_fn(model), model, xt, names)
    return kernel_from_jacobians(j1, j2, output)


def kernel_from_jacobians(j1: Tensor, j2: Tensor, output: str) -> Tensor:
    full = torch.einsum("nop,mqp->nmoq", j1, j2)
    if output == "full":
        return full
    diag = full.diagonal(dim1=2, dim2=3)
    return diag if output == "diagonal" else diag.sum(-1)


def reference_loss_grads(model: nn.Module, loss: LossFn, batch: Batch, names: list[str]) -> Tensor:
    """``(k, P)``: per-sample loss gradients, each sample alone."""
    def fn(b: Batch) -> Tensor:
        losses = loss(model, b)
        assert losses.shape == (1,), f"loss must return one loss per sample, got {tuple(losses.shape)}"
        return losses
    return reference_jacobian(fn, model, batch, names)[:, 0, :]


def split_grads(model: nn.Module, flat: Tensor, names: list[str]) -> dict[str, Tensor]:
    named = dict(model.named_parameters())
    sizes = [named[k].numel() for k in names]
    return {k: t.reshape(flat.shape[0], *named[k].shape) for k, t in zip(names, flat.split(sizes, dim=1))}


def close(got: Tensor, ref: Tensor, rtol: float = 1e-10) -> tuple[bool, float]:
    """Relative max-norm agreement: ``max|got - ref| <= rtol * max|ref|`` (shapes must match)."""
    if got.shape != ref.shape:
        return False, float("inf")
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    err = float((got.detach().to(ref.dtype) - ref).abs().max()) if ref.numel() else 0.0
    rel = err / scale if scale > 0 else err
    return bool(rel <= rtol or err <= 1e-300), rel


# =============================================================================================== models
class Lin(nn.Module):
    """``l2(act(l1(x)))``: the base of many patterns."""

    def __init__(self, f: int = 4, h: int = 5, o: int = 2, act: Callable[[Tensor], Tensor] = torch.tanh) -> None:
        super().__init__()
        self.l1 = nn.Linear(f, h)
        self.l2 = nn.Linear(h, o)
        self.act = act

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(self.act(self.l1(x)))


class Squeeze(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x).squeeze(-1)


class Output3d(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.l2 = nn.Linear(5, 6)

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.tanh(self.l1(x))).view(x.shape[0], 2, 3)


class DictHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 5)
        self.q = nn.Linear(5, 3)
        self.v = nn.Linear(5, 1)

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        h = torch.relu(self.body(x))
        return {"q": self.q(h), "v": self.v(h)}


class Select(nn.Module):
    """Wraps a model returning a dict and selects one tensor."""

    def __init__(self, inner: nn.Module, key: str) -> None:
        super().__init__()
        self.inner = inner
        self.key = key

    def forward(self, x: Batch) -> Tensor:
        return self.inner(x)[self.key]


class ElephantNet(nn.Module):
    def __init__(self, num_units: int | None = 5, learnable: bool = True, seq: bool = False) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.act = Elephant(d=4, a=0.8, num_units=num_units, learnable=learnable)
        self.l2 = nn.Linear(5, 2)
        self.seq = seq

    def forward(self, x: Tensor) -> Tensor:
        if self.seq:  # (N, T, 4)
            return self.l2(self.act(self.l1(x)).mean(1))
        return self.l2(self.act(self.l1(x)))


class ElephantTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.act = Elephant(d=4, a=0.9, num_units=5)
        self.mid = nn.Linear(5, 5)
        self.l2 = nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(self.act(self.mid(self.act(self.l1(x)))))


class ConvElephant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.act = Elephant(d=2, a=1.0)  # shared h/a on (N, C, H, W)
        self.head = nn.Linear(2 * 2 * 2, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.act(self.conv(x)).flatten(1))


def conv_net(conv: nn.Module, flat: int, pool: nn.Module | None = None) -> nn.Module:
    layers = [conv, nn.ReLU()] + ([pool] if pool is not None else []) + [nn.Flatten(), nn.Linear(flat, 2)]
    return nn.Sequential(*layers)


def _conv_out(conv: nn.Module, shape: tuple[int, ...]) -> int:
    with torch.no_grad():
        return conv(torch.zeros(1, *shape)).numel()


def conv_pattern(conv_factory: Callable[[], nn.Module], shape: tuple[int, ...]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        conv = conv_factory()
        return conv_net(conv, _conv_out(conv, shape))
    return build


def nature_like(activation: str = "relu", in_channels: int = 2) -> nn.Module:
    """interference.nets.nature_cnn in miniature: ReLU convolutions, then a hidden_layer block and the head."""
    convs = [nn.Conv2d(in_channels, 4, 4, stride=2), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=1), nn.ReLU(), nn.Flatten()]
    block, width = hidden_layer(4 * 2 * 2, 6, activation)
    return nn.Sequential(*convs, *block, nn.Linear(width, 3))


class Pooling(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.avg(self.pool(torch.relu(self.conv(x)))).flatten(1))


class ConvBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.bn = nn.BatchNorm2d(2)
        self.head = nn.Linear(8, 2)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.relu(self.bn(self.conv(x))).flatten(1))


class LinBN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.bn = nn.BatchNorm1d(5)
        self.l2 = nn.Linear(5, 2)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.relu(self.bn(self.l1(x))))


class WithBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.l2 = nn.Linear(5, 2)
        self.register_buffer("scale", torch.tensor(0.7))
        self.register_buffer("offset", torch.linspace(-0.3, 0.3, 4))

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.tanh(self.l1(x - self.offset))) * self.scale


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 5)
        self.a = nn.Linear(5, 5)
        self.b = nn.Linear(5, 5)
        self.ln = nn.LayerNorm(5)
        self.head = nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.inp(x)
        h = h + self.b(torch.relu(self.a(h)))
        return self.head(self.ln(h))


class ConvResidual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 2, 3, padding=1)
        self.c2 = nn.Conv2d(2, 2, 3, padding=1)
        self.head = nn.Linear(2 * 4 * 4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = x + self.c2(torch.relu(self.c1(x)))
        return self.head(torch.relu(h).flatten(1))


class Dropouts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 6)
        self.drop = nn.Dropout(0.5)
        self.l2 = nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(self.drop(torch.relu(self.l1(F.dropout(x, 0.3, self.training)))))


class EmbedTuple(nn.Module):
    def __init__(self, as_dict: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 3)
        self.l1 = nn.Linear(3 + 2, 4)
        self.head = nn.Linear(4, 2)
        self.as_dict = as_dict

    def forward(self, batch: Batch) -> Tensor:
        tok, x = (batch["ids"], batch["x"]) if self.as_dict else batch
        h = torch.cat([self.emb(tok).mean(1), x], dim=1)
        return self.head(torch.tanh(self.l1(h)))


class LMTied(nn.Module):
    """Language-model tying: the head's weight is also the input embedding, by ``F.embedding(ids, head.weight)``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.head = nn.Linear(4, 5)

    def forward(self, tok: Tensor) -> Tensor:
        e = F.embedding(tok, self.head.weight).mean(1)
        return self.head(torch.tanh(self.proj(e)))


class TiedModules(nn.Module):
    """Classic tying: ``head.weight = emb.weight`` (one Parameter shared by two modules)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 4)
        self.proj = nn.Linear(4, 4)
        self.head = nn.Linear(4, 5)
        self.head.weight = self.emb.weight

    def forward(self, tok: Tensor) -> Tensor:
        return self.head(torch.tanh(self.proj(self.emb(tok).mean(1))))


class WeightInOutput(nn.Module):
    """``l1.weight`` is also used outside the module call (a norm term in the output)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.l2 = nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.tanh(self.l1(x))) + 0.1 * (self.l1.weight ** 2).sum() * x[:, :1]


class InitView(nn.Module):
    """A view of ``l1.weight`` made in ``__init__`` and used in ``forward`` (autograd reaches the parameter)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.l2 = nn.Linear(5, 2)
        self.w_view = self.l1.weight[:, :2]  # (5, 2), shares storage and autograd history with l1.weight

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.tanh(self.l1(x) + x[:, :2] @ self.w_view.T))


class SharedParameter(nn.Module):
    """One Parameter used by two Linear modules (``b.weight = a.weight``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.b(torch.tanh(self.a(x)))))


class TiedAutoencoder(nn.Module):
    """The decoder uses the encoder's weight transposed (``F.linear(h, enc.weight.t())``)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(4, 3)
        self.dec_bias = nn.Parameter(torch.linspace(-0.2, 0.2, 4))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(torch.tanh(self.enc(x)), self.enc.weight.t(), self.dec_bias)


class CalledTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 5)
        self.mid = nn.Linear(5, 5)
        self.out = nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.inp(x))
        h = torch.tanh(self.mid(h))
        h = torch.tanh(self.mid(h))
        return self.out(h)


class AliasedBackbone(nn.Module):
    """One submodule under two names (``self.features = self.backbone``), a GroupNorm in it on the exact path:
    ``functional_call`` would leave the alias holding plain tensors (the layer stops training)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 6), nn.GroupNorm(2, 6), nn.Tanh())
        self.features = self.backbone
        self.head = nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))


class LinearInTwoSequentials(nn.Module):
    """One Linear in two Sequentials, each called once (the Linear twice per forward: exact path)."""

    def __init__(self) -> None:
        super().__init__()
        shared = nn.Linear(4, 4)
        self.a = nn.Sequential(shared, nn.Tanh())
        self.b = nn.Sequential(shared, nn.Sigmoid())
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.a(x) * self.b(x))


class ModuleListNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x)


def old_weight_norm_linear() -> nn.Module:
    return nn.Sequential(nn.utils.weight_norm(nn.Linear(4, 5)), nn.Tanh(), nn.Linear(5, 2))


def old_weight_norm_conv() -> nn.Module:
    return nn.Sequential(nn.utils.weight_norm(nn.Conv2d(1, 2, 3)), nn.ReLU(), nn.Flatten(), nn.Linear(8, 2))


def old_spectral_norm_linear() -> nn.Module:
    net = nn.Sequential(nn.utils.spectral_norm(nn.Linear(4, 5)), nn.Tanh(), nn.Linear(5, 2))
    with torch.no_grad():
        net.train()
        net(torch.randn(2, 4))  # a few power iterations so u and v are not their random start
        net(torch.randn(2, 4))
    return net.eval()


def old_spectral_norm_conv() -> nn.Module:
    net = nn.Sequential(nn.utils.spectral_norm(nn.Conv2d(1, 2, 3)), nn.ReLU(), nn.Flatten(), nn.Linear(8, 2))
    with torch.no_grad():
        net.train()
        net(torch.randn(2, 1, 4, 4))
    return net.eval()


def new_weight_norm_linear() -> nn.Module:
    from torch.nn.utils import parametrizations as P
    return nn.Sequential(P.weight_norm(nn.Linear(4, 5)), nn.Tanh(), nn.Linear(5, 2))


def new_weight_norm_conv() -> nn.Module:
    from torch.nn.utils import parametrizations as P
    return nn.Sequential(P.weight_norm(nn.Conv2d(1, 2, 3)), nn.ReLU(), nn.Flatten(), nn.Linear(8, 2))


def orthogonal_linear() -> nn.Module:
    from torch.nn.utils import parametrizations as P
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), P.orthogonal(nn.Linear(4, 4)), nn.Tanh(), nn.Linear(4, 2))


def new_spectral_norm_linear() -> nn.Module:
    from torch.nn.utils import parametrizations as P
    net = nn.Sequential(P.spectral_norm(nn.Linear(4, 5)), nn.Tanh(), nn.Linear(5, 2))
    with torch.no_grad():
        net.train()
        net(torch.randn(2, 4))
    return net.eval()


class Symmetric(nn.Module):
    def forward(self, w: Tensor) -> Tensor:
        return w.triu() + w.triu(1).T


def custom_parametrization() -> nn.Module:
    from torch.nn.utils import parametrize
    net = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    parametrize.register_parametrization(net[0], "weight", Symmetric())
    return net


class TransformerNet(nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.t = nn.TransformerEncoderLayer(4, 2, dim_feedforward=6, dropout=0.0, batch_first=batch_first)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:  # x: (N, T, 4)
        h = self.t(x) if self.batch_first else self.t(x.transpose(0, 1)).transpose(0, 1)
        return self.head(h.mean(1))


class AttentionNet(nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.inp = nn.Linear(3, 4)
        self.attn = nn.MultiheadAttention(4, 2, batch_first=batch_first)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:  # x: (N, T, 3)
        h = self.inp(x)
        if self.batch_first:
            a = self.attn(h, h, h, need_weights=False)[0]
        else:
            t = h.transpose(0, 1)
            a = self.attn(t, t, t, need_weights=False)[0].transpose(0, 1)
        return self.head(torch.tanh(a).mean(1))


class TransposeLinear(nn.Module):
    """``l(x.transpose(0, 1))``: a Linear on a time-major ``(T, N, F)`` view, back to ``(N, T, F)``."""

    def __init__(self, t: int) -> None:
        super().__init__()
        self.l = nn.Linear(3, 4)
        self.head = nn.Linear(4 * t, 2)

    def forward(self, x: Tensor) -> Tensor:  # (N, T, 3)
        h = torch.tanh(self.l(x.transpose(0, 1))).transpose(0, 1)
        return self.head(h.reshape(x.shape[0], -1))


class ReshapeNT(nn.Module):
    """A Linear on ``x.reshape(N*T, F)``: rows are (sample, step) pairs, not samples."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(3, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        n, t, f = x.shape
        h = torch.tanh(self.l(x.reshape(n * t, f))).reshape(n, t, -1)
        return self.head(h.mean(1))


class SequenceNet(nn.Module):
    """Batch-first ``(N, T, F)``: Linear and LayerNorm over positions (weights shared over T)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(3, 5)
        self.ln = nn.LayerNorm(5)
        self.l2 = nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.relu(self.ln(self.l1(x)))).mean(1)


class LayerNorm2d(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(3, 4)
        self.ln = nn.LayerNorm((5, 4))
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:  # (N, 5, 3)
        return self.head(torch.tanh(self.ln(self.l1(x))).sum(1))


class ChannelLast(nn.Module):
    """A Linear on ``(N, H, W, C)`` (channels last), then flattened."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(2, 3)
        self.head = nn.Linear(3 * 3 * 3, 2)

    def forward(self, x: Tensor) -> Tensor:  # (N, 2, 3, 3)
        return self.head(torch.tanh(self.l(x.permute(0, 2, 3, 1))).flatten(1))


class Recurrent(nn.Module):
    def __init__(self, kind: type[nn.RNNBase]) -> None:
        super().__init__()
        self.rnn = kind(3, 4, batch_first=True)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.rnn(x)[0][:, -1])


class CellLoop(nn.Module):
    """A GRUCell unrolled over time (called T times)."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.GRUCell(3, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = x.new_zeros(x.shape[0], 4)
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
        return self.head(h)


class InplaceHidden(nn.Module):
    """A recurrent cell whose hidden states are a tensor made inside ``forward`` and written in place."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(3, 4)
        self.rec = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        n, t = x.shape[:2]
        hs = torch.zeros(n, t + 1, 4, dtype=x.dtype)
        for i in range(t):
            hs[:, i + 1] = torch.tanh(self.inp(x[:, i]) + self.rec(hs[:, i].clone()))
        return self.head(hs[:, -1])


class KwargsCall(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.l2 = nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.tanh(self.l1(input=x)))


class FlipInput(Lin):
    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.tanh(self.l1(x.flip(0))))


class CenterInput(Lin):
    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.tanh(self.l1(x - x.mean(0))))


class FlipOutput(Lin):
    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.tanh(self.l1(x))).flip(0)


class BatchSizeScale(Lin):
    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.tanh(self.l1(x))) * float(x.shape[0])


class MixBranch(nn.Module):
    """One branch is rolled over the batch before the head: the head and that branch see mixed rows."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.a(x)) + torch.tanh(self.b(x)).roll(1, 0))


class GradientOnlyMixing(nn.Module):
    """Values stay per-sample but the gradient mixes rows (``h + (r - r.detach())`` with ``r`` the rolled ``h``):
    only a backward check can see it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.a(x))
        r = h.roll(1, 0)
        return self.head(torch.tanh(h + (r - r.detach())))


class DoubledLinear(nn.Linear):
    """A subclass of Linear with a different forward."""

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, 2.0 * self.weight, self.bias) + 0.1 * x.sum(-1, keepdim=True)


class PlainSubclass(nn.Linear):
    """A subclass of Linear that keeps Linear's forward (still not the exact type)."""


def _with_l1(layer: nn.Linear) -> nn.Module:
    net = Lin()
    net.l1 = layer
    return net


def monkeypatched() -> nn.Module:
    net = Lin()
    layer = net.l1
    layer.forward = lambda x: F.linear(x, layer.weight * 1.5, layer.bias) + 0.2  # instance-level override
    return net


def forward_hook_scale() -> nn.Module:
    net = Lin()
    net.l1.register_forward_hook(lambda mod, args, out: out * 1.7)
    return net


def forward_pre_hook() -> nn.Module:
    net = Lin()
    net.l1.register_forward_pre_hook(lambda mod, args: (args[0] * 0.5 + 0.1,))
    return net


def backward_hook() -> nn.Module:
    net = Lin()
    net.l2.register_full_backward_hook(lambda mod, gin, gout: None)  # observes only: values unchanged
    return net


def elephant_hook() -> nn.Module:
    net = ElephantNet()
    net.act.register_forward_hook(lambda mod, args, out: out * 0.5)
    return net


class BilinearNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 3)
        self.bil = nn.Bilinear(3, 4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.bil(torch.tanh(self.l1(x)), x)


class DetachBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.a(x)).detach() + torch.tanh(self.b(x)))


class InplaceAfter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.act = nn.ReLU(inplace=True)
        self.l2 = nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.l1(x)
        h.mul_(1.5).add_(0.1)  # in place on the Linear's output
        return self.l2(self.act(h))


class UnusedHead(nn.Module):
    """A module that runs but does not reach the output."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 4)
        self.aux = nn.Linear(4, 3)
        self.head = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.l1(x))
        self.aux(h)  # result discarded
        return self.head(h)


class DictTargetNet(nn.Module):
    """Takes a dict batch ``{"x", "y"}`` (``y``: class labels used only by the loss)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.l2 = nn.Linear(5, 3)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        return self.l2(torch.tanh(self.l1(batch["x"])))


def xy_dict(n: int, seed: int) -> dict[str, Tensor]:
    g = _gen(seed)
    return {"x": torch.randn(n, 4, generator=g, dtype=torch.float64), "y": torch.randint(0, 3, (n,), generator=g)}


def ce_loss(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    return F.cross_entropy(model(batch), batch["y"], reduction="none")


def weight_in_loss(model: nn.Module, batch: Tensor) -> Tensor:
    """Default loss plus a per-sample-weighted penalty on ``l2.weight`` (the weight is used in the loss)."""
    return default_loss(model, batch) + 0.05 * sample_weight(batch) * (model.l2.weight ** 2).sum()


def td_tuple(n: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    g = _gen(seed)
    return (torch.randn(n, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g),
            torch.randn(n, generator=g, dtype=torch.float64))


class QNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = mlp(4, [6], 3, "elephant", {"a": 0.6})

    def forward(self, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        return self.net(batch[0])


def td_loss(model: nn.Module, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
    obs, actions, targets = batch
    q = model(batch).gather(1, actions[:, None]).squeeze(1)
    return (q - targets) ** 2


def frozen_mlp() -> nn.Module:
    net = mlp(4, [5, 4], 2, "tanh")
    net[0].weight.requires_grad_(False)
    net[4].bias.requires_grad_(False)
    return net


def frozen_elephant_params() -> nn.Module:
    net = mlp(4, [5], 2, "elephant", {"a": 0.7})
    net[2].log_a.requires_grad_(False)
    return net


# -- regression cases found in review: tensor attributes, signed zeros, what the dry runs cannot see, hooks
class AttrTieForward(nn.Module):
    """``b.weight`` is no Parameter: a plain tensor attribute set in ``forward`` from ``a.weight``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 4)
        self.b = nn.Linear(4, 2)
        del self.b.weight

    def forward(self, x: Tensor) -> Tensor:
        w = self.a.weight
        self.b.weight = w[:2, :3] @ torch.ones(3, 4, dtype=w.dtype) * 0.5
        return self.b(torch.tanh(self.a(x)))


class AttrTieInitView(nn.Module):
    """``b.weight`` is a plain tensor attribute: a view of ``a.weight`` made in ``__init__``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)
        del self.b.weight
        self.b.weight = self.a.weight[:2]

    def forward(self, x: Tensor) -> Tensor:
        return self.b(torch.tanh(self.a(x)))


class SignedZero(nn.Module):
    """``atan2(x, -1)`` is ``pi`` at ``+0`` and ``-pi`` at ``-0``: samples that differ only by the sign of zero have
    different outputs (and Jacobians)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(1, 3)
        self.l2 = nn.Linear(3, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.tanh(self.l1(torch.atan2(x, -torch.ones_like(x)))))


def signed_zeros(n: int, seed: int) -> Tensor:
    """``(n, 1)`` zeros of alternating sign; odd seeds start with ``+0``, even ones with ``-0``."""
    return torch.tensor([[0.0 if (i + seed) % 2 else -0.0] for i in range(n)], dtype=torch.float64)


class BatchMaxNormalize(nn.Module):
    """Raw-pixel detection on the whole batch: divide by 255 if ``x.max() > 1``."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(3, 4)
        self.l2 = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        if x.max() > 1.0:
            x = x / 255.0
        return self.l2(torch.tanh(self.l1(x)))


def bright_dark(n: int, seed: int) -> Tensor:
    """``(n, 3)``: samples 0, 1 (mod 3) bright (raw pixels up to 255), sample 2 (mod 3) dark (below 1)."""
    u = torch.rand(n, 3, generator=_gen(seed), dtype=torch.float64)
    dark = torch.tensor([i % 3 == 2 for i in range(n)])[:, None]
    return torch.where(dark, 0.05 + 0.9 * u, 2.0 + 250.0 * u)


class MixIfBig(nn.Module):
    """Centers the hidden layer over the batch, but only in batches of more than two samples."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(3, 4)
        self.l2 = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.l1(x))
        if x.shape[0] > 2:
            h = h - h.mean(0)
        return self.l2(h)


class FirstRowBranch(nn.Module):
    """Branches on sample 0's first feature: ``a(x)`` or ``b(x)`` for the whole batch."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.a(x) if bool(x[0, 0] > 0) else self.b(x)


def first_positive(n: int, seed: int) -> Tensor:
    """``(n, 2)``: the first feature positive, except for samples 2 (mod 3)."""
    x = torch.randn(n, 2, generator=_gen(seed), dtype=torch.float64)
    sign = torch.tensor([-1.0 if i % 3 == 2 else 1.0 for i in range(n)], dtype=torch.float64)
    x[:, 0] = sign * (0.2 + x[:, 0].abs())
    return x


class CenterAction(nn.Module):
    """``center-input`` on ``(obs, action)`` batches; the output is the Q value of the action."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(3, 4)
        self.l2 = nn.Linear(4, 2)

    def forward(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        obs, act = batch
        q = self.l2(torch.tanh(self.l1(obs - obs.mean(0, keepdim=True))))
        return q.gather(1, act[:, None])


def same_obs_other_action(n: int, seed: int) -> tuple[Tensor, Tensor]:
    """Sample 1 has sample 0's observation and another action."""
    obs = torch.randn(n, 3, generator=_gen(seed), dtype=torch.float64)
    if n > 1:
        obs[1] = obs[0]
    return obs, torch.tensor([i % 2 for i in range(n)])


def near_duplicate(n: int, seed: int) -> Tensor:
    """Sample 1 is sample 0 plus ``1e-12``."""
    x = torch.randn(n, 4, generator=_gen(seed), dtype=torch.float64)
    if n > 1:
        x[1] = x[0] + 1e-12
    return x


class CenterInputNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 4)
        self.l2 = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.tanh(self.l1(x - x.mean(0, keepdim=True))))


class GradClipHook(nn.Module):
    """A tensor hook in ``forward`` that clips the norm of the hidden activation's gradient to ``c``: the backward
    is not linear in the cotangent (per sample alone it clips by that sample's norm)."""

    def __init__(self, c: float = 0.5) -> None:
        super().__init__()
        self.l1 = nn.Linear(3, 4)
        self.l2 = nn.Linear(4, 2)
        self.c = c

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.l1(x))
        if h.requires_grad:
            h.register_hook(lambda g: g * (self.c / g.norm()).clamp(max=1.0))
        return self.l2(h)


class InitViewLate(nn.Module):
    """A view of ``l1.weight[0, 0]`` made in ``__init__``, used through a ReLU inactive when ``x[:, 0] < 0``."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(2, 3)
        self.l2 = nn.Linear(3, 1)
        with torch.no_grad():
            self.l1.weight[0, 0] = 0.7
        self.w00 = self.l1.weight[0, 0]

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.tanh(self.l1(x))) + torch.relu(x[:, :1] * self.w00)


def late_positive(n: int, seed: int) -> Tensor:
    """``(n, 2)``: the first feature negative for samples 0 and 1, positive from sample 2 on."""
    x = torch.randn(n, 2, generator=_gen(seed), dtype=torch.float64)
    sign = torch.tensor([-1.0 if i < 2 else 1.0 for i in range(n)], dtype=torch.float64)
    x[:, 0] = sign * (0.3 + x[:, 0].abs())
    return x


class UnbatchedConvLoop(nn.Module):
    """A per-sample loop of unbatched ``Conv2d`` calls on ``(1, 4, 4)`` inputs (a leading dimension of 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 2)
        self.head = nn.Linear(9, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.stack([self.conv(xi) for xi in x])
        return self.head(torch.tanh(h).flatten(1))


class UnbatchedLinearLoop(nn.Module):
    """A per-sample loop of unbatched ``Linear`` calls on ``(1,)`` inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(1, 1)
        self.head = nn.Linear(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(torch.stack([self.l(xi) for xi in x])))


class DetachedOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.l(x).detach()


class NoGradForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            a = torch.tanh(self.l(x))
        return a * 2


class PartlyDetached(nn.Module):
    """Output 0 depends on the parameters, output 1 is detached."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        y = self.l(x)
        return torch.stack([y[:, 0], y[:, 1].detach()], 1)


# -- batch coupling only a batch of several samples shows (n = 8)
def signed_means(sign: float, odd: tuple[int, ...]) -> Callable[[int, int], Tensor]:
    """``(n, 4)``: each sample's mean has the sign ``sign`` except the samples in ``odd``; sample 1 lies farthest
    from sample 0 (the pair the dry runs compare), with its sign, so the batch's mean has ``sign`` too."""
    def make(n: int, seed: int) -> Tensor:
        x = 0.2 * torch.randn(n, 4, generator=_gen(seed), dtype=torch.float64)
        off = [3.0 if i == 1 else -0.5 if i in odd else 1.0 for i in range(n)]
        return x + sign * torch.tensor(off, dtype=torch.float64)[:, None]
    return make


def signed_first(negative: tuple[int, ...]) -> Callable[[int, int], Tensor]:
    """``(n, 4)``: the first feature positive except for the samples in ``negative``; sample 1 lies farthest from
    sample 0."""
    def make(n: int, seed: int) -> Tensor:
        x = torch.randn(n, 4, generator=_gen(seed), dtype=torch.float64)
        sign = torch.tensor([-1.0 if i in negative else 1.0 for i in range(n)], dtype=torch.float64)
        x[:, 0] = sign * (0.3 + x[:, 0].abs())
        if n > 1:
            x[1] = x[1] + 4.0 * torch.where(x[1] < 0, -1.0, 1.0)  # every feature's magnitude above 4
        return x
    return make


class MeanBranch(nn.Module):
    """``a`` if the batch's mean is positive, else ``b``: one branch for the whole batch."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(4, 3)
        self.head = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.a(x) if bool(x.mean() > 0) else self.b(x)
        return self.head(torch.tanh(h))


class SortedDispatch(nn.Module):
    """MoE-style dispatch: the rows sorted by a key (``x[:, 0]``, or the expert ``x[:, 0] > 0`` with a stable sort),
    one shared Linear on the sorted rows, then put back in the batch's order: values per sample, the Linear's input
    rows are not the samples."""

    def __init__(self, by_expert: bool) -> None:
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.gain = nn.Parameter(torch.tensor([0.7, 1.3]))
        self.head = nn.Linear(4, 2)
        self.by_expert = by_expert

    def forward(self, x: Tensor) -> Tensor:
        expert = (x[:, 0] > 0).long()
        order = torch.argsort(expert, stable=True) if self.by_expert else torch.argsort(x[:, 0])
        inverse = torch.argsort(order)
        h = torch.tanh(self.shared(x[order]))[inverse]
        return self.head(h * self.gain[expert][:, None])


class TopOneExperts(nn.Module):
    """Each sample goes to expert ``a`` (``x[:, 0] > 0``) or ``b``: the experts run on gathered subsets of rows and
    their outputs are scattered back."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(4, 3)
        self.head = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        pick = x[:, 0] > 0
        h = x.new_zeros(x.shape[0], 3)
        h[pick] = self.a(x[pick])
        h[~pick] = self.b(x[~pick])
        return self.head(torch.tanh(h))


class PermuteIfBig(nn.Module):
    """``inner`` runs on the batch's rows permuted (``roll`` or ``flip``) and permuted back, only in batches of at
    least ``at`` samples: the values stay per sample, the rows ``inner`` sees are not."""

    def __init__(self, inner: nn.Module, at: int, how: str, front: nn.Module | None = None,
                 head: nn.Module | None = None) -> None:
        super().__init__()
        self.front = front if front is not None else nn.Identity()
        self.inner = inner
        self.head = head if head is not None else nn.Linear(4, 2)
        self.at, self.how = at, how

    def forward(self, x: Tensor) -> Tensor:
        h = self.front(x)
        if h.shape[0] >= self.at:
            h = h.roll(1, 0) if self.how == "roll" else h.flip(0)
            h = self.inner(h)
            h = h.roll(-1, 0) if self.how == "roll" else h.flip(0)
        else:
            h = self.inner(h)
        return self.head(torch.tanh(h).flatten(1))


def roll_linear() -> nn.Module:
    return PermuteIfBig(nn.Linear(4, 4), 3, "roll")


def flip_conv() -> nn.Module:
    return PermuteIfBig(nn.Conv2d(1, 2, 3), 5, "flip", head=nn.Linear(2 * 2 * 2, 2))


def roll_elephant() -> nn.Module:
    return PermuteIfBig(Elephant(d=4, a=0.8, num_units=4), 3, "roll", front=nn.Linear(4, 4))


class RowFiveBranch(nn.Module):
    """``a`` for the whole batch if it has a sample 5 whose first feature is positive, else ``b``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(4, 3)
        self.head = nn.Linear(3, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = self.a(x) if x.shape[0] > 5 and bool(x[5, 0] > 0) else self.b(x)
        return self.head(torch.tanh(h))


class AddRowFive(nn.Module):
    """In batches of more than 5 samples every row gets half of row 5's hidden layer; alone, a sample gets half of
    its own."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 4)
        self.l2 = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.l1(x))
        h = h + 0.5 * (h[5:6] if h.shape[0] > 5 else h)
        return self.l2(h)


class BatchSizeAtLeast(nn.Module):
    """In batches of at least 6 samples: the output doubled (``scale``), the hidden layer centered (``center``),
    or the input standardised over the batch (``standardize``)."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.l2 = nn.Linear(5, 2)
        self.what = what

    def forward(self, x: Tensor) -> Tensor:
        big = x.shape[0] >= 6
        if big and self.what == "standardize":
            x = (x - x.mean(0)) / (x.std(0) + 1e-3)
        h = torch.tanh(self.l1(x))
        if big and self.what == "center":
            h = h - h.mean(0)
        out = self.l2(h)
        return 2.0 * out if big and self.what == "scale" else out


def row5_positive(n: int, seed: int) -> Tensor:
    """``(n, 4)``: sample 5's first feature positive, every other sample's negative."""
    x = torch.randn(n, 4, generator=_gen(seed), dtype=torch.float64)
    sign = torch.tensor([1.0 if i == 5 else -1.0 for i in range(n)], dtype=torch.float64)
    x[:, 0] = sign * (0.3 + x[:, 0].abs())
    return x


# -- random forwards without a Dropout module, and forwards that change the model's state
class GaussianSample(nn.Module):
    """A reparameterised Gaussian sample ``mu + randn_like(mu) * std`` (a stochastic policy's action)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 5)
        self.mu = nn.Linear(5, 2)
        self.log_std = nn.Parameter(torch.full((2,), -0.5))

    def forward(self, x: Tensor) -> Tensor:
        mu = self.mu(torch.tanh(self.body(x)))
        return mu + torch.randn_like(mu) * self.log_std.exp()


class RandomForward(nn.Module):
    """``Lin`` with randomness in the hidden layer: ``F.dropout(training=True)`` (``dropout``), uniform noise from
    ``torch.rand`` (``rand``), one random feature mask for the batch (``mask``), or Gaussian noise from a generator
    stored on the module (``generator``: the global generators do not move)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.l2 = nn.Linear(5, 2)
        self.how = how
        self.gen = torch.Generator().manual_seed(3)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.l1(x))
        if self.how == "dropout":
            h = F.dropout(h, 0.5, training=True)
        elif self.how == "rand":
            h = h * (1.0 + 0.1 * torch.rand(h.shape, dtype=h.dtype))
        elif self.how == "mask":
            h = h * (torch.rand(h.shape[-1], dtype=h.dtype) > 0.5)
        elif self.how == "generator":
            h = h + 0.1 * torch.randn(h.shape, generator=self.gen, dtype=h.dtype)
        return self.l2(h)


class StepCounter(nn.Module):
    """Counts its forwards in a buffer ``steps`` (``+= 1`` in place, or ``reassign``: ``self.steps = self.steps +
    1``); ``in_output``: the output is scaled by the count."""

    def __init__(self, in_output: bool = False, reassign: bool = False) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.l2 = nn.Linear(5, 2)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.in_output, self.reassign = in_output, reassign

    def forward(self, x: Tensor) -> Tensor:
        if self.reassign:
            self.steps = self.steps + 1
        else:
            self.steps += 1
        out = self.l2(torch.tanh(self.l1(x)))
        return out * (1.0 + 0.01 * self.steps) if self.in_output else out


class RunningMeanStd(nn.Module):
    """An observation normaliser: ``mean``, ``var`` and ``count`` buffers updated in place from every batch it sees
    (under no_grad), then the batch normalised by them."""

    def __init__(self, f: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.linspace(-0.2, 0.2, f))
        self.register_buffer("var", torch.linspace(0.8, 1.2, f))
        self.register_buffer("count", torch.tensor(10.0))

    def forward(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            n = x.shape[0]
            delta = x.mean(0) - self.mean
            total = self.count + n
            m2 = self.var * self.count + x.var(0, unbiased=False) * n + delta ** 2 * self.count * n / total
            self.mean += delta * n / total
            self.var.copy_(m2 / total)
            self.count += n
        return (x - self.mean) / torch.sqrt(self.var + 1e-8)


class RunningPeak(nn.Module):
    """Divides the hidden layer by the largest magnitude seen so far (a ``peak`` buffer raised in place)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.l2 = nn.Linear(5, 2)
        self.register_buffer("peak", torch.tensor(0.5))

    def forward(self, x: Tensor) -> Tensor:
        h = self.l1(x)
        with torch.no_grad():
            self.peak.copy_(torch.maximum(self.peak, h.abs().max()))
        return self.l2(torch.tanh(h / self.peak))


def normalised_mlp() -> nn.Module:
    return nn.Sequential(RunningMeanStd(4), nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))


# -- tensor hooks on parameters (they change what an optimizer receives, not the model's function)
def with_param_hooks(build: Callable[[], nn.Module], add: Callable[[nn.Module], Any]) -> Callable[[], nn.Module]:
    """``build``'s model with ``add(model)`` registering tensor hooks on its parameters (no random numbers drawn,
    so ``build`` under the same seed is the same model without them)."""
    def hooked() -> nn.Module:
        model = build()
        add(model)
        return model
    return hooked


def _double(g: Tensor) -> Tensor:
    return 2.0 * g


def _hook_conv() -> nn.Module:
    return conv_pattern(lambda: nn.Conv2d(1, 2, 3), (1, 4, 4))()


def _hook_elephant_mlp() -> nn.Module:
    return mlp(3, [5], 2, "elephant", {"a": 0.6})


def _two_hooks(model: nn.Module) -> None:
    model.l1.weight.register_hook(_double)
    model.l1.weight.register_hook(lambda g: g + 0.5)


# -- cases that used to give unclear errors or misleading warnings
class SparseEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 3, sparse=True)
        self.l1 = nn.Linear(3, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, tok: Tensor) -> Tensor:
        return self.head(torch.tanh(self.l1(self.emb(tok).mean(1))))


class Checkpointed(nn.Module):
    """A block under ``torch.utils.checkpoint.checkpoint`` (``use_reentrant`` as given): on the hidden layer, or
    (``on_input``) on the input itself."""

    def __init__(self, use_reentrant: bool, on_input: bool = False) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
        self.head = nn.Linear(4, 2)
        self.use_reentrant, self.on_input = use_reentrant, on_input

    def forward(self, x: Tensor) -> Tensor:
        from torch.utils.checkpoint import checkpoint
        if self.on_input:
            h = torch.tanh(self.inp(checkpoint(self.block, x, use_reentrant=self.use_reentrant)))
        else:
            h = checkpoint(self.block, torch.tanh(self.inp(x)), use_reentrant=self.use_reentrant)
        return self.head(torch.tanh(h))


class InplaceReluInput(nn.Module):
    """``nn.ReLU(inplace=True)`` on the input itself, first."""

    def __init__(self) -> None:
        super().__init__()
        self.relu = nn.ReLU(inplace=True)
        self.l1 = nn.Linear(4, 5)
        self.l2 = nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(torch.tanh(self.l1(self.relu(x))))


class EncoderNet(nn.Module):
    """``nn.TransformerEncoder`` (batch_first, eval, ``enable_nested_tensor`` left at its default); ``padded``:
    the batch is ``(x, key_padding_mask)`` and the pooling runs over every position (padded ones too)."""

    def __init__(self, padded: bool = False) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(4, 2, dim_feedforward=6, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2)
        self.head = nn.Linear(4, 2)
        self.padded = padded

    def forward(self, batch: Batch) -> Tensor:
        if self.padded:
            x, mask = batch
            h = self.enc(x, src_key_padding_mask=mask)
        else:
            h = self.enc(batch)
        return self.head(h.mean(1))


def padded_sequences(n: int, seed: int) -> tuple[Tensor, Tensor]:
    """``(x (n, 4, 4), mask (n, 4))``: sample ``i`` has its last ``i % 3`` positions padded."""
    x = torch.randn(n, 4, 4, generator=_gen(seed), dtype=torch.float64)
    mask = torch.tensor([[t >= 4 - i % 3 for t in range(4)] for i in range(n)])
    return x, mask


# -- aliased modules
class AliasedConvBackbone(nn.Module):
    """``self.features = self.backbone`` with a Conv2d in it, called under the alias."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU())
        self.features = self.backbone
        self.head = nn.Linear(2 * 2 * 2, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x).flatten(1))


class AliasedNorm(nn.Module):
    """A GroupNorm under two names; ``both``: called once under each (twice per forward), else under the alias."""

    def __init__(self, both: bool) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 4)
        self.norm = nn.GroupNorm(2, 4)
        self.norm_alias = self.norm
        self.l2 = nn.Linear(4, 2)
        self.both = both
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm_alias(self.l1(x))
        if self.both:
            h = self.norm(torch.tanh(h))
        return self.l2(torch.tanh(h))


class AliasedElephant(nn.Module):
    """An Elephant under two names (``self.act2 = self.act1``), called once under the alias."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.act1 = Elephant(d=4, a=0.8, num_units=5)
        self.act2 = self.act1
        self.l2 = nn.Linear(5, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.l2(self.act2(self.l1(x)))


# =============================================================================================== registry
R = register

# -- MLPs built by interference.mlp (all on rules)
R("mlp-relu", lambda: mlp(4, [6, 5], 3, "relu", sigma_bias=0.3), vec(4), tags=["mlp"])
R("mlp-tanh-1out", lambda: mlp(4, [6], 1, "tanh"), vec(4), tags=["mlp"])
R("mlp-elu", lambda: mlp(3, [5], 2, "elu"), vec(3), tags=["mlp"])
R("mlp-sigmoid-noout-bias", lambda: mlp(3, [5], 2, "sigmoid", output_bias=False), vec(3), tags=["mlp"])
R("mlp-elephant", lambda: mlp(3, [6, 5], 2, "elephant", {"a": 0.6}), vec(3), tags=["mlp", "elephant"])
R("mlp-elephant-shared", lambda: mlp(3, [5], 2, "elephant", {"num_units": None, "a": 0.7}), vec(3),
  tags=["mlp", "elephant"])
R("mlp-elephant-frozen-ha", lambda: mlp(3, [5], 2, "elephant", {"d": 8, "a": 0.6, "learnable": False},
                                        layer_norm=False, sigma_bias=1.0), vec(3), tags=["mlp", "elephant"])
R("mlp-maxout", lambda: mlp(4, [6], 2, "maxout", {"k": 2}), vec(4), tags=["mlp"])
R("mlp-lwta", lambda: mlp(4, [6], 2, "lwta", {"k": 3}), vec(4), tags=["mlp"])
R("mlp-fta", lambda: mlp(2, [3], 2, "fta", {"k": 4, "bound": 2.0}), vec(2), tags=["mlp"])
R("mlp-relu-layernorm", lambda: mlp(4, [5], 2, "relu", layer_norm=True), vec(4), tags=["mlp"])
R("mlp-gelu-silu", lambda: nn.Sequential(nn.Linear(4, 5), nn.GELU(), nn.Linear(5, 4), nn.SiLU(), nn.Softplus(),
                                         nn.Linear(4, 2)), vec(4), tags=["mlp"])
R("modulelist", ModuleListNet, vec(4))

# -- output shapes
R("output-1d", lambda: Squeeze(mlp(4, [5], 1, "tanh")), vec(4), tags=["output"])
R("output-3d", Output3d, vec(4), tags=["output"])
R("dict-select-q", lambda: Select(DictHeads(), "q"), vec(4), maybe_rule=["inner.v"], tags=["output"],
  note="inner.v runs but does not reach the output (zero Jacobian)")
R("unused-module", UnusedHead, vec(4), maybe_rule=["aux"], tags=["output"])

# -- Elephant
R("elephant-per-unit", ElephantNet, vec(4), tags=["elephant"])
R("elephant-shared", lambda: ElephantNet(num_units=None), vec(4), tags=["elephant"])
R("elephant-frozen", lambda: ElephantNet(learnable=False), vec(4), tags=["elephant"])
R("elephant-sequence", lambda: ElephantNet(seq=True), shaped(3, 4), tags=["elephant", "sequence"])
R("elephant-on-conv", ConvElephant, shaped(1, 4, 4), tags=["elephant", "conv"])
R("elephant-twice", ElephantTwice, vec(4), rule=["l1", "mid", "l2"], tags=["elephant", "sharing"])
R("elephant-hook", elephant_hook, vec(4), rule=["l1", "l2"], tags=["elephant", "hooks"])

# -- noisy nets (Rainbow): noise on, noise off (the sigmas do not reach the output), and a 3-D input (refused)
def noisy_net(noise: bool = True) -> nn.Module:
    net = nn.Sequential(NoisyLinear(4, 6, std_init=0.4), nn.LayerNorm(6), Elephant(d=4, a=0.8, num_units=6),
                        NoisyLinear(6, 3, std_init=0.4))
    g = torch.Generator().manual_seed(5)
    for m in (net[0], net[3]):
        m.resample(g)
        m.noise = noise
    return net


R("noisy-on", noisy_net, vec(4), tags=["noisy"])
R("noisy-off", lambda: noisy_net(noise=False), vec(4), tags=["noisy"],
  note="weight_sigma and bias_sigma do not reach the output: zero Jacobian, on the rule")
R("noisy-sequence", noisy_net, shaped(2, 4), rule=["1", "2"],
  tags=["noisy", "sequence"], note="NoisyLinear's rule takes (n, in) inputs only: a 3-D input goes to the exact path")

# -- convolutions
R("conv-basic", conv_pattern(lambda: nn.Conv2d(2, 3, 3), (2, 5, 5)), shaped(2, 5, 5), tags=["conv"])
R("conv-stride-pad", conv_pattern(lambda: nn.Conv2d(2, 3, 3, stride=2, padding=1), (2, 5, 5)), shaped(2, 5, 5),
  tags=["conv"])
R("conv-dilation", conv_pattern(lambda: nn.Conv2d(1, 2, 2, dilation=2), (1, 5, 5)), shaped(1, 5, 5), tags=["conv"])
R("conv-rect-nobias", conv_pattern(lambda: nn.Conv2d(2, 2, (2, 3), stride=(1, 2), padding=(1, 0), bias=False),
                                   (2, 4, 5)), shaped(2, 4, 5), tags=["conv"])
R("conv-grouped", conv_pattern(lambda: nn.Conv2d(4, 4, 3, groups=2), (4, 4, 4)), shaped(4, 4, 4), rule=["3"],
  tags=["conv"])
R("conv-depthwise", conv_pattern(lambda: nn.Conv2d(3, 3, 3, groups=3, padding=1), (3, 3, 3)), shaped(3, 3, 3),
  rule=["3"], tags=["conv"])
R("conv-padding-same", conv_pattern(lambda: nn.Conv2d(2, 2, 3, padding="same"), (2, 4, 4)), shaped(2, 4, 4),
  rule=["3"], tags=["conv"])
R("conv-reflect", conv_pattern(lambda: nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect"), (1, 4, 4)),
  shaped(1, 4, 4), rule=["3"], tags=["conv"])
R("conv1d", conv_pattern(lambda: nn.Conv1d(2, 3, 3, padding=1), (2, 5)), shaped(2, 5), rule=["3"], tags=["conv"])
R("conv3d", conv_pattern(lambda: nn.Conv3d(1, 2, 2), (1, 3, 3, 3)), shaped(1, 3, 3, 3), rule=["3"], tags=["conv"])
R("conv-transpose2d", conv_pattern(lambda: nn.ConvTranspose2d(2, 2, 2, stride=2), (2, 3, 3)), shaped(2, 3, 3),
  rule=["3"], tags=["conv"])
R("nature-like-relu", lambda: nature_like("relu"), shaped(2, 10, 10), tags=["conv", "cnn"])
R("nature-like-elephant", lambda: nature_like("elephant"), shaped(2, 10, 10), tags=["conv", "cnn", "elephant"])
R("pooling", Pooling, shaped(1, 4, 4), tags=["conv"])
R("conv-residual", ConvResidual, shaped(2, 4, 4), tags=["conv", "residual"])

# -- buffers, residuals, dropout
R("batchnorm2d-eval", ConvBN, shaped(1, 4, 4), rule=["conv", "head"], tags=["buffers"])
R("batchnorm1d-eval", LinBN, vec(4), rule=["l1", "l2"], tags=["buffers"])
R("registered-buffers", WithBuffers, vec(4), tags=["buffers"])
R("residual-mlp", Residual, vec(4), tags=["residual"])
R("dropout-eval", Dropouts, vec(4))
R("inplace-after-linear", InplaceAfter, vec(4))
R("detach-branch", DetachBranch, vec(4), maybe_rule=["a"], note="a is cut off by detach (zero Jacobian)")
R("prelu", lambda: nn.Sequential(nn.Linear(3, 4), nn.PReLU(), nn.Linear(4, 2)), vec(3), rule=["0", "2"],
  vmap_fails=None, tags=["vmap"],
  note="vmap(jacrev) through PReLU fails when the batch size differs from the number of outputs (a torch bug):"
       " a one-sample probe passes, the real batch fails")
R("bilinear", BilinearNet, vec(4), rule=["l1"])

# -- embeddings and batches that are tuples / dicts
R("embedding-tuple", EmbedTuple, ids_and_vec(3, 7, 2), rule=["l1", "head"], tags=["embedding", "pytree"])
R("embedding-dict", lambda: EmbedTuple(as_dict=True), ids_and_vec(3, 7, 2, as_dict=True), rule=["l1", "head"],
  tags=["embedding", "pytree"])
R("dict-batch-ce-loss", DictTargetNet, xy_dict, loss=ce_loss, tags=["pytree"])
R("td-loss-tuple", QNet, td_tuple, loss=td_loss, tags=["pytree", "elephant"])

# -- defect 1: tying and uses outside the module call
R("lm-tying-f-embedding", LMTied, ids(3, 5), rule=["proj", "head.bias"], tags=["tying"])
R("tied-embedding-module", TiedModules, ids(3, 5), rule=["proj", "head.bias"], tags=["tying"])
R("weight-in-output", WeightInOutput, vec(4), rule=["l1.bias", "l2"], tags=["tying"])
R("weight-in-loss", Lin, vec(4), loss=weight_in_loss, loss_rule=["l1", "l2.bias"], tags=["tying"],
  note="ntk: all on rules; gradient_covariance: l2.weight is also used by the loss")
R("view-made-in-init", InitView, vec(4), rule=["l1.bias", "l2"], hidden_use=True, tags=["tying"],
  note="a view of l1.weight made in __init__ carries gradient to l1.weight; functional_call cannot swap it")
R("parameter-two-modules", SharedParameter, vec(4), rule=["a.bias", "b.bias", "head"], tags=["tying"])
R("tied-autoencoder", TiedAutoencoder, vec(4), rule=["enc.bias"], tags=["tying"])
R("module-called-twice", CalledTwice, vec(4), rule=["inp", "out"], tags=["sharing"])
R("aliased-submodule", AliasedBackbone, vec(4), rule=["backbone.0", "head"], tags=["sharing"])
R("linear-in-two-sequentials", LinearInTwoSequentials, vec(4), rule=["head"], tags=["sharing"])

# -- defect 2: parametrizations and weight/spectral norm
R("old-weight-norm-linear", old_weight_norm_linear, vec(4), rule=["2"], tags=["parametrization"])
R("old-weight-norm-conv", old_weight_norm_conv, shaped(1, 4, 4), rule=["3"], tags=["parametrization"])
R("old-spectral-norm-linear", old_spectral_norm_linear, vec(4), rule=["2"], tags=["parametrization"])
R("old-spectral-norm-conv", old_spectral_norm_conv, shaped(1, 4, 4), rule=["3"], tags=["parametrization"])
R("new-weight-norm-linear", new_weight_norm_linear, vec(4), rule=["2"], tags=["parametrization"])
R("new-weight-norm-conv", new_weight_norm_conv, shaped(1, 4, 4), rule=["3"], tags=["parametrization"])
R("new-spectral-norm-linear", new_spectral_norm_linear, vec(4), rule=["2"], tags=["parametrization"])
R("orthogonal", orthogonal_linear, vec(4), rule=["0", "4"], tags=["parametrization"])
R("custom-parametrization", custom_parametrization, vec(4), rule=["2"], tags=["parametrization"])

# -- defect 3: time-major layouts and sequences
R("transformer-batch-first", lambda: TransformerNet(True), shaped(4, 4),
  rule=["t.linear1", "t.linear2", "t.norm1", "t.norm2", "head"], tags=["sequence", "attention"])
R("transformer-time-major", lambda: TransformerNet(False), shaped(4, 4), rule=["head"],
  tags=["sequence", "attention", "time-major"])
R("transpose-linear-T-eq-N", lambda: TransposeLinear(3), shaped(3, 3), rule=["head"], n=3, m=2,
  tags=["sequence", "time-major"], note="T == N: the time-major input has the batch's shape")
R("transpose-linear-T-ne-N", lambda: TransposeLinear(5), shaped(5, 3), rule=["head"], tags=["sequence", "time-major"])
R("reshape-N-times-T", ReshapeNT, shaped(4, 3), rule=["head"], tags=["sequence", "time-major"])
R("sequence-batch-first", SequenceNet, shaped(4, 3), tags=["sequence"])
R("layernorm-2d-shape", LayerNorm2d, shaped(5, 3), tags=["sequence"])
R("channels-last-linear", ChannelLast, shaped(2, 3, 3), tags=["conv"])
R("attention-batch-first", lambda: AttentionNet(True), shaped(4, 3), rule=["inp", "head"], tags=["attention"])
R("attention-time-major", lambda: AttentionNet(False), shaped(4, 3), rule=["inp", "head"],
  tags=["attention", "time-major"])

# -- defect 4: modules torch.func.vmap cannot run
R("gru", lambda: Recurrent(nn.GRU), shaped(4, 3), rule=["head"], vmap_fails=True, tags=["recurrent", "vmap"])
R("lstm", lambda: Recurrent(nn.LSTM), shaped(4, 3), rule=["head"], vmap_fails=True, tags=["recurrent", "vmap"])
R("rnn", lambda: Recurrent(nn.RNN), shaped(4, 3), rule=["head"], vmap_fails=True, tags=["recurrent", "vmap"])
R("lstm-head-only", lambda: Recurrent(nn.LSTM), shaped(4, 3), params=["head.weight", "head.bias"], rule=ALL,
  vmap_fails=True, tags=["recurrent", "vmap", "params"])
R("inplace-hidden-state", InplaceHidden, shaped(4, 3), rule=["head"], vmap_fails=True, tags=["recurrent", "vmap"])
R("backward-hook", backward_hook, vec(4), rule=["l1"], vmap_fails=True, tags=["hooks", "vmap"])
R("grucell-loop", CellLoop, shaped(4, 3), rule=["head"], tags=["recurrent"])

# -- defect 5 and other module-call oddities
R("kwargs-call", KwargsCall, vec(4), rule=["l2"], maybe_rule=["l1"], tags=["hooks"],
  note="self.l1(input=x): the spec does not say whether a keyword call may be on a rule")
R("linear-subclass-new-forward", lambda: _with_l1(DoubledLinear(4, 5)), vec(4), rule=["l2"],
  tags=["subclass"])
R("linear-subclass-same-forward", lambda: _with_l1(PlainSubclass(4, 5)), vec(4), rule=["l2"], tags=["subclass"])
R("instance-monkeypatched-forward", monkeypatched, vec(4), rule=["l2"], tags=["subclass"])
R("forward-hook-scale", forward_hook_scale, vec(4), rule=["l2"], tags=["hooks"])
R("forward-pre-hook", forward_pre_hook, vec(4), rule=["l2"], tags=["hooks"])

# -- samples that mix
R("flip-input", FlipInput, vec(4), rule=[], tags=["mixing"])
R("center-input", CenterInput, vec(4), rule=[], tags=["mixing"])
R("flip-output", FlipOutput, vec(4), rule=[], tags=["mixing"])
R("batch-size-scale", BatchSizeScale, vec(4), rule=[], tags=["mixing"])
R("gradient-only-mixing", GradientOnlyMixing, vec(4), rule=["head"], tags=["mixing"])
R("mix-branch", MixBranch, vec(4), rule=[], maybe_rule=["a"], tags=["mixing"])

# -- frozen and partially selected parameters
R("frozen-params", frozen_mlp, vec(4), tags=["params"])
R("frozen-elephant-log-a", frozen_elephant_params, vec(4), tags=["params", "elephant"])
R("params-subset", lambda: mlp(4, [5, 4], 2, "tanh"), vec(4), params=["2.weight", "0.bias"], tags=["params"])
R("params-subset-mixed-paths", LinBN, vec(4), params=["bn.weight", "l2.weight"], rule=["l2"], tags=["params"])
R("params-select-frozen", frozen_mlp, vec(4), params=["0.weight", "2.bias"], tags=["params"],
  note="explicitly selects a parameter with requires_grad=False")
R("params-bias-of-tied", WeightInOutput, vec(4), params=["l1.bias"], tags=["params", "tying"])

# -- regression cases found in review
R("tensor-attr-tie-forward", AttrTieForward, vec(3), rule=["a.bias", "b.bias"], tags=["tying"],
  note="b.weight is a plain tensor set in forward from a.weight: a.weight is used outside its module's call")
R("tensor-attr-tie-init-view", AttrTieInitView, vec(4), rule=["a.bias", "b.bias"], hidden_use=True, tags=["tying"],
  note="b.weight is a plain tensor attribute, a view of a.weight made in __init__ (functional_call cannot swap it)")
R("signed-zero-samples", SignedZero, signed_zeros, tags=["samples"],
  note="samples that differ only by the sign of zero (atan2 tells them apart) are not identical samples")
R("signed-zero-x-vs-xt", SignedZero, signed_zeros, n=1, m=1, tags=["samples"],
  note="x = [+0] and xt = [-0]: x and xt differ only by the sign of zero")
R("batch-max-normalize", BatchMaxNormalize, bright_dark, rule=[], maybe_rule=["l1", "l2"], vmap_fails=True,
  fallback_warns=True, tags=["mixing", "vmap"],
  note="divides the batch by 255 if its max is > 1: sample 2 is dark, so alone it is not divided; the dry runs"
       " (samples 0 and 1) cannot see it")
R("mix-only-if-batch-gt-2", MixIfBig, vec(3), rule=[], maybe_rule=["l1", "l2"], fallback_warns=True,
  tags=["mixing"], note="centers over the batch only in batches of more than 2: the dry runs (1 and 2 samples)"
                        " cannot see it")
R("branch-on-first-row", FirstRowBranch, first_positive, rule=[], maybe_rule=["a", "b"], vmap_fails=True,
  fallback_warns=True, tags=["mixing", "vmap"],
  note="branches on sample 0's values: samples 0 and 1 agree, sample 2 alone takes the other branch")
R("center-input-same-obs-other-action", CenterAction, same_obs_other_action, rule=[], tags=["mixing", "pytree"],
  note="centers over the batch; sample 1 has sample 0's observation but another action (the pair the dry runs"
       " compare must show the mixing)")
R("center-input-near-duplicate", CenterInputNet, near_duplicate, rule=[], tags=["mixing"],
  note="centers over the batch; sample 1 is sample 0 + 1e-12 (below any value tolerance)")
R("grad-norm-clip-hook", GradClipHook, vec(3), rule=["l2"], tags=["hooks"],
  note="a tensor hook in forward clips the hidden gradient's norm: the backward is not linear in the cotangent,"
       " so l1 must not be on a rule")
R("view-in-init-late-samples", InitViewLate, late_positive, rule=["l1.bias", "l2"], hidden_use=True, n=4,
  tags=["tying"], note="a view of l1.weight made in __init__ reaches the output only for samples 2 and 3 (a ReLU"
                       " inactive on samples 0 and 1)")
R("unbatched-conv-loop", UnbatchedConvLoop, shaped(1, 4, 4), rule=["head"], n=1, m=3, tags=["conv", "samples"],
  note="a per-sample loop of unbatched Conv2d calls (input (1, 4, 4)); n=1 and identical samples make no pair run")
R("unbatched-conv-loop-bias", UnbatchedConvLoop, shaped(1, 4, 4), params=["conv.bias"], rule=[], n=1,
  tags=["conv", "samples", "params"], note="the same, differentiating conv.bias only")
R("unbatched-linear-loop", UnbatchedLinearLoop, vec(1), rule=["head"], n=1, tags=["samples"],
  note="a per-sample loop of unbatched Linear calls on (1,) inputs")
R("detached-output", DetachedOutput, vec(3), rule=[], maybe_rule=["l"], loss=None, zero_kernel=True,
  tags=["output"], note="the output is detached: the kernel is zero")
R("nograd-forward", NoGradForward, vec(3), rule=[], maybe_rule=["l"], loss=None, zero_kernel=True,
  tags=["output"], note="the whole forward runs under no_grad: the kernel is zero")
R("partly-detached-output", PartlyDetached, vec(3), tags=["output"],
  note="output 1 is detached: its rows of the kernel are zero")

# -- batch coupling only a batch of several samples shows (n = 8; "dry-run-blind": samples 0 and 1 together,
# in either order, are each sample alone)
R("mean-branch-positive-batch", MeanBranch, signed_means(1.0, (3, 5)), rule=[], maybe_rule=["a", "b", "head"],
  vmap_fails=True, fallback_warns=True, n=8, tags=["batch-coupling", "dry-run-blind", "mixing", "vmap"],
  note="a(x) if the batch's mean is positive, else b(x): the batch's mean is positive, samples 3 and 5 alone are"
       " negative (they take b); samples 0 and 1 take a alone and together")
R("mean-branch-negative-batch", MeanBranch, signed_means(-1.0, (2, 6)), rule=[], maybe_rule=["a", "b", "head"],
  vmap_fails=True, fallback_warns=True, n=8, tags=["batch-coupling", "dry-run-blind", "mixing", "vmap"],
  note="the same with the signs swapped: the batch's mean is negative, samples 2 and 6 alone are positive (xt's"
       " sample 2 too)")
R("moe-sorted-dispatch", lambda: SortedDispatch(by_expert=False), vec(4), rule=[],
  maybe_rule=["shared", "gain", "head"], vmap_fails=False, fallback_warns=True, n=8, tags=["batch-coupling", "mixing"],
  note="one Linear on the rows sorted by x[:, 0], put back in order after: per-sample values, but the Linear's input"
       " rows are not the samples")
R("moe-grouped-by-expert", lambda: SortedDispatch(by_expert=True), signed_first((3, 6)), rule=[],
  maybe_rule=["shared", "gain", "head"], vmap_fails=False, fallback_warns=True, n=8,
  tags=["batch-coupling", "dry-run-blind", "mixing"],
  note="rows grouped by expert (x[:, 0] > 0, stable sort) for one shared Linear: samples 0 and 1 share an expert"
       " (the pair keeps its order), samples 3 and 6 move to the front in the batch of 8")
R("moe-top1-experts", TopOneExperts, signed_first((3, 6)), rule=[], maybe_rule=["a", "b", "head"], vmap_fails=True,
  fallback_warns=True, n=8, tags=["batch-coupling", "dry-run-blind", "mixing", "vmap"],
  note="each sample to expert a or b by the sign of x[:, 0]: the experts run on gathered rows, scattered back")
R("roll-linear-if-n-ge-3", roll_linear, vec(4), rule=[], maybe_rule=["inner", "head"], vmap_fails=False,
  fallback_warns=True, n=8, tags=["batch-coupling", "dry-run-blind", "mixing"],
  note="a Linear on the batch rolled by one row and rolled back, only in batches of 3 or more: per-sample values,"
       " the Linear's rows are other samples'")
R("flip-conv-if-n-ge-5", flip_conv, shaped(1, 4, 4), rule=[], maybe_rule=["inner", "head"], vmap_fails=False,
  fallback_warns=True, n=8, tags=["batch-coupling", "dry-run-blind", "mixing", "conv"],
  note="a Conv2d on the batch flipped and flipped back, only in batches of 5 or more")
R("roll-elephant-if-n-ge-3", roll_elephant, vec(4), rule=[], maybe_rule=["front", "inner", "head"],
  vmap_fails=False, fallback_warns=True, n=8, tags=["batch-coupling", "dry-run-blind", "mixing", "elephant"],
  note="an Elephant on the batch rolled by one row and rolled back, only in batches of 3 or more")
R("branch-on-row-5", RowFiveBranch, row5_positive, rule=[], maybe_rule=["a", "b", "head"], vmap_fails=False,
  fallback_warns=True, n=8, tags=["batch-coupling", "dry-run-blind", "mixing"],
  note="a(x) for the whole batch if sample 5's first feature is positive (only sample 5's is), else b(x): every"
       " sample alone takes b")
R("add-row-5-if-n-gt-5", AddRowFive, vec(4), rule=[], maybe_rule=["l1", "l2"], vmap_fails=False,
  fallback_warns=True, n=8, tags=["batch-coupling", "dry-run-blind", "mixing"],
  note="in batches of more than 5 every row gets half of row 5's hidden layer (alone: half of its own)")
R("scale-if-n-ge-6", lambda: BatchSizeAtLeast("scale"), vec(4), rule=[], maybe_rule=["l1", "l2"], vmap_fails=False,
  fallback_warns=True, n=8, tags=["batch-coupling", "dry-run-blind", "mixing"],
  note="the output doubled in batches of 6 or more: values differ per row, the rows do not mix")
R("center-if-n-ge-6", lambda: BatchSizeAtLeast("center"), vec(4), rule=[], maybe_rule=["l1", "l2"],
  vmap_fails=False, fallback_warns=True, n=8, tags=["batch-coupling", "dry-run-blind", "mixing"],
  note="the hidden layer centered over the batch in batches of 6 or more")
R("standardize-if-n-ge-6", lambda: BatchSizeAtLeast("standardize"), vec(4), rule=[], maybe_rule=["l1", "l2"],
  vmap_fails=False, fallback_warns=True, n=8, tags=["batch-coupling", "dry-run-blind", "mixing"],
  note="the input standardised over the batch in batches of 6 or more")

# -- random forwards without a Dropout module, and forwards that change the model's buffers: refused everywhere
R("reparam-gaussian-sample", GaussianSample, vec(4), refuses=r"random", tags=["random"],
  note="mu + randn_like(mu) * std in forward")
R("functional-dropout-training", lambda: RandomForward("dropout"), vec(4), refuses=r"random", tags=["random"],
  note="F.dropout(h, 0.5, training=True) in an eval-mode model")
R("torch-rand-noise", lambda: RandomForward("rand"), vec(4), refuses=r"random", tags=["random"],
  note="multiplicative noise from torch.rand")
R("random-feature-mask", lambda: RandomForward("mask"), vec(4), refuses=r"random", tags=["random"],
  note="one random feature mask for the whole batch")
R("own-generator-noise", lambda: RandomForward("generator"), vec(4), refuses=r"random", tags=["random"],
  note="noise from a torch.Generator stored on the module: the global generators do not move")
R("step-counter", StepCounter, vec(4), refuses=r"changes.*\bsteps\b", tags=["stateful"],
  note="self.steps += 1 in forward; the output does not use it")
R("step-counter-in-output", lambda: StepCounter(in_output=True), vec(4), refuses=r"changes.*\bsteps\b",
  tags=["stateful"], note="self.steps += 1 in forward, the output scaled by it")
R("step-counter-reassigned", lambda: StepCounter(reassign=True), vec(4), refuses=r"changes.*\bsteps\b",
  tags=["stateful"], note="self.steps = self.steps + 1: the buffer is replaced, not written in place")
R("running-mean-std", normalised_mlp, vec(4), refuses=r"changes.*\b0\.mean\b", tags=["stateful"],
  note="an observation normaliser updating its mean/var/count buffers in place (no_grad) from every batch")
R("running-peak-scale", RunningPeak, vec(4), refuses=r"changes.*\bpeak\b", tags=["stateful"],
  note="the hidden layer divided by the largest magnitude seen so far, a buffer raised in place")

# -- tensor hooks on parameters: ignored by every implementation (the reference is the model without them)
R("param-hook-double-weight", with_param_hooks(Lin, lambda m: m.l1.weight.register_hook(_double)), vec(4),
  reference_build=Lin, tags=["param-hooks", "hooks"], note="l1.weight.register_hook(lambda g: 2 * g)")
R("param-hook-clamp", with_param_hooks(Lin, lambda m: m.l2.weight.register_hook(lambda g: g.clamp(-1e-3, 1e-3))),
  vec(4), reference_build=Lin, tags=["param-hooks", "hooks"], note="a hook clamping l2.weight's gradient")
R("param-hook-bias", with_param_hooks(Lin, lambda m: m.l2.bias.register_hook(lambda g: -3.0 * g)), vec(4),
  reference_build=Lin, tags=["param-hooks", "hooks"], note="a hook on l2.bias")
R("param-hook-zero", with_param_hooks(Lin, lambda m: m.l1.bias.register_hook(torch.zeros_like)), vec(4),
  reference_build=Lin, tags=["param-hooks", "hooks"], note="a hook zeroing l1.bias's gradient (frozen by hook)")
R("param-hook-two-on-one", with_param_hooks(Lin, _two_hooks), vec(4), reference_build=Lin,
  tags=["param-hooks", "hooks"], note="two hooks on l1.weight (2 * g, then + 0.5)")
R("param-hook-conv-weight", with_param_hooks(_hook_conv, lambda m: m[0].weight.register_hook(lambda g: 0.25 * g)),
  shaped(1, 4, 4), reference_build=_hook_conv, tags=["param-hooks", "hooks", "conv"],
  note="a hook on a Conv2d weight")
R("param-hook-elephant-log-a", with_param_hooks(_hook_elephant_mlp, lambda m: m[2].log_a.register_hook(
    lambda g: 10.0 * g)), vec(3), reference_build=_hook_elephant_mlp, tags=["param-hooks", "hooks", "elephant"],
  note="a hook on an Elephant's log_a (mlp(..., 'elephant'))")
R("param-hook-elephant-log-h", with_param_hooks(ElephantNet, lambda m: m.act.log_h.register_hook(_double)), vec(4),
  reference_build=ElephantNet, tags=["param-hooks", "hooks", "elephant"], note="a hook on an Elephant's log_h")
R("param-hook-tied-embedding", with_param_hooks(TiedModules, lambda m: m.emb.weight.register_hook(lambda g: 3.0 * g)),
  ids(3, 5), reference_build=TiedModules, rule=["proj", "head.bias"], tags=["param-hooks", "hooks", "tying"],
  note="a hook on a weight tied between an Embedding and the head")
R("param-hook-parametrization-original", with_param_hooks(new_weight_norm_linear, lambda m: m[0].parametrizations
                                                          .weight.original1.register_hook(_double)), vec(4),
  reference_build=new_weight_norm_linear, rule=["2"], tags=["param-hooks", "hooks", "parametrization"],
  note="a hook on weight_norm's direction parameter (original1)")
R("param-hook-params-subset", with_param_hooks(Lin, lambda m: m.l1.weight.register_hook(_double)), vec(4),
  reference_build=Lin, params=["l1.weight", "l2.bias"], tags=["param-hooks", "hooks", "params"],
  note="the hooked parameter selected with params=")

# -- cases that used to give unclear errors or misleading warnings
R("sparse-embedding", SparseEmbedding, ids(3, 7), rule=["l1", "head"], maybe_rule=["emb"], vmap_fails=None,
  tags=["embedding", "vmap"], note="nn.Embedding(sparse=True): func is exact or raises its documented error")
R("checkpoint-nonreentrant", lambda: Checkpointed(use_reentrant=False), vec(4), rule=["inp", "head"],
  maybe_rule=["block"], vmap_fails=None, tags=["checkpoint"],
  note="a block under torch.utils.checkpoint(use_reentrant=False) (recomputed in backward)")
R("checkpoint-nonreentrant-on-input", lambda: Checkpointed(use_reentrant=False, on_input=True), vec(4),
  rule=["inp", "head"], maybe_rule=["block"], vmap_fails=None, tags=["checkpoint"],
  note="the same, checkpointing the first block on the input itself (which does not require grad)")
R("inplace-relu-on-input", InplaceReluInput, vec(4), rule=["l2"], maybe_rule=["l1"], tags=["inplace"],
  note="nn.ReLU(inplace=True) on the input first: the caller's x must be left as it was")
R("transformer-encoder", EncoderNet, shaped(4, 4), rule=["head"], maybe_rule=["enc"],
  tags=["sequence", "attention"], note="nn.TransformerEncoder, batch_first, eval, enable_nested_tensor default")
R("transformer-encoder-key-padding", lambda: EncoderNet(padded=True), padded_sequences, rule=["head"],
  maybe_rule=["enc"], vmap_fails=None, tags=["sequence", "attention", "pytree", "vmap"],
  note="the same with a key padding mask, pooled over every position: without gradients torch's fused path"
       " (nested tensors) would zero the padded positions; vmap cannot run the fused path's mask check, which"
       " the engine turns off")

# -- aliased modules
R("aliased-conv-backbone", AliasedConvBackbone, shaped(1, 4, 4), rule=["backbone.0", "head"],
  tags=["sharing", "conv"], note="self.features = self.backbone with a Conv2d, called under the alias")
R("aliased-groupnorm", lambda: AliasedNorm(both=False), vec(4), rule=["l1", "l2"], tags=["sharing"],
  note="a GroupNorm under two names, called once under the alias")
R("aliased-groupnorm-called-under-both", lambda: AliasedNorm(both=True), vec(4), rule=["l1", "l2"],
  tags=["sharing"], note="a GroupNorm under two names, called once under each")
R("aliased-elephant", AliasedElephant, vec(4), tags=["sharing", "elephant"],
  note="an Elephant under two names, called once under the alias")
