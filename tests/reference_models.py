"""A shared registry of small models and slow, obviously correct references (float64 autograd loops)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from interference import mlp


class Scale(nn.Module):
    """A module type the layer-wise path does not know: y = x * s (per-feature parameter)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.linspace(0.5, 1.5, n))

    def forward(self, x):
        return x * self.s


class Shared(nn.Module):
    """The same Linear applied twice (weight sharing)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 6)
        self.mid = nn.Linear(6, 6)
        self.out = nn.Linear(6, 2)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        h = torch.tanh(self.mid(h))
        h = torch.tanh(self.mid(h))
        return self.out(h)


class Sequence(nn.Module):
    """Linear layers on (N, T, F) inputs (weights shared over T), a 2-output head."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 5)
        self.ln = nn.LayerNorm(5)
        self.l2 = nn.Linear(5, 2)

    def forward(self, x):
        return self.l2(torch.relu(self.ln(self.l1(x.reshape(x.shape[0], 2, 2).repeat(1, 1, 2))))).mean(1)


class WithBuffers(nn.Module):
    """BatchNorm (eval mode: running statistics are buffers) and a scaling buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.l2 = nn.Linear(8, 3)
        self.register_buffer("scale", torch.tensor(0.7))
        self.bn.running_mean.uniform_(-0.5, 0.5)
        self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return self.l2(torch.relu(self.bn(self.l1(x)))) * self.scale


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, stride=2, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(4, 3, 2, groups=1), nn.ReLU(),
        nn.Conv2d(3, 3, 1, groups=3),  # grouped: not covered by the layer-wise path
        nn.Flatten(), nn.Linear(3 * 3 * 3, 5),
    )


def frozen_mlp() -> nn.Module:
    net = mlp(4, [12, 10], 3, "tanh")
    net[0].weight.requires_grad_(False)
    net[2].bias.requires_grad_(False)
    return net


def multi_output() -> nn.Module:
    return nn.Sequential(mlp(4, [9], 6, "elu"), nn.Unflatten(1, (2, 3)))


# name -> (factory, input shape per sample)
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    **{f"mlp-{a}": (lambda a=a: mlp(4, [10], 3, a), (4,)) for a in ("relu", "tanh", "sigmoid", "elu")},
    "mlp-maxout": (lambda: mlp(4, [15], 3, "maxout", {"k": 5}), (4,)),
    "mlp-lwta": (lambda: mlp(4, [15], 3, "lwta", {"k": 5}), (4,)),
    "mlp-fta": (lambda: mlp(4, [3], 3, "fta", {"k": 4, "bound": 2.0}), (4,)),
    "mlp-elephant-ln": (lambda: mlp(4, [10, 8], 3, "elephant", {"a": 0.5}), (4,)),
    "mlp-elephant-frozen-ha": (lambda: mlp(4, [10], 2, "elephant", {"d": 8, "a": 0.6, "learnable": False},
                                           layer_norm=False, sigma_bias=1.0), (4,)),
    "elephant-shared-ha": (lambda: nn.Sequential(nn.Linear(4, 6), mlp_elephant_shared(), nn.Linear(6, 2)), (4,)),
    "cnn": (small_cnn, (2, 8, 8)),
    "frozen": (frozen_mlp, (4,)),
    "buffers": (WithBuffers, (4,)),
    "multi-output": (multi_output, (4,)),
    "unknown-module": (lambda: nn.Sequential(nn.Linear(4, 5), Scale(5), nn.Tanh(), nn.Linear(5, 2)), (4,)),
    "shared-module": (Shared, (4,)),
    "sequence": (Sequence, (4,)),
}


def mlp_elephant_shared() -> nn.Module:
    from interference import Elephant
    return Elephant(d=4, a=0.7)


def build(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = MODELS[name][0]().double()
    return model.eval()


def inputs(name: str, n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((n, *MODELS[name][1]), generator=g, dtype=torch.float64)


def trainable(model: nn.Module, names: Iterable[str] | None = None) -> list[nn.Parameter]:
    named = dict(model.named_parameters())
    return [p for k, p in named.items() if (p.requires_grad if names is None else k in names)]


def flat_grad(value: torch.Tensor, params: list[nn.Parameter]) -> torch.Tensor:
    grads = torch.autograd.grad(value, params, retain_graph=True, allow_unused=True)
    return torch.cat([torch.zeros(p.numel(), dtype=p.dtype) if g is None else g.reshape(-1)
                      for g, p in zip(grads, params)])


def brute_force_jacobian(model: nn.Module, x: torch.Tensor, params: list[nn.Parameter]) -> torch.Tensor:
    """(N, O, P): one sample and one output at a time."""
    rows = []
    for i in range(x.shape[0]):
        out = model(x[i:i + 1]).reshape(-1)
        rows.append(torch.stack([flat_grad(out[o], params) for o in range(out.numel())]))
    return torch.stack(rows)


def brute_force_ntk(model: nn.Module, x: torch.Tensor, xt: torch.Tensor, names=None) -> torch.Tensor:
    params = trainable(model, names)
    j1, j2 = brute_force_jacobian(model, x, params), brute_force_jacobian(model, xt, params)
    return torch.einsum("nop,mqp->nmoq", j1, j2)
