"""Stable-Baselines3 policies whose hidden layers carry any activation of :mod:`interference.activations`.

Everything goes through SB3's documented seams: policy classes passed as ``policy=...`` and their keyword
arguments passed as ``policy_kwargs``, plus a features extractor class for image observations. Every policy takes

* ``activation``: a registered activation name (``elephant``, ``relu``, ``maxout``, ``fta``, ...);
* ``act_kwargs``: its arguments (``d``, ``h``, ``a`` for Elephant, ``k`` for Maxout/LWTA/FTA, ...);
* ``layer_norm``: LayerNorm before the activation (``None``: the activation spec's default, on for Elephant);
* ``sigma_bias``: spread of the hidden biases (``None``: the spec's default, 0.4 for Elephant, else zero biases);
* ``act_layers`` (PPO and SAC): ``"all"`` hidden layers carry the activation, or the ``"last"`` only (``Linear ->
  ReLU`` before it, as the authors' SAC places FTA);

and builds its hidden blocks with :func:`interference.nets.hidden_layer` (``Linear [-> LayerNorm] -> act``).
``net_arch`` holds the hidden Linear widths actually built (width matching happens before, in the config).

The paper's spread-bias initialisation is re-applied after SB3's own initialisation (PPO's orthogonal init
zeroes every bias): each hidden Linear that needs spread biases is tagged with ``spread_sigma_bias`` and
:func:`reapply_spread_bias` restores them.

Policies: :class:`ActDQNPolicy` (DQN), :class:`ActActorCriticPolicy` (PPO/A2C), :class:`ActSACPolicy` (SAC);
features extractors :class:`ActNatureCNN` (Nature-DQN convolutions with ReLU, the 512-unit layer with the
chosen activation) and :class:`ActMinAtarCNN` (MinAtar's 16-channel convolution, a 128-unit layer with it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy, ContinuousCritic
from stable_baselines3.common.preprocessing import get_action_dim
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from stable_baselines3.dqn.policies import DQNPolicy, QNetwork
from stable_baselines3.sac.policies import Actor, SACPolicy
from torch import nn

from interference.activation_spec import activation_spec
from interference.nets import hidden_layer, nature_convs, spread_bias_

__all__ = [
    "ActNatureCNN", "ActMlpExtractor", "ActQNetwork", "ActDQNPolicy", "ActActorCriticPolicy", "ActActor",
    "ActCritic", "ActSACPolicy", "act_blocks", "reapply_spread_bias", "cnn_flat_features", "SPREAD_ATTR",
    "MinAtarConv", "ActMinAtarCNN", "minatar_flat_features", "ACT_LAYERS",
]

SPREAD_ATTR = "spread_sigma_bias"  # tag on a hidden nn.Linear whose bias follows the paper's spread init
#: which hidden layers carry the chosen activation: all, or the last only (ReLU before it)
ACT_LAYERS = ("all", "last")


def _spec(activation: str, act_kwargs: Mapping[str, Any] | None, layer_norm: bool | None,
          sigma_bias: float | None, act_layers: str | None = None) -> dict[str, Any]:
    """The policy's activation arguments (``act_layers`` only for the policies that take it)."""
    spec = {"activation": activation_spec(activation).name, "act_kwargs": dict(act_kwargs or {}),
            "layer_norm": layer_norm, "sigma_bias": sigma_bias}
    if act_layers is not None:
        spec["act_layers"] = act_layers
    return spec


def act_blocks(in_features: int, widths: Sequence[int], activation: str = "relu",
               act_kwargs: Mapping[str, Any] | None = None, *, layer_norm: bool | None = None,
               sigma_bias: float | None = None, act_layers: str = "all") -> tuple[list[nn.Module], int]:
    """Hidden blocks ``Linear(w) [-> LayerNorm] -> activation`` for each width (``act_layers="last"``: the blocks
    before the last are ``Linear(w) -> ReLU`` with zero biases); returns the modules and the width the last block
    outputs (Maxout divides by ``k``, FTA multiplies by ``k``). Hidden Linears with spread biases are tagged for
    :func:`reapply_spread_bias`."""
    if act_layers not in ACT_LAYERS:
        raise ValueError(f"act_layers must be one of {', '.join(ACT_LAYERS)}, got {act_layers!r}")
    layers: list[nn.Module] = []
    width = int(in_features)
    spread = activation_spec(activation).sigma_bias if sigma_bias is None else sigma_bias
    for i, w in enumerate(widths):
        if act_layers == "last" and i < len(widths) - 1:
            block, width = hidden_layer(width, int(w), "relu", layer_norm=False, sigma_bias=0.0)
            layers += block
            continue
        block, width = hidden_layer(width, int(w), activation, act_kwargs, layer_norm=layer_norm,
                                    sigma_bias=sigma_bias)
        if spread:
            setattr(block[0], SPREAD_ATTR, float(spread))
        layers += block
    return layers, width


