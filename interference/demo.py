"""A one-minute tour of the core: the paper's sparsity table and the locality of the Elephant NTK.

    python -m interference.demo
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from .activations import elephant
from .nets import mlp
from .ntk import ntk
from .sparsity import sparsity_limit

PAPER_SPARSITY = {"relu": (0.5, 0.5), "sigmoid": (0.5, 1.0), "tanh": (0.0, 1.0), "elu": (0.0, 0.5),
                  "elephant": (1.0, 1.0)}
FUNCTIONS = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "elu": F.elu,
             "elephant": lambda x: elephant(x, 1.0, 0.2, 4.0)}


def sparsity_table() -> list[tuple[str, float, float, float, float]]:
    """(activation, S(sigma) measured, paper, S(sigma') measured, paper) for the paper's five activations."""
    rows = []
    for name, fn in FUNCTIONS.items():
        f = sparsity_limit(fn).estimate
        g = sparsity_limit(fn, gradient=True).estimate
        rows.append((name, f, PAPER_SPARSITY[name][0], g, PAPER_SPARSITY[name][1]))
    return rows


def ntk_locality(x_t: float = 1.0, far: float = 0.5) -> dict[str, float]:
    """Mean |NTK(x, x_t)| / NTK(x_t, x_t) over x in [0, 2] with |x - x_t| > far, for the streaming-sine nets."""
    x = torch.linspace(0, 2, 201, dtype=torch.float64)[:, None]
    xt = torch.tensor([[x_t]], dtype=torch.float64)
    out = {}
    for act, kwargs, sigma in (("elephant", {"d": 8, "a": 0.08, "learnable": False}, 1.28), ("relu", {}, None)):
        torch.manual_seed(0)
        net = mlp(1, [1000], 1, act, kwargs, layer_norm=False, sigma_bias=sigma, output_bias=False).double()
        k = ntk(net, x, xt, output="trace")[:, 0]
        mask = (x[:, 0] - x_t).abs() > far
        out[act] = float(k[mask].abs().mean() / ntk(net, xt, output="trace")[0, 0])
    return out


def main() -> None:
    torch.set_num_threads(1)
    print("Function and gradient sparsity S(sigma), S(sigma') (paper's Definition 1; eps -> 0, C -> inf)")
    print(f"{'activation':12s} {'S(f) measured':>14s} {'paper':>6s} {'S(grad) measured':>16s} {'paper':>6s}")
    for name, f, pf, g, pg in sparsity_table():
        print(f"{name:12s} {f:14.3f} {pf:6.2f} {g:16.3f} {pg:6.2f}")
    print("\nNTK locality on the streaming-sine net (1-1000-1, at initialisation, x_t = 1):")
    for act, v in ntk_locality().items():
        print(f"  {act:9s} mean |NTK(x, x_t)| / NTK(x_t, x_t) for |x - x_t| > 0.5: {v:.3f}")


if __name__ == "__main__":
    main()
