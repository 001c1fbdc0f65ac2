"""SR-NN's Set-KL sparsity regulariser (Liu, Kumaraswamy, Le, White 2019, "The utility of sparse
representations for control in reinforcement learning").

For a set of samples, each hidden unit's mean activation ``beta_hat_j`` is pushed towards a small target ``beta``
by ``sum_j KL(beta || beta_hat_j)`` with the Bernoulli KL ``beta log(beta/b) + (1-beta) log((1-beta)/(1-b))``.
The KL needs ``b`` in (0, 1): activations are averaged and clamped to ``[tiny, 1 - tiny]``, which leaves
ReLU/Sigmoid features as they are in the typical sparse regime and caps the penalty for Tanh/ELU's negative or
large values. In the streaming task the "set" is the sample being learned (a batch of one).
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["set_kl_penalty"]

_TINY = 1e-6


def set_kl_penalty(hidden: Tensor, beta: float) -> Tensor:
    """``sum_j KL(beta || mean_set h_j)`` for hidden features ``(..., set, units)``; returns shape ``(...)``."""
    if not 0.0 < beta < 1.0:
        raise ValueError(f"SR-NN beta must be in (0, 1), got {beta!r}")
    b = hidden.mean(dim=-2).clamp(_TINY, 1.0 - _TINY)
    kl = beta * (beta / b).log() + (1.0 - beta) * ((1.0 - beta) / (1.0 - b)).log()
    return kl.sum(dim=-1)