def _head(in_features: int, out_features: int) -> nn.Linear:
    head = nn.Linear(in_features, out_features)
    nn.init.zeros_(head.bias)  # the paper: zero biases except the spread hidden ones
    return head


def reapply_spread_bias(module: nn.Module) -> int:
    """Re-apply the paper's spread biases to every tagged Linear in ``module``; returns how many were set."""
    n = 0
    for m in module.modules():
        sigma = getattr(m, SPREAD_ATTR, None)
        if sigma is not None and isinstance(m, nn.Linear) and m.bias is not None:
            spread_bias_(m.bias, sigma)
            n += 1
    return n


# --- image observations ---------------------------------------------------------------------------------


def cnn_flat_features(observation_shape: Sequence[int]) -> int:
    """Flattened width after the Nature-DQN convolutions for a ``(C, H, W)`` observation."""
    _, h, w = observation_shape
    for kernel, stride in ((8, 4), (4, 2), (3, 1)):
        h, w = (h - kernel) // stride + 1, (w - kernel) // stride + 1
    if h < 1 or w < 1:
        raise ValueError(f"observation {tuple(observation_shape)} is too small for the Nature-DQN convolutions")
    return 64 * h * w


class ActNatureCNN(BaseFeaturesExtractor):
    """Nature-DQN features: three ReLU convolutions, then one ``features_dim``-unit hidden block with the chosen
    activation (with its spec's or the given LayerNorm and bias spread), as in the paper's Atari set-up.

    Observations are ``(C, H, W)`` images (SB3 transposes channel-last images and divides by 255).
    ``features_dim`` is the Linear width; the extractor outputs its activation's width (FTA: ``k`` times more).
    """

    def __init__(self, observation_space: gym.Space, features_dim: int = 512, activation: str = "relu",
                 act_kwargs: Mapping[str, Any] | None = None, layer_norm: bool | None = None,
                 sigma_bias: float | None = None) -> None:
        if not isinstance(observation_space, spaces.Box) or len(observation_space.shape) != 3:
            raise ValueError(f"ActNatureCNN needs (C, H, W) image observations, got {observation_space}")
        spec = _spec(activation, act_kwargs, layer_norm, sigma_bias)
        super().__init__(observation_space, features_dim)
        n_input_channels = observation_space.shape[0]
        self.cnn = nature_convs(n_input_channels)
        n_flatten = cnn_flat_features(observation_space.shape)
        block, width = act_blocks(n_flatten, [features_dim], **spec)
        self.linear = nn.Sequential(*block)
        self._features_dim = width

    def forward(self, observations: th.Tensor) -> th.Tensor:
        return self.linear(self.cnn(observations))


def minatar_flat_features(observation_shape: Sequence[int]) -> int:
    """Flattened width after MinAtar's convolution (16 channels, 3x3, no padding) for an ``(H, W, C)`` observation."""
    h, w, _ = observation_shape
    return 16 * (h - 2) * (w - 2)


class MinAtarConv(BaseFeaturesExtractor):
    """MinAtar's convolution on boolean channel-last ``(H, W, C)`` observations: ``Conv2d(C, 16, 3)`` -> ReLU ->
    flatten (``16 (H-2) (W-2)`` features; 1024 for the 10x10 games). The trunk of Rainbow on MinAtar."""

    def __init__(self, observation_space: gym.Space) -> None:
        if not isinstance(observation_space, spaces.Box) or len(observation_space.shape) != 3:
            raise ValueError(f"MinAtarConv needs (H, W, C) observations, got {observation_space}")
        super().__init__(observation_space, minatar_flat_features(observation_space.shape))
        self.cnn = nn.Sequential(nn.Conv2d(observation_space.shape[2], 16, kernel_size=3, stride=1), nn.ReLU(),
                                 nn.Flatten())

    def forward(self, observations: th.Tensor) -> th.Tensor:
        return self.cnn(observations.permute(0, 3, 1, 2).float())


class ActMinAtarCNN(BaseFeaturesExtractor):
    """MinAtar's baseline network up to its last hidden layer: :class:`MinAtarConv`, then one ``features_dim``-unit
    hidden block (default 128) with the chosen activation, its LayerNorm and bias spread (the DQN of MinAtar runs)."""

    def __init__(self, observation_space: gym.Space, features_dim: int = 128, activation: str = "relu",
                 act_kwargs: Mapping[str, Any] | None = None, layer_norm: bool | None = None,
                 sigma_bias: float | None = None) -> None:
        spec = _spec(activation, act_kwargs, layer_norm, sigma_bias)
        conv = MinAtarConv(observation_space)
        block, width = act_blocks(conv.features_dim, [features_dim], **spec)
        super().__init__(observation_space, width)
        self.conv = conv
        self.linear = nn.Sequential(*block)

    def forward(self, observations: th.Tensor) -> th.Tensor:
        return self.linear(self.conv(observations))


