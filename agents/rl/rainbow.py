"""Rainbow (Hessel et al. 2018), top to bottom in one module, on SB3's off-policy loop.

Every component is a setting, so that "Rainbow with everything off" is a plain DQN of our own:

* ``noisy`` / ``noisy_std``: factorised noisy linear layers in the heads (:class:`interference.NoisyLinear`); the
  noise is resampled before every action and every gradient step; greedy evaluation (``deterministic=True``) uses
  the mean weights. Epsilon-greedy stays as configured (the authors' Tianshou Rainbow keeps it).
* ``distributional`` / ``n_atoms`` / ``v_min`` / ``v_max``: C51 (Bellemare et al. 2017): a categorical return
  distribution on ``n_atoms`` evenly spaced atoms, the target projected onto them (:func:`project`), the loss the
  cross-entropy of the projected target. Off: Q-values with the TD loss ``td_loss`` (``mse`` or ``huber``).
* ``prioritized`` / ``per_alpha`` / ``per_beta0`` / ``per_beta_steps`` / ``per_eps``: proportional prioritized
  replay on a sum tree (:class:`SumTree`, :class:`PrioritizedReplayBuffer`), priorities ``(x + eps)^alpha`` with
  ``x`` the per-sample cross-entropy (C51) or ``|TD error|``,
  importance weights ``(N P(i))^-beta`` normalised by the largest possible one, beta annealed linearly from
  ``per_beta0`` to 1 over ``per_beta_steps`` env steps. With ``replay: frames`` the priorities sit over the
  frame-deduplicated buffer (:class:`PrioritizedFrameReplayBuffer`; Atari).
* ``n_steps``: n-step returns (SB3's :class:`NStepReplayBuffer` logic, which cuts the window at a termination, with
  no bootstrap, and at a truncation, bootstrapping from the observation where the episode was cut).
* ``dueling``: value and advantage streams, ``Q = V + A - mean_a A`` (on the atoms' logits when distributional).
* ``double_q``: the online network picks the next action, the target network evaluates it.

The network: a trunk (flatten for vectors; the Nature CNN's ReLU convolutions for Atari frames; MinAtar's one
ReLU convolution), then per stream the hidden layers of ``net_arch`` (images: one layer of ``features_dim`` units),
each ``NoisyLinear`` (or ``Linear``) ``[-> LayerNorm] -> activation``, and a (noisy) output layer. The activation
sits where the paper puts it, on the penultimate layer of both streams; noisy layers keep their own bias init (no
spread biases), plain ``Linear`` hidden layers get the activation's spread. ``forward`` returns Q-values (so the
probes, SB3's ``predict`` and the NTK see a Q-network); :meth:`RainbowQNetwork.log_probs` the atoms' log-probs.

Probes see the mean network by default (``probe_noise: mean``) or one fixed noise sample drawn once per run from
the run's seed (``probe_noise: fixed``); the setting is in the run log's config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import NStepReplayBuffer
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor, FlattenExtractor
from stable_baselines3.common.type_aliases import ReplayBufferSamples
from stable_baselines3.dqn.policies import DQNPolicy
from torch import Tensor, nn
from torch.nn import functional as F

from interference.nets import nature_convs
from interference.noisy import NoisyLinear, noisy_layers, resample_noise, set_noise

from .dqn import PaperDQN
from .frame_buffer import FrameReplayBuffer
from .policies import _spec, act_blocks, cnn_flat_features, reapply_spread_bias

__all__ = ["Rainbow", "RainbowPolicy", "policy_settings", "NETWORK_SETTINGS", "RainbowQNetwork", "SumTree", "Prioritized", "PrioritizedReplayBuffer",
           "PrioritizedFrameReplayBuffer", "project",
           "NatureConv", "rainbow_context", "PROBE_NOISE"]

PROBE_NOISE = ("mean", "fixed")


# --- prioritized replay ---------------------------------------------------------------------------------


class SumTree:
    """Priorities of ``capacity`` slots in a binary tree of partial sums (and minima), for proportional sampling.

    Leaves ``capacity_pow2 .. 2 capacity_pow2 - 1`` hold the priorities (0 for empty slots); node ``i`` holds the sum
    (``sums``) and minimum (``mins``, empty slots count as ``inf``) of its children ``2i`` and ``2i + 1``.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"SumTree needs capacity >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.size = 1 << max(0, (self.capacity - 1).bit_length())
        self.sums = np.zeros(2 * self.size)
        self.mins = np.full(2 * self.size, np.inf)

    @property
    def total(self) -> float:
        return float(self.sums[1])

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        return self.sums[np.asarray(index) + self.size]

    def min(self) -> float:
        """The smallest priority set (``inf`` if none)."""
        return float(self.mins[1])

    def update(self, index: np.ndarray, priority: np.ndarray) -> None:
        """Set the priorities of slots ``index`` (later entries win for repeated slots)."""
        index, priority = np.asarray(index, dtype=np.int64).ravel(), np.asarray(priority, dtype=np.float64).ravel()
        if np.any(priority < 0) or not np.all(np.isfinite(priority)):
            raise ValueError("priorities must be finite and >= 0")
        if index.size == 1:  # one slot (every add): walk up with scalars
            node = int(index[0]) + self.size
            self.sums[node], self.mins[node] = priority[0], priority[0] if priority[0] > 0 else np.inf
            node //= 2
            while node >= 1:
                left, right = 2 * node, 2 * node + 1
                self.sums[node] = self.sums[left] + self.sums[right]
                self.mins[node] = min(self.mins[left], self.mins[right])
                node //= 2
            return
        nodes = index + self.size
        self.sums[nodes] = priority
        self.mins[nodes] = np.where(priority > 0, priority, np.inf)
        nodes = np.unique(nodes // 2)
        while nodes.size and nodes[0] >= 1:
            self.sums[nodes] = self.sums[2 * nodes] + self.sums[2 * nodes + 1]
            self.mins[nodes] = np.minimum(self.mins[2 * nodes], self.mins[2 * nodes + 1])
            nodes = np.unique(nodes // 2)
            if nodes[0] == 0:
                break

    def find(self, mass: np.ndarray) -> np.ndarray:
        """The slots whose cumulative priority interval holds each value of ``mass`` (in ``[0, total)``)."""
        mass = np.asarray(mass, dtype=np.float64).copy()
        node = np.ones(mass.shape, dtype=np.int64)
        while self.size > 1 and node[0] < self.size:
            left = 2 * node
            go_right = mass >= self.sums[left]
            mass = np.where(go_right, mass - self.sums[left], mass)
            node = np.where(go_right, left + 1, left)
        slot = node - self.size
        # round-off can walk into an empty slot at the end: step back to the last slot with priority
        empty = self.sums[slot + self.size] <= 0
        if np.any(empty):
            filled = np.flatnonzero(self.sums[self.size:] > 0)
            slot[empty] = filled[np.searchsorted(filled, slot[empty], side="right") - 1]
        return slot

    def sample(self, k: int, rng: np.random.Generator | np.random.RandomState) -> np.ndarray:
        """``k`` slots drawn with probability proportional to priority, stratified: one uniform draw in each of ``k``
        equal segments of the total mass (every slot's expected count is still ``k p_i / total``)."""
        total = self.total
        if total <= 0:
            raise ValueError("cannot sample from a SumTree whose priorities are all zero")
        return self.find((np.arange(k) + rng.random(k)) * (total / k))


class Prioritized:
    """Proportional priorities over a replay buffer's rows (a mixin; one env, so a row is a transition).

    New transitions get the largest priority seen so far. :meth:`sample_prioritized` returns the samples, their
    slots and importance weights; :meth:`update_priorities` sets ``(loss + eps)^alpha`` for those slots. Rows a
    buffer drops early (``_dropped``) get priority 0, so they are never drawn.
    """

    def __init__(self, *args: Any, alpha: float = 0.5, eps: float = 1e-6, **kwargs: Any) -> None:
        kwargs.setdefault("n_steps", 1)  # (SB3's NStepReplayBuffer would default to 3)
        super().__init__(*args, **kwargs)
        if self.n_envs != 1:
            raise ValueError(f"prioritized replay here takes one env (n_envs=1), got n_envs={self.n_envs}")
        self.alpha, self.eps = float(alpha), float(eps)
        self.tree = SumTree(self.buffer_size)
        self.max_priority = 1.0

    def add(self, *args: Any, **kwargs: Any) -> None:
        self.tree.update(np.array([self.pos]), np.array([self.max_priority ** self.alpha]))
        super().add(*args, **kwargs)

    def _dropped(self, rows: np.ndarray) -> None:
        self.tree.update(rows, np.zeros(len(rows)))

    def sample_prioritized(self, batch_size: int, beta: float, env: Any = None,
                           rng: np.random.RandomState | np.random.Generator | None = None
                           ) -> tuple[ReplayBufferSamples, np.ndarray, np.ndarray]:
        """``(samples, slots, weights)``: slots drawn by priority with ``rng`` (default numpy's global generator, as
        SB3's buffers draw), ``weights = (N P(i))^-beta / max_j (N P(j))^-beta`` over the whole buffer (the largest
        weight belongs to the smallest priority), shape ``(batch,)``."""
        slots, weights = self.draw(batch_size, beta, rng)
        return self._get_samples(slots, env=env), slots, weights

    def draw(self, batch_size: int, beta: float, rng: np.random.RandomState | np.random.Generator | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, weights)`` of :meth:`sample_prioritized`, without the samples."""
        n = self.size()
        slots = self.tree.sample(batch_size, np.random if rng is None else rng)
        total = self.tree.total
        probs = self.tree[slots] / total
        weights = (n * probs) ** (-beta) / (n * self.tree.min() / total) ** (-beta)
        return slots, weights.astype(np.float32)

    def update_priorities(self, slots: np.ndarray, losses: np.ndarray) -> None:
        priority = np.abs(np.asarray(losses, dtype=np.float64)) + self.eps
        self.max_priority = max(self.max_priority, float(priority.max()))
        self.tree.update(slots, priority ** self.alpha)


class PrioritizedReplayBuffer(Prioritized, NStepReplayBuffer):
    """SB3's n-step replay buffer (whole observations) with proportional priorities."""


class PrioritizedFrameReplayBuffer(Prioritized, FrameReplayBuffer):
    """The frame-deduplicated replay buffer (:mod:`agents.rl.frame_buffer`) with proportional priorities."""


# --- C51 ------------------------------------------------------------------------------------------------


def project(probs: Tensor, rewards: Tensor, discounts: Tensor, support: Tensor) -> Tensor:
    """C51's projection of the distribution ``rewards + discounts * Z`` onto ``support``.

    probs: ``(B, K)`` next-state probabilities on ``support`` ``(K,)`` (evenly spaced); rewards, discounts: ``(B,)``
    (discount 0 where the episode terminated). Each atom's mass goes to its two neighbours on the support after
    clipping to ``[v_min, v_max]``, in proportion to closeness (all of it to one atom it lands on exactly).
    Returns ``(B, K)``, rows summing to 1.
    """
    k = support.numel()
    v_min, v_max = support[0], support[-1]
    delta = (v_max - v_min) / (k - 1)
    tz = (rewards[:, None] + discounts[:, None] * support[None, :]).clamp(v_min, v_max)
    b = (tz - v_min) / delta
    lower, upper = b.floor().long().clamp(0, k - 1), b.ceil().long().clamp(0, k - 1)
    out = th.zeros_like(probs)
    same = (upper == lower).to(probs.dtype)
    out.scatter_add_(1, lower, probs * (upper.to(probs.dtype) - b + same))
    out.scatter_add_(1, upper, probs * (b - lower.to(probs.dtype)))
    return out


# --- network --------------------------------------------------------------------------------------------


class NatureConv(BaseFeaturesExtractor):
    """The Nature-DQN convolutions with ReLU on ``(C, H, W)`` frames, flattened (Rainbow's trunk on Atari)."""

    def __init__(self, observation_space: gym.Space) -> None:
        super().__init__(observation_space, cnn_flat_features(observation_space.shape))
        self.cnn = nature_convs(observation_space.shape[0])

    def forward(self, observations: Tensor) -> Tensor:
        return self.cnn(observations)


def _stream(in_features: int, widths: Sequence[int], out_features: int, spec: Mapping[str, Any], noisy: bool,
            noisy_std: float) -> nn.Sequential:
    """Hidden blocks ``(Noisy)Linear [-> LayerNorm] -> activation`` per width, then a (noisy) output layer."""
    layers, width = act_blocks(in_features, widths, **spec)
    if noisy:  # the same blocks with NoisyLinear in place of Linear (own init, no spread biases)
        layers = [NoisyLinear(m.in_features, m.out_features, noisy_std) if isinstance(m, nn.Linear) else m
                  for m in layers]
        return nn.Sequential(*layers, NoisyLinear(width, out_features, noisy_std))
    head = nn.Linear(width, out_features)
    nn.init.zeros_(head.bias)
    return nn.Sequential(*layers, head)


class RainbowQNetwork(BasePolicy):
    """Trunk, then dueling (or single) streams of atoms' logits; ``forward(obs) -> Q (B, actions)``."""

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Discrete,
                 features_extractor: BaseFeaturesExtractor, features_dim: int, net_arch: Sequence[int] = (),
                 activation_fn: Any = None, normalize_images: bool = True, *, activation: str = "relu",
                 act_kwargs: Mapping[str, Any] | None = None, layer_norm: bool | None = None,
                 sigma_bias: float | None = None, noisy: bool = True, noisy_std: float = 0.5, dueling: bool = True,
                 n_atoms: int = 51, v_min: float = -10.0, v_max: float = 10.0) -> None:
        super().__init__(observation_space, action_space, features_extractor=features_extractor,
                         normalize_images=normalize_images)
        self.net_arch, self.features_dim = list(net_arch), features_dim
        self.act_spec = _spec(activation, act_kwargs, layer_norm, sigma_bias)
        self.settings = {"noisy": noisy, "noisy_std": noisy_std, "dueling": dueling, "n_atoms": n_atoms,
                         "v_min": v_min, "v_max": v_max}
        self.n_actions, self.n_atoms, self.dueling = int(action_space.n), int(n_atoms), dueling
        if self.n_atoms > 1 and not v_min < v_max:
            raise ValueError(f"v_min must be below v_max, got [{v_min}, {v_max}]")
        self.register_buffer("support", th.linspace(v_min, v_max, self.n_atoms) if self.n_atoms > 1 else th.zeros(1))
        out = self.n_actions * self.n_atoms
        self.advantage = _stream(features_dim, self.net_arch, out, self.act_spec, noisy, noisy_std)
        self.value = _stream(features_dim, self.net_arch, self.n_atoms, self.act_spec, noisy, noisy_std) if dueling \
            else None

    def logits(self, obs: Tensor) -> Tensor:
        """``(B, actions, atoms)``: the streams combined, ``V + A - mean_a A`` when dueling."""
        return self.head_logits(self.extract_features(obs, self.features_extractor))

    def head_logits(self, f: Tensor) -> Tensor:
        """:meth:`logits` of the trunk's features ``f`` ``(B, features)``."""
        v = None if self.value is None else self.value(f).view(-1, 1, self.n_atoms)
        a = self.advantage(f).view(-1, self.n_actions, self.n_atoms)  # (last: its head's input are the features)
        return a if v is None else v + a - a.mean(dim=1, keepdim=True)

    def log_probs(self, obs: Tensor) -> Tensor:
        """``(B, actions, atoms)`` log-probabilities of the return distribution (C51)."""
        return F.log_softmax(self.logits(obs), dim=-1)

    def forward(self, obs: Tensor) -> Tensor:
        return self.q_of(self.logits(obs))

    def q_of(self, logits: Tensor) -> Tensor:
        """Q-values ``(B, actions)`` of :meth:`logits`: the distribution's mean on the support (C51), else the one
        atom."""
        if self.n_atoms == 1:
            return logits.squeeze(-1)
        return (F.log_softmax(logits, dim=-1).exp() * self.support).sum(-1)

    def _predict(self, observation: Tensor, deterministic: bool = True) -> Tensor:
        return self(observation).argmax(dim=1).reshape(-1)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        return {**super()._get_constructor_parameters(), "net_arch": self.net_arch, "features_dim": self.features_dim,
                "features_extractor": self.features_extractor, **self.act_spec, **self.settings}


class RainbowPolicy(DQNPolicy):
    """Online and target :class:`RainbowQNetwork`; the trunk is ``features_extractor_class`` (default: flatten)."""

    def __init__(self, *args: Any, activation: str = "relu", act_kwargs: Mapping[str, Any] | None = None,
                 layer_norm: bool | None = None, sigma_bias: float | None = None, noisy: bool = True,
                 noisy_std: float = 0.5, dueling: bool = True, n_atoms: int = 51, v_min: float = -10.0,
                 v_max: float = 10.0, **kwargs: Any) -> None:
        self.act_spec = _spec(activation, act_kwargs, layer_norm, sigma_bias)  # read by make_q_net in __init__
        self.rainbow = {"noisy": noisy, "noisy_std": noisy_std, "dueling": dueling, "n_atoms": n_atoms,
                        "v_min": v_min, "v_max": v_max}
        kwargs.setdefault("features_extractor_class", FlattenExtractor)
        super().__init__(*args, **kwargs)

    def make_q_net(self) -> RainbowQNetwork:
        net_args = self._update_features_extractor(self.net_args, features_extractor=None)
        return RainbowQNetwork(**net_args, **self.act_spec, **self.rainbow).to(self.device)

    def _build(self, lr_schedule: Any) -> None:
        super()._build(lr_schedule)
        reapply_spread_bias(self)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        return {**super()._get_constructor_parameters(), **self.act_spec, **self.rainbow}


# --- the algorithm --------------------------------------------------------------------------------------


#: the Rainbow settings that shape its network (:func:`policy_settings`)
NETWORK_SETTINGS = ("noisy", "noisy_std", "dueling", "distributional", "n_atoms", "v_min", "v_max")


def policy_settings(*, noisy: bool, noisy_std: float, dueling: bool, distributional: bool, n_atoms: int,
                    v_min: float, v_max: float) -> dict[str, Any]:
    """The :class:`RainbowPolicy` arguments of Rainbow's settings (one atom when not distributional)."""
    return {"noisy": noisy, "noisy_std": noisy_std, "dueling": dueling, "n_atoms": n_atoms if distributional else 1,
            "v_min": v_min, "v_max": v_max}


class Batch(NamedTuple):
    """What a per-sample loss needs: observations, actions (B,), and the (projected) targets."""

    observations: Tensor
    actions: Tensor
    targets: Tensor  # (B, atoms) target distributions, or (B,) target Q-values


class Rainbow(PaperDQN):
    """SB3's DQN loop (epsilon schedule, target copies, ``learn``) with Rainbow's components (module docstring).

    The PaperDQN arguments stay (``td_loss`` for the non-distributional loss, ``exploration_steps``,
    ``max_grad_norm``); the Rainbow settings are keyword arguments named as in ``agents/hyperparams/rainbow.yml``.
    """

    def __init__(self, policy: Any, env: Any, *, noisy: bool = True, noisy_std: float = 0.5,
                 distributional: bool = True, n_atoms: int = 51, v_min: float = -10.0, v_max: float = 10.0,
                 dueling: bool = True, double_q: bool = True, prioritized: bool = True, per_alpha: float = 0.5,
                 per_beta0: float = 0.4, per_beta_steps: int = 1, per_eps: float = 1e-6, probe_noise: str = "mean",
                 n_steps: int = 1, gamma: float = 0.99, policy_kwargs: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        if probe_noise not in PROBE_NOISE:
            raise ValueError(f"probe_noise must be one of {PROBE_NOISE}, got {probe_noise!r}")
        self.noisy, self.distributional, self.double_q, self.prioritized = noisy, distributional, double_q, prioritized
        self.per_beta0, self.per_beta_steps, self.probe_noise = float(per_beta0), int(per_beta_steps), probe_noise
        policy_kwargs = {**(policy_kwargs or {}), **policy_settings(noisy=noisy, noisy_std=noisy_std, dueling=dueling,
                                                                     distributional=distributional, n_atoms=n_atoms,
                                                                     v_min=v_min, v_max=v_max)}
        if prioritized:
            if kwargs.get("replay_buffer_class") is not None:
                raise ValueError("prioritized=True brings its own replay buffer; set prioritized=False to pass one")
            kwargs["replay_buffer_class"] = (PrioritizedFrameReplayBuffer if kwargs.get("replay") == "frames"
                                             else PrioritizedReplayBuffer)
            kwargs["replay_buffer_kwargs"] = {"n_steps": n_steps, "gamma": gamma, "alpha": per_alpha, "eps": per_eps,
                                              **({"frames_on": kwargs.get("frames_on", "host")}
                                                 if kwargs.get("replay") == "frames" else {})}
            n_steps = 1  # (the buffer does the n-step returns; SB3 only warns about n_steps with a custom buffer)
        super().__init__(policy, env, n_steps=n_steps, gamma=gamma, policy_kwargs=policy_kwargs, **kwargs)

    def _setup_model(self) -> None:
        super()._setup_model()
        # the noisy layers of each network, found once (loading a model fills these same modules)
        self._noisy_layers = {"online": list(noisy_layers(self.q_net)), "target": list(noisy_layers(self.q_net_target))}

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_noisy_layers"]

    def _noise(self, net: str, on: bool, resample: bool = False) -> None:
        """Switch (and, with ``resample``, redraw) the noise of the ``online`` or ``target`` network."""
        for m in self._noisy_layers[net]:
            m.noise = on
            if resample:
                m.resample()

    def beta(self) -> float:
        """The importance-sampling exponent now: ``per_beta0`` -> 1 linearly over ``per_beta_steps`` env steps."""
        return min(1.0, self.per_beta0 + (1.0 - self.per_beta0) * self.num_timesteps / max(1, self.per_beta_steps))

    def predict(self, observation: Any, state: Any = None, episode_start: Any = None,
                deterministic: bool = False) -> tuple[np.ndarray, Any]:
        """Epsilon-greedy on fresh noise (noisy nets), or on the mean network when ``deterministic``."""
        self._noise("online", self.noisy and not deterministic, resample=self.noisy and not deterministic)
        return super().predict(observation, state, episode_start, deterministic)

    def batch(self, data: ReplayBufferSamples, q_net: RainbowQNetwork | None = None,
              q_target: RainbowQNetwork | None = None) -> Batch:
        """The targets of replay samples ``data``: the projected distribution (C51) or the TD target, the next action
        picked by ``q_net`` (double Q) or ``q_target``; discounts ``gamma^k`` of each sample's n-step window."""
        q_net, q_target = q_net or self.q_net, q_target or self.q_net_target
        discounts = data.discounts if data.discounts is not None else th.full_like(data.rewards, self.gamma)
        discounts = (discounts * (1 - data.dones)).flatten()
        rewards = data.rewards.flatten()
        with th.no_grad():
            chooser = q_net if self.double_q else q_target
            next_actions = chooser(data.next_observations).argmax(dim=1)
            rows = th.arange(len(next_actions), device=next_actions.device)
            if self.distributional:
                next_probs = q_target.log_probs(data.next_observations)[rows, next_actions].exp()
                targets = project(next_probs, rewards, discounts, q_target.support)
            else:
                targets = rewards + discounts * q_target(data.next_observations)[rows, next_actions]
        return Batch(data.observations, data.actions.long().flatten(), targets)

    def losses(self, q_net: RainbowQNetwork, batch: Batch) -> Tensor:
        """Per-sample losses ``(B,)``: the cross-entropy of the target distribution, or the TD loss."""
        return self._losses(q_net, batch)[0]

    def _losses(self, q_net: RainbowQNetwork, batch: Batch) -> tuple[Tensor, Tensor]:
        """Per-sample losses and what their priorities are made of (detached, ``(B,)``): the cross-entropy itself
        (C51; Tianshou's choice) or the absolute TD error ``|delta|`` (PER's), whatever the TD loss."""
        rows = th.arange(len(batch.actions), device=batch.actions.device)
        if self.distributional:
            loss = -(batch.targets * q_net.log_probs(batch.observations)[rows, batch.actions]).sum(-1)
            return loss, loss.detach()
        delta = q_net(batch.observations)[rows, batch.actions] - batch.targets
        if self.td_loss == "mse":
            return delta ** 2, delta.detach().abs()
        return F.smooth_l1_loss(delta, th.zeros_like(delta), reduction="none"), delta.detach().abs()

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        values = []
        for _ in range(gradient_steps):
            if self.prioritized:
                data, slots, w = self.replay_buffer.sample_prioritized(batch_size, self.beta(),
                                                                       env=self._vec_normalize_env)
                weights = th.as_tensor(w, device=self.device)
            else:
                data, weights = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env), None
            self._noise("online", self.noisy, resample=self.noisy)
            self._noise("target", self.noisy, resample=self.noisy)
            per_sample, priority = self._losses(self.q_net, self.batch(data))
            loss = (per_sample * weights).mean() if weights is not None else per_sample.mean()
            if not self._step(loss, values):  # (PaperDQN's: a non-finite loss stops the run, nothing applied)
                break
            if self.prioritized:
                self.replay_buffer.update_priorities(slots, priority.cpu().numpy())
        self._record_updates(gradient_steps, values)


def _probe_noise(algo: Rainbow) -> None:
    """Put the online and target networks in the probes' noise mode (training resamples and re-enables it)."""
    for net in (algo.q_net, algo.q_net_target):
        if algo.probe_noise == "mean" or not algo.noisy:
            set_noise(net, False)
        else:  # one sample per run, drawn from the run's seed, the same at every probe round
            set_noise(net, True)
            resample_noise(net, th.Generator(device=algo.device).manual_seed(int(algo.seed or 0) + 104729))


def rainbow_context(algo: Rainbow, rng: np.random.Generator) -> dict[str, Any]:
    """The probes' view of Rainbow: the online Q-network (noise per ``probe_noise``), its per-sample training loss
    (without importance weights) on uniformly drawn replay samples."""
    from probes.sb3 import _replay_sampler

    _probe_noise(algo)
    raw = _replay_sampler(algo, rng)

    def loss(q_net: nn.Module, batch: Batch) -> Tensor:
        return algo.losses(q_net, batch)  # type: ignore[arg-type]

    return {"model": algo.q_net, "losses": {"td": loss}, "sample": lambda k: algo.batch(raw(k))}
