"""Measures of lost plasticity and of interference that papers on forgetting report beside the gradient covariance.

Pure functions of tensors (features, activations, kernels, covariances); the ``plasticity`` probe
(:class:`probes.builtin.PlasticityProbe`) computes them during training. Each threshold is an explicit argument.

Side by side, the unit-level measures (both in :mod:`interference.sparsity`):

* :func:`~interference.sparsity.dormant_scores` / :func:`~interference.sparsity.dormant_units`: ReDo's dormancy (Sokar et al. 2023): a unit's mean ``|h|`` over
  the inputs divided by the layer's mean of that; dormant at or below ``tau`` (0.025 and 0.1 are the usual
  values; ``tau = 0`` counts only units that are zero on every input, a ReLU's "dead" units).
* :func:`interference.sparsity.saturated_units`: the unit's *derivative* is ``<= eps`` on (a fraction of) the inputs:
  it passes no gradient down, which covers dead ReLUs, saturated Tanh and Elephant units on their flat tails alike
  (ReDo's score misses the last two: their outputs are not small).

ReDo's score was made for ReLU networks. A local activation such as Elephant has a small mean ``|output|`` by
design (each unit answers on a part of the input space), so ReDo calls many of its units dormant (30-50 % of a DQN's
on MountainCar) that still learn; for Elephant read the derivative view and the effective rank.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["singular_values", "effective_rank", "srank", "feature_norm", "kernel_effective_rank", "condition_number",
           "nonzero_spectrum", "numerical_rank", "nonzero_condition_number", "interference_mass"]


def _matrix(name: str, x: Tensor) -> Tensor:
    if not isinstance(x, Tensor) or x.dim() < 2 or x.shape[0] == 0:
        raise ValueError(f"{name}: expected a tensor (N, ..., d) of N >= 1 rows, got "
                         f"{getattr(x, 'shape', type(x).__name__)}")
    return x.detach().reshape(-1, x.shape[-1]).to(torch.float64)


def singular_values(features: Tensor) -> Tensor:
    """Singular values (descending) of a feature matrix ``(N, d)`` (extra leading dims are flattened into N)."""
    return torch.linalg.svdvals(_matrix("singular_values", features))


def _entropy_rank(values: Tensor) -> float:
    total = values.sum()
    if total <= 0:
        return 0.0
    p = values[values > 0] / total
    return float(torch.exp(-(p * p.log()).sum()))


def effective_rank(features: Tensor) -> float:
    """Effective rank of features ``(N, d)`` (Roy and Vetterli 2007): ``exp`` of the entropy of the singular values
    normalised to sum 1; between 1 (one direction) and ``min(N, d)`` (all equal); 0 for all-zero features."""
    return _entropy_rank(singular_values(features))


def srank(features: Tensor, delta: float = 0.01) -> int:
    """``srank_delta`` of features ``(N, d)`` (Kumar et al. 2021): the smallest ``k`` whose ``k`` largest singular
    values hold at least ``1 - delta`` of their sum (0 for all-zero features)."""
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"srank: delta must be in [0, 1), got {delta!r}")
    s = singular_values(features)
    total = s.sum()
    if total <= 0:
        return 0
    cumulative = torch.cumsum(s, 0) / total
    return int(torch.searchsorted(cumulative, torch.tensor(1.0 - delta, dtype=cumulative.dtype)).item()) + 1


def feature_norm(features: Tensor) -> float:
    """Mean over the N inputs of the L2 norm of each input's feature vector ``(N, d)``."""
    return float(_matrix("feature_norm", features).norm(dim=1).mean())


def _kernel(name: str, k: Tensor) -> Tensor:
    if not isinstance(k, Tensor) or k.dim() != 2 or k.shape[0] != k.shape[1] or k.shape[0] == 0:
        raise ValueError(f"{name}: expected a square kernel matrix (N, N), got {getattr(k, 'shape', k)}")
    k = k.detach().to(torch.float64)
    return (k + k.T) / 2


def kernel_effective_rank(kernel: Tensor) -> float:
    """Effective rank of a PSD kernel ``(N, N)`` (e.g. an NTK on the probe inputs): the entropy rank of its
    eigenvalues (negatives from round-off clipped to 0)."""
    return _entropy_rank(torch.linalg.eigvalsh(_kernel("kernel_effective_rank", kernel)).clamp(min=0))