# --- DQN ------------------------------------------------------------------------------------------------


class ActQNetwork(QNetwork):
    """SB3's Q-network with hidden blocks from :func:`act_blocks` and a zero-bias output layer."""

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Discrete,
                 features_extractor: BaseFeaturesExtractor, features_dim: int, net_arch: list[int] | None = None,
                 activation_fn: type[nn.Module] = nn.ReLU, normalize_images: bool = True, *,
                 activation: str = "relu", act_kwargs: Mapping[str, Any] | None = None,
                 layer_norm: bool | None = None, sigma_bias: float | None = None) -> None:
        spec = _spec(activation, act_kwargs, layer_norm, sigma_bias)
        # SB3 builds a throw-away ReLU MLP; with net_arch=[] it is a single small Linear, replaced below
        super().__init__(observation_space, action_space, features_extractor, features_dim, net_arch=[],
                         activation_fn=activation_fn, normalize_images=normalize_images)
        self.net_arch = list(net_arch or [])
        self.act_spec = spec
        layers, width = act_blocks(features_dim, self.net_arch, **spec)
        self.q_net = nn.Sequential(*layers, _head(width, int(action_space.n)))

    def _get_constructor_parameters(self) -> dict[str, Any]:
        return {**super()._get_constructor_parameters(), **self.act_spec}


class ActDQNPolicy(DQNPolicy):
    """DQN policy (online and target Q-networks) with a chosen activation; use with ``ActNatureCNN`` as
    ``features_extractor_class`` for images (then ``net_arch=[]``: the activation sits in the extractor)."""

    def __init__(self, *args: Any, activation: str = "relu", act_kwargs: Mapping[str, Any] | None = None,
                 layer_norm: bool | None = None, sigma_bias: float | None = None, **kwargs: Any) -> None:
        self.act_spec = _spec(activation, act_kwargs, layer_norm, sigma_bias)  # read by make_q_net in __init__
        super().__init__(*args, **kwargs)

    def make_q_net(self) -> ActQNetwork:
        net_args = self._update_features_extractor(self.net_args, features_extractor=None)
        return ActQNetwork(**net_args, **self.act_spec).to(self.device)

    def _build(self, lr_schedule) -> None:
        super()._build(lr_schedule)
        reapply_spread_bias(self)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        return {**super()._get_constructor_parameters(), **self.act_spec}


# --- PPO / A2C ------------------------------------------------------------------------------------------


