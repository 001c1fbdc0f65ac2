"""Closed forms from the paper, used as test oracles and teaching aids."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

__all__ = ["one_hidden_layer_ntk"]


def one_hidden_layer_ntk(
    v: Tensor,
    b: Tensor,
    u: Tensor,
    sigma: Callable[[Tensor], Tensor],
    dsigma: Callable[[Tensor], Tensor],
    x: Tensor,
    xt: Tensor,
) -> Tensor:
    """Lemma 1: the NTK of ``f(x) = u^T sigma(V x + b)`` over ``w = {u, V, b}``.

    ``K(x, x_t) = sigma(Vx+b)^T sigma(Vx_t+b) + (x^T x_t + 1) (u o sigma'(Vx+b))^T (u o sigma'(Vx_t+b))``.
    The paper's statement writes the second term as ``u^T u (x^T x_t + 1) sigma'^T sigma'``; that last step of its
    proof does not hold in general (``(u o a)^T (u o b) != u^T u a^T b``). The proof's Hadamard form, one line
    earlier, is the exact NTK and is what this function returns.

    Shapes: ``v`` (m, n), ``b`` (m,), ``u`` (m,), ``x`` (N, n), ``xt`` (M, n) -> ``(N, M)``.
    """
    if v.dim() != 2 or b.shape != (v.shape[0],) or u.shape != (v.shape[0],):
        raise ValueError(f"expected v (m, n), b (m,), u (m,), got {tuple(v.shape)}, {tuple(b.shape)}, {tuple(u.shape)}")
    if x.dim() != 2 or xt.dim() != 2 or x.shape[1] != v.shape[1] or xt.shape[1] != v.shape[1]:
        raise ValueError(f"expected x (N, {v.shape[1]}) and xt (M, {v.shape[1]}), got {tuple(x.shape)}, {tuple(xt.shape)}")
    z, zt = x @ v.T + b, xt @ v.T + b
    return sigma(z) @ sigma(zt).T + (x @ xt.T + 1.0) * ((u * dsigma(z)) @ (u * dsigma(zt)).T)