def condition_number(kernel: Tensor) -> float:
    """``lambda_max / lambda_min`` of a symmetric PSD kernel ``(N, N)``, with ``lambda_min`` taken no smaller than
    round-off (``N * eps(float64) * lambda_max``), as a singular value decomposition would see it: a singular kernel
    gives about ``1 / (N * 2.2e-16)``, not a value set by round-off; ``inf`` for a kernel with no positive
    eigenvalue."""
    eig = torch.linalg.eigvalsh(_kernel("condition_number", kernel))
    top = float(eig[-1])
    if top <= 0:
        return math.inf
    floor = len(eig) * torch.finfo(torch.float64).eps * top
    return top / max(float(eig[0]), floor)


def _tolerance(kernel: Tensor, rtol: float | None) -> float:
    """``rtol``, default ``N * eps`` of the dtype the kernel was computed in (numpy's ``matrix_rank`` tolerance)."""
    if rtol is None:
        dtype = kernel.dtype if kernel.dtype.is_floating_point else torch.float64
        return kernel.shape[0] * torch.finfo(dtype).eps
    if not (isinstance(rtol, (int, float)) and 0.0 <= rtol < 1.0):
        raise ValueError(f"rtol must be a number in [0, 1), got {rtol!r}")
    return float(rtol)


def nonzero_spectrum(kernel: Tensor, rtol: float | None = None) -> Tensor:
    """The numerically non-zero eigenvalues (descending, float64) of a symmetric PSD kernel ``(N, N)``: those above
    ``rtol * lambda_max``.

    The default ``rtol = N * eps`` takes ``eps`` of the kernel's own dtype (``1.19e-7`` for float32, ``2.2e-16`` for
    float64): the numerical-rank tolerance of ``numpy.linalg.matrix_rank`` (``S.max() * max(M, N) * eps``), since
    eigenvalues below it are round-off of the computation that made the kernel. Eigenvalues are computed in float64
    on the symmetrised kernel ``(K + K^T) / 2``; negative ones (round-off) are never kept. Empty for a kernel with
    no positive eigenvalue.
    """
    k = _kernel("nonzero_spectrum", kernel)
    eig = torch.linalg.eigvalsh(k).flip(0)
    tol = _tolerance(kernel, rtol)
    top = float(eig[0])
    return eig[:0] if top <= 0 else eig[eig > tol * top]


def numerical_rank(kernel: Tensor, rtol: float | None = None) -> int:
    """Numerical rank of a symmetric PSD kernel ``(N, N)``: the number of its eigenvalues above ``rtol *
    lambda_max`` (:func:`nonzero_spectrum`; the default tolerance is ``numpy.linalg.matrix_rank``'s)."""
    return len(nonzero_spectrum(kernel, rtol))


def nonzero_condition_number(kernel: Tensor, rtol: float | None = None) -> float:
    """Condition number of a symmetric PSD kernel ``(N, N)`` on its numerically non-zero spectrum:
    ``lambda_max / lambda_min`` over the eigenvalues above ``rtol * lambda_max`` (:func:`nonzero_spectrum`; default
    ``rtol = N * eps`` of the kernel's dtype).

    Unlike :func:`condition_number`, a singular kernel (an NTK of more inputs than its rank, e.g. nearby probe inputs
    of a low-dimensional task) does not read as the round-off floor ``1 / (N eps)``: the value says how spread the
    directions the kernel does span are, between 1 (all equal, or rank 1) and ``1 / rtol``. Read it with
    :func:`numerical_rank` (the number of eigenvalues it is taken over). NaN for a kernel with no positive
    eigenvalue.
    """
    eig = nonzero_spectrum(kernel, rtol)
    return math.nan if len(eig) == 0 else float(eig[0] / eig[-1])


def interference_mass(c: Tensor) -> tuple[float, float]:
    """``(negative, positive)``: the shares of the off-diagonal mass ``sum_{i != j} |C_ij|`` of a gradient covariance
    ``(k, k)`` that is negative (interference: a step on one sample raises another's loss) and positive
    (generalisation); they add up to 1 (both NaN when every off-diagonal entry is 0)."""
    c = _kernel("interference_mass", c)
    off = c[~torch.eye(len(c), dtype=torch.bool)]
    total = off.abs().sum()
    if total == 0:
        return math.nan, math.nan
    negative = float((-off).clamp(min=0).sum() / total)
    return negative, 1.0 - negative