class ActMlpExtractor(nn.Module):
    """Separate actor and critic MLPs (SB3's ``MlpExtractor`` interface) built with :func:`act_blocks`.

    ``net_arch``: a list (the same widths for both) or ``dict(pi=[...], vf=[...])``.
    """

    def __init__(self, feature_dim: int, net_arch: Sequence[int] | Mapping[str, Sequence[int]],
                 activation: str = "relu", act_kwargs: Mapping[str, Any] | None = None,
                 layer_norm: bool | None = None, sigma_bias: float | None = None, act_layers: str = "all",
                 device: th.device | str = "auto") -> None:
        super().__init__()
        if isinstance(net_arch, Mapping):
            pi, vf = list(net_arch.get("pi", [])), list(net_arch.get("vf", []))
        else:
            pi = vf = list(net_arch)
        spec = _spec(activation, act_kwargs, layer_norm, sigma_bias, act_layers)
        pi_layers, self.latent_dim_pi = act_blocks(feature_dim, pi, **spec)
        vf_layers, self.latent_dim_vf = act_blocks(feature_dim, vf, **spec)
        self.policy_net = nn.Sequential(*pi_layers)
        self.value_net = nn.Sequential(*vf_layers)

    def forward(self, features: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        return self.forward_actor(features), self.forward_critic(features)

    def forward_actor(self, features: th.Tensor) -> th.Tensor:
        return self.policy_net(features)

    def forward_critic(self, features: th.Tensor) -> th.Tensor:
        return self.value_net(features)


class ActActorCriticPolicy(ActorCriticPolicy):
    """PPO/A2C actor-critic policy whose actor and critic MLPs carry the chosen activation.

    SB3's orthogonal initialisation (``ortho_init=True``) is kept for the weights; the spread biases it zeroes
    are re-applied afterwards.
    """

    def __init__(self, *args: Any, activation: str = "relu", act_kwargs: Mapping[str, Any] | None = None,
                 layer_norm: bool | None = None, sigma_bias: float | None = None, act_layers: str = "all",
                 **kwargs: Any) -> None:
        self.act_spec = _spec(activation, act_kwargs, layer_norm, sigma_bias, act_layers)
        super().__init__(*args, **kwargs)

    def _build_mlp_extractor(self) -> None:
        self.mlp_extractor = ActMlpExtractor(self.features_dim, self.net_arch, device=self.device, **self.act_spec)

    def _build(self, lr_schedule) -> None:
        super()._build(lr_schedule)
        reapply_spread_bias(self)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        return {**super()._get_constructor_parameters(), **self.act_spec}


# --- SAC ------------------------------------------------------------------------------------------------


class ActActor(Actor):
    """SAC actor: hidden blocks from :func:`act_blocks`, then SB3's mean and log-std layers (no gSDE)."""

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Box, net_arch: list[int],
                 features_extractor: nn.Module, features_dim: int, activation_fn: type[nn.Module] = nn.ReLU,
                 use_sde: bool = False, *args: Any, activation: str = "relu",
                 act_kwargs: Mapping[str, Any] | None = None, layer_norm: bool | None = None,
                 sigma_bias: float | None = None, act_layers: str = "all", **kwargs: Any) -> None:
        if use_sde:
            raise ValueError("ActActor does not support gSDE (use_sde=True)")
        spec = _spec(activation, act_kwargs, layer_norm, sigma_bias, act_layers)
        super().__init__(observation_space, action_space, [], features_extractor, features_dim, activation_fn,
                         use_sde, *args, **kwargs)
        self.net_arch = list(net_arch)
        self.act_spec = spec
        layers, width = act_blocks(features_dim, self.net_arch, **spec)
        action_dim = get_action_dim(self.action_space)
        self.latent_pi = nn.Sequential(*layers)
        self.mu = nn.Linear(width, action_dim)
        self.log_std = nn.Linear(width, action_dim)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        return {**super()._get_constructor_parameters(), **self.act_spec}


class ActCritic(ContinuousCritic):
    """SAC/TD3 twin critics, each an MLP from :func:`act_blocks` with a zero-bias output."""

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Box, net_arch: list[int],
                 features_extractor: BaseFeaturesExtractor, features_dim: int,
                 activation_fn: type[nn.Module] = nn.ReLU, normalize_images: bool = True, n_critics: int = 2,
                 share_features_extractor: bool = True, *, activation: str = "relu",
                 act_kwargs: Mapping[str, Any] | None = None, layer_norm: bool | None = None,
                 sigma_bias: float | None = None, act_layers: str = "all") -> None:
        spec = _spec(activation, act_kwargs, layer_norm, sigma_bias, act_layers)
        super().__init__(observation_space, action_space, [], features_extractor, features_dim, activation_fn,
                         normalize_images, n_critics, share_features_extractor)
        self.net_arch = list(net_arch)
        self.act_spec = spec
        in_features = features_dim + get_action_dim(self.action_space)
        self.q_networks = []
        for idx in range(n_critics):
            layers, width = act_blocks(in_features, self.net_arch, **spec)
            q_net = nn.Sequential(*layers, _head(width, 1))
            self.add_module(f"qf{idx}", q_net)  # replaces SB3's throw-away critic of the same name
            self.q_networks.append(q_net)


class ActSACPolicy(SACPolicy):
    """SAC policy whose actor and both critics (and their targets) carry the chosen activation."""

    def __init__(self, *args: Any, activation: str = "relu", act_kwargs: Mapping[str, Any] | None = None,
                 layer_norm: bool | None = None, sigma_bias: float | None = None, act_layers: str = "all",
                 **kwargs: Any) -> None:
        self.act_spec = _spec(activation, act_kwargs, layer_norm, sigma_bias, act_layers)
        super().__init__(*args, **kwargs)

    def make_actor(self, features_extractor: BaseFeaturesExtractor | None = None) -> ActActor:
        actor_kwargs = self._update_features_extractor(self.actor_kwargs, features_extractor)
        return ActActor(**actor_kwargs, **self.act_spec).to(self.device)

    def make_critic(self, features_extractor: BaseFeaturesExtractor | None = None) -> ActCritic:
        critic_kwargs = self._update_features_extractor(self.critic_kwargs, features_extractor)
        return ActCritic(**critic_kwargs, **self.act_spec).to(self.device)

    def _build(self, lr_schedule) -> None:
        super()._build(lr_schedule)
        reapply_spread_bias(self)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        return {**super()._get_constructor_parameters(), **self.act_spec}
