"""MLPs built with the paper's conventions, and width matching by parameter count.

Conventions (paper, appendix "Experimental Details"): PyTorch-default weights U[-1/sqrt(fan_in), 1/sqrt(fan_in)];
each activation's spec (:mod:`interference.activation_spec`) says by default whether a LayerNorm comes before it
and whether the hidden biases are spread evenly over [-sqrt(3) sigma_bias, +sqrt(3) sigma_bias] (Elephant: both,
sigma_bias 0.4) or zero (every other built-in activation); callers override both.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from .activation_spec import activation_spec

__all__ = ["spread_bias_", "mlp", "hidden_layer", "nature_cnn", "count_parameters", "match_width"]


def spread_bias_(bias: torch.Tensor, sigma_bias: float) -> torch.Tensor:
    """Fill ``bias`` (shape ``(n,)``) in place with ``n`` evenly spaced values over [-sqrt(3) s, +sqrt(3) s].

    The spread has standard deviation close to ``sigma_bias`` (exactly it as n grows).
    """
    if not math.isfinite(sigma_bias) or sigma_bias < 0:
        raise ValueError(f"sigma_bias must be a non-negative finite number, got {sigma_bias!r}")
    if bias.dim() != 1:
        raise ValueError(f"spread_bias_ expects a 1-D bias, got shape {tuple(bias.shape)}")
    r = math.sqrt(3.0) * sigma_bias
    with torch.no_grad():
        bias.copy_(torch.linspace(-r, r, bias.numel(), dtype=bias.dtype, device=bias.device))
    return bias


def hidden_layer(
    in_features: int,
    width: int,
    activation: str = "relu",
    act_kwargs: Mapping[str, Any] | None = None,
    *,
    layer_norm: bool | None = None,
    sigma_bias: float | None = None,
) -> tuple[list[nn.Module], int]:
    """One hidden block ``Linear(in, width) [-> LayerNorm(width)] -> activation`` with the paper's biases.

    ``layer_norm=None`` and ``sigma_bias=None`` take the activation spec's defaults (Elephant: LayerNorm and 0.4;
    the others: neither); ``sigma_bias`` 0 or None gives zero biases. Returns the modules and the block's output
    width.
    """
    spec = activation_spec(activation)
    act = spec.build(width, **dict(act_kwargs or {}))
    linear = nn.Linear(in_features, width)
    sigma = spec.sigma_bias if sigma_bias is None else sigma_bias
    if sigma:
        spread_bias_(linear.bias, sigma)
    else:
        nn.init.zeros_(linear.bias)
    use_ln = spec.layer_norm if layer_norm is None else layer_norm
    modules: list[nn.Module] = [linear] + ([nn.LayerNorm(width)] if use_ln else []) + [act]
    return modules, spec.output_width(act, width)


def mlp(
    in_features: int,
    hidden: Sequence[int],
    out_features: int,
    activation: str = "relu",
    act_kwargs: Mapping[str, Any] | None = None,
    *,
    layer_norm: bool | None = None,
    sigma_bias: float | None = None,
    output_bias: bool = True,
) -> nn.Sequential:
    """An MLP ``(N, in_features) -> (N, out_features)`` with ``hidden`` Linear widths and the paper's conventions.

    ``hidden`` gives the output width of each hidden Linear layer (Maxout then reduces it by ``k``, FTA expands it
    by ``k``). See :func:`hidden_layer` for ``layer_norm`` and ``sigma_bias``.
    """
    for name, n in (("in_features", in_features), ("out_features", out_features), *(("hidden width", w) for w in hidden)):
        if not isinstance(n, int) or n <= 0:
            raise ValueError(f"mlp: {name} must be a positive int, got {n!r}")
    layers: list[nn.Module] = []
    width = in_features
    for w in hidden:
        block, width = hidden_layer(width, w, activation, act_kwargs, layer_norm=layer_norm, sigma_bias=sigma_bias)
        layers += block
    head = nn.Linear(width, out_features, bias=output_bias)
    if output_bias:
        nn.init.zeros_(head.bias)
    layers.append(head)
    return nn.Sequential(*layers)


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of (trainable) scalar parameters of ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def _mlp_parameters(in_features: int, width: int, depth: int, out_features: int, activation: str,
                    act_kwargs: Mapping[str, Any] | None, output_bias: bool, layer_norm: bool | None = None) -> int:
    with torch.device("meta"):
        net = mlp(in_features, [width] * depth, out_features, activation, act_kwargs, layer_norm=layer_norm,
                  output_bias=output_bias)
    return count_parameters(net)


def match_width(
    activation: str,
    in_features: int,
    out_features: int,
    *,
    reference: tuple[str, int] = ("elephant", 1000),
    depth: int = 1,
    act_kwargs: Mapping[str, Any] | None = None,
    reference_kwargs: Mapping[str, Any] | None = None,
    output_bias: bool = True,
    layer_norm: bool | None = None,
) -> int:
    """Hidden width for ``activation`` whose MLP has about as many parameters as the ``reference`` MLP.

    ``reference`` is ``(activation, width)`` with its spec's default conventions; ``layer_norm`` is the matched
    MLP's (``None``: its spec's default), whose parameters count too. Widths stay multiples of the spec's
    ``width_multiple`` (Maxout/LWTA: ``k``). Example: on MountainCar (2 inputs, 3 actions) with Elephant 1000 as
    reference this gives ReLU 1667, FTA(k=20) 159, Maxout(k=5) 2780; the paper rounds these to 1700 / 170 / 3000.
    """
    target = _mlp_parameters(in_features, reference[1], depth, out_features, reference[0], reference_kwargs,
                             output_bias)
    kwargs = dict(act_kwargs or {})
    spec = activation_spec(activation)
    step = spec.width_multiple(spec.build(1, **kwargs))

    def count(w: int) -> int:
        return _mlp_parameters(in_features, w, depth, out_features, activation, kwargs, output_bias, layer_norm)

    lo, hi = step, step
    while count(hi) < target:
        lo, hi = hi, hi * 2
    while hi - lo > step:  # parameter count grows with width: bisect on multiples of step
        mid = (lo + hi) // (2 * step) * step
        lo, hi = (mid, hi) if count(mid) < target else (lo, mid)
    return min((lo, hi), key=lambda w: (abs(count(w) - target), w))


def nature_convs(in_channels: int) -> nn.Sequential:
    """The Nature-DQN convolutions with ReLU, flattened: ``(N, C, H, W) -> (N, 64 h w)`` (3136 features at 84x84)."""
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 8, stride=4), nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
        nn.Flatten(),
    )


def nature_cnn(
    in_channels: int = 4,
    out_features: int = 18,
    activation: str = "relu",
    act_kwargs: Mapping[str, Any] | None = None,
    *,
    hidden: int = 512,
    sigma_bias: float | None = None,
) -> nn.Sequential:
    """The Nature-DQN network ``(N, C, 84, 84) -> (N, out_features)``; only the penultimate layer takes ``activation``.

    The convolutions keep ReLU, as in the paper's Atari set-up; the ``hidden``-unit layer follows
    :func:`hidden_layer` (the activation's default LayerNorm and bias spread).
    """
    convs = nature_convs(in_channels)
    block, width = hidden_layer(64 * 7 * 7, hidden, activation, act_kwargs, sigma_bias=sigma_bias)
    return nn.Sequential(*convs, *block, nn.Linear(width, out_features))
