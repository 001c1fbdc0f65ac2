"""Stable-Baselines3 adapter: a ``BaseCallback`` that probes DQN, PPO and SAC while they train.

The callback reads the algorithm's own objects (Q-network, policy, replay or rollout buffer) and builds, per
algorithm, the per-sample training losses the gradient-covariance probe needs:

* DQN: the TD loss on replay samples against the target network (``mse`` if the algorithm has
  ``td_loss == "mse"``, else SB3's Huber loss), over the Q-network;
* PPO: the clipped surrogate (``actor``) and the value loss (``critic``) on the last rollout, over the policy;
* SAC: the actor loss over the actor's parameters (its reparameterisation noise drawn with the batch, so that the
  loss is a function of the sample) and the twin-critic loss over the critics', on replay samples.

Probe samples come from the callback's own RNG; torch and numpy global RNG states are restored after each probe,
so training is bit-identical with and without probes.

SB3 runs ``train()`` after ``collect_rollouts`` returns (after ``on_rollout_end``), at the same ``num_timesteps``
as the next ``on_rollout_start`` or ``on_training_end``: on- and off-policy ``learn`` alike. The callback reads
an update's losses and learning rate there (a new update: ``_n_updates``, which every SB3 ``train()`` advances,
has changed), so each record has the step of the update that produced it.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3 import DQN, PPO, SAC
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from torch import Tensor, nn
from torch.nn import functional as F

from .probe import Probe, ProbeContext
from runlog import END, RunLogWriteError
from .runner import ProbeRunner

__all__ = ["ProbeCallback", "probe_context", "dqn_context", "ppo_context", "sac_context"]

SCALARS = ("episode_return", "episode_length", "eval_return", "eval_length", "loss", "actor_loss", "critic_loss", "learning_rate", END)
LOSS_KEYS = {"train/loss": "loss", "train/actor_loss": "actor_loss", "train/critic_loss": "critic_loss",
             "train/learning_rate": "learning_rate"}  # SB3 logger key -> run-log scalar


def _replay_sampler(algo: BaseAlgorithm, rng: np.random.Generator) -> Callable[[int], Any]:
    buf = algo.replay_buffer

    def sample(k: int):
        upper = buf.size()
        if upper == 0:
            raise RuntimeError("the replay buffer is empty; probe after learning_starts")
        index = rng.integers(0, upper, size=k)
        rows = getattr(buf, "rows", None)  # a buffer whose valid rows are not 0..size-1 maps them (FrameReplayBuffer)
        return buf._get_samples(index if rows is None else rows(index), env=algo._vec_normalize_env)

    return sample


def dqn_context(algo: DQN, rng: np.random.Generator) -> dict[str, Any]:
    huber = getattr(algo, "td_loss", "huber") != "mse"
    raw = _replay_sampler(algo, rng)

    def sample(k: int) -> tuple[Tensor, Tensor, Tensor]:
        data = raw(k)
        discounts = data.discounts if data.discounts is not None else algo.gamma
        with torch.no_grad():
            next_q = algo.q_net_target(data.next_observations).max(dim=1).values
            target = data.rewards.flatten() + (1 - data.dones.flatten()) * torch.as_tensor(discounts).flatten() * next_q
        return data.observations, data.actions.long().flatten(), target

    def td(q_net: nn.Module, batch: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        obs, actions, target = batch
        q = q_net(obs).gather(1, actions[:, None]).squeeze(1)
        return F.smooth_l1_loss(q, target, reduction="none") if huber else (q - target) ** 2

    return {"model": algo.q_net, "losses": {"td": td}, "sample": sample}


def ppo_context(algo: PPO, rng: np.random.Generator) -> dict[str, Any]:
    buf = algo.rollout_buffer
    discrete = isinstance(algo.action_space, spaces.Discrete)

    def sample(k: int):
        n = buf.buffer_size * buf.n_envs
        idx = rng.integers(0, n, size=k)

        def rows(arr: np.ndarray) -> Tensor:  # (steps, envs, ...) before SB3 flattens it in get(), (n, ...) after
            flat = arr if buf.generator_ready else arr.reshape(n, *arr.shape[2:])
            return torch.as_tensor(flat[idx], device=algo.device)

        adv = rows(buf.advantages).flatten()
        if algo.normalize_advantage and k > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        actions = rows(buf.actions)
        actions = actions.long().flatten() if discrete else actions
        return rows(buf.observations), actions, rows(buf.log_probs).flatten(), adv, rows(buf.returns).flatten()

    def actor(policy: nn.Module, batch) -> Tensor:
        obs, actions, old_log_prob, adv, _ = batch
        _, log_prob, _ = policy.evaluate_actions(obs, actions)
        ratio = torch.exp(log_prob - old_log_prob)
        clip = algo.clip_range(algo._current_progress_remaining)
        return -torch.min(adv * ratio, adv * torch.clamp(ratio, 1 - clip, 1 + clip))

    def critic(policy: nn.Module, batch) -> Tensor:
        obs, actions, _, _, returns = batch
        values, _, _ = policy.evaluate_actions(obs, actions)
        return (returns - values.flatten()) ** 2

    def forward(policy: nn.Module, obs: Tensor) -> Tensor:
        return policy.action_net(policy.mlp_extractor.forward_actor(policy.extract_features(obs, policy.pi_features_extractor)))

    return {"model": algo.policy, "losses": {"actor": actor, "critic": critic}, "sample": sample, "forward": forward}


def sac_context(algo: SAC, rng: np.random.Generator) -> dict[str, Any]:
    raw = _replay_sampler(algo, rng)
    policy = algo.policy

    def ent_coef() -> Tensor:
        return torch.exp(algo.log_ent_coef.detach()) if algo.ent_coef_optimizer is not None else algo.ent_coef_tensor

    action_dim = int(np.prod(algo.action_space.shape))

    def sample(k: int):
        data = raw(k)
        discounts = data.discounts if data.discounts is not None else algo.gamma
        with torch.no_grad():
            next_actions, next_log_prob = policy.actor.action_log_prob(data.next_observations)
            next_q = torch.cat(policy.critic_target(data.next_observations, next_actions), dim=1).min(dim=1).values
            next_q = next_q - ent_coef() * next_log_prob
            target = data.rewards.flatten() + (1 - data.dones.flatten()) * torch.as_tensor(discounts).flatten() * next_q
        # the actor's reparameterisation noise, drawn once per batch: a per-sample loss must be a function (in the
        # actor's dtype: MuJoCo's float64 observations are cast by the policy, the noise would not be)
        noise = torch.as_tensor(rng.standard_normal((k, action_dim)), dtype=next(policy.actor.parameters()).dtype,
                                device=data.observations.device)
        return data.observations, data.actions, target, noise

    def critic(pol: nn.Module, batch) -> Tensor:
        obs, actions, target, _ = batch
        return 0.5 * sum((q.flatten() - target) ** 2 for q in pol.critic(obs, actions))

    def actor(pol: nn.Module, batch) -> Tensor:
        """SB3's actor loss ``alpha log pi(a|s) - min_i Q_i(s, a)`` with ``a = tanh(mean + std * noise)``."""
        obs, _, _, noise = batch
        mean, log_std, _ = pol.actor.get_action_dist_params(obs)
        gaussian = mean + log_std.exp() * noise
        actions = torch.tanh(gaussian)
        log_prob = (-0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(dim=1)
        log_prob = log_prob - torch.log(1 - actions.pow(2) + 1e-6).sum(dim=1)  # SB3's squashing correction
        q = torch.cat(pol.critic(obs, actions), dim=1).min(dim=1).values
        return ent_coef() * log_prob - q

    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    return {
        "model": policy,
        "losses": {"actor": actor, "critic": critic},
        "loss_params": {"actor": [n for n in names if n.startswith("actor.")],
                        "critic": [n for n in names if n.startswith("critic.")]},
        "sample": sample,
        "forward": lambda pol, obs: pol.actor.get_action_dist_params(obs)[0],
    }


#: ``(algorithm, rng) -> ProbeContext fields``: what the probes see of one algorithm
ContextBuilder = Callable[[BaseAlgorithm, np.random.Generator], dict[str, Any]]


def probe_context(algo: BaseAlgorithm, rng: np.random.Generator, inputs: Tensor | None, step: int,
                  build: ContextBuilder | None = None) -> ProbeContext:
    """The probe context of ``algo`` from ``build`` (default: the adapter of SB3's DQN, PPO or SAC that ``algo``
    is an instance of)."""
    if build is None:
        build = next((b for cls, b in ((DQN, dqn_context), (PPO, ppo_context), (SAC, sac_context))
                      if isinstance(algo, cls)), None)
        if build is None:
            raise TypeError(f"no probe adapter for {type(algo).__name__}; pass context= to ProbeCallback (supported "
                            "without one: DQN, PPO, SAC and their subclasses)")
    return ProbeContext(step=step, inputs=inputs, **build(algo, rng))


class ProbeCallback(BaseCallback):
    """Run probes during ``model.learn(...)`` and log them, with episode returns and losses, to one HDF5 file.

    Args:
        probes: probes to run (their cadence is in env steps, ``num_timesteps``).
        path: the run's HDF5 file.
        config: the run's configuration, stored (as JSON) in the file's attributes.
        seed: the run's seed, stored in the file's attributes; it also seeds the probes' own RNG.
        n_inputs: number of fixed probe inputs for the NTK and sparsity probes, drawn once from the first
            observations the agent stored (replay buffer or rollout).
        loss_every: env steps between records of SB3's losses and learning rate: the first update at or after
            each multiple (default: the first update at or after each probe round). The last update is always
            recorded.
        end_status: called when training ends, one of :data:`runlog.RUN_END`, written as the ``run_end``
            scalar (default: ``"finished"`` if the run reached its ``total_timesteps``, else ``"interrupted"``).
        context: builds the algorithm's probe context (model, per-sample losses, sampler); default: the adapter
            of SB3's DQN, PPO or SAC (:func:`probe_context`).
        resume: :meth:`state` as a checkpoint saved it: the log is appended to from the checkpoint's records
            (later ones dropped) and the probes, their RNG and inputs and the loss cadence go on from there.
        extra_attrs: more root attributes for the run log (JSON-serialisable values).
        finish_at_training_end: close the log (with its ``run_end``) when training ends; ``False`` leaves that to
            the caller's :meth:`finish`, e.g. once the trained model is saved, so the log never says a run finished
            whose model is not on disk.
        verbose: SB3's callback verbosity.
    """

    def __init__(self, probes: Sequence[Probe], path: str | os.PathLike, *, config: Mapping[str, Any],
                 seed: int, n_inputs: int = 32, extra_attrs: Mapping[str, Any] | None = None,
                 loss_every: int | None = None, end_status: Callable[[], str] | None = None,
                 context: ContextBuilder | None = None, resume: Mapping[str, Any] | None = None,
                 finish_at_training_end: bool = True, verbose: int = 0) -> None:
        super().__init__(verbose)
        self.probes = list(probes)
        self.path = os.fspath(path)
        self.config, self.seed, self.n_inputs = dict(config), int(seed), int(n_inputs)
        self.extra_attrs = dict(extra_attrs or {})
        self.rng = np.random.default_rng([self.seed, 0x9E3779B9])
        self.runner: ProbeRunner | None = None
        self.inputs: Tensor | None = None
        self.loss_every = loss_every
        self.end_status = end_status
        self.context = context
        self._next_loss = 0
        self._probed = False
        self._n_updates = 0
        self._update: tuple[int, dict[str, float]] | None = None  # the latest update's step and scalars, unwritten
        self._resume = resume
        self.finish_at_training_end = finish_at_training_end

    # -- set-up ------------------------------------------------------------------------------------------
    def _on_training_start(self) -> None:
        space = self.model.observation_space
        example_inputs = torch.as_tensor(np.stack([space.sample() for _ in range(self.n_inputs)]),
                                         device=self.model.device)
        example = probe_context(self.model, self.rng, example_inputs, step=0, build=self.context)
        resume = self._resume
        self.runner = ProbeRunner(self.probes, self.path, example=example, config=self.config, seed=self.seed,
                                  scalars=SCALARS, device=str(self.model.device), extra_attrs=self.extra_attrs,
                                  overwrite=resume is None, keep=None if resume is None else resume["runner"]["counts"])
        self._n_updates = self.model._n_updates
        if resume is not None:
            self.runner.restore(resume["runner"])
            self.rng.bit_generator.state = resume["rng"]
            inputs = resume["inputs"]
            self.inputs = None if inputs is None else torch.as_tensor(inputs, device=self.model.device)
            self._next_loss, self._probed, self._update = resume["next_loss"], resume["probed"], resume["update"]

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps to resume the log exactly (see ``resume``); taken between updates."""
        return {"runner": self.runner.state(), "rng": self.rng.bit_generator.state,
                "inputs": None if self.inputs is None else self.inputs.cpu().numpy(),
                "next_loss": self._next_loss, "probed": self._probed, "update": self._update}

    def _observations(self) -> Tensor | None:
        """``n_inputs`` observations from what the agent has stored so far (None until there are enough)."""
        if isinstance(self.model, OnPolicyAlgorithm):
            buf = self.model.rollout_buffer
            stored = buf.buffer_size * buf.n_envs if buf.full else buf.pos * buf.n_envs
        else:
            buf = self.model.replay_buffer
            stored = buf.size() * buf.n_envs
        if stored < self.n_inputs:
            return None
        idx = np.sort(self.rng.choice(stored, size=self.n_inputs, replace=False))
        if hasattr(buf, "stacks"):  # FrameReplayBuffer: stacks rebuilt from its frames
            picked = buf.stacks(buf.obs_head[buf.rows(idx // buf.n_envs), idx % buf.n_envs])
        else:
            picked = buf.observations.reshape(-1, *buf.obs_shape)[idx]
        normalize = self.model._vec_normalize_env
        if normalize is not None and not isinstance(self.model, OnPolicyAlgorithm):
            picked = normalize.normalize_obs(picked)  # a replay buffer keeps raw observations; the network sees these
        return torch.as_tensor(picked, device=self.model.device)

    # -- per step ----------------------------------------------------------------------------------------
    def _on_step(self) -> bool:
        step = self.num_timesteps
        for info in self.locals.get("infos", ()):
            episode = info.get("episode")
            if episode is not None:
                self.runner.scalar("episode_return", step, episode["r"])
                self.runner.scalar("episode_length", step, episode["l"])
        if not isinstance(self.model, OnPolicyAlgorithm):
            self._probe(step)
        return True

    def _on_rollout_end(self) -> None:
        if isinstance(self.model, OnPolicyAlgorithm):
            self._probe(self.num_timesteps)

    def _on_rollout_start(self) -> None:
        self._read_update()

    # -- training scalars --------------------------------------------------------------------------------
    def _read_update(self) -> None:
        """Take the losses and learning rate of the ``train()`` call made since the last read (if any) and
        write them if due; they are stamped with the update's step, the current ``num_timesteps``."""
        if self.model._n_updates == self._n_updates:
            return
        self._n_updates = self.model._n_updates
        step = self.model.num_timesteps
        values = self.model.logger.name_to_value
        self._update = (step, {name: values[key] for key, name in LOSS_KEYS.items() if key in values})
        if self._update_due(step):
            self._write_update()

    def _update_due(self, step: int) -> bool:
        """Whether the update at ``step`` is the first at or after a ``loss_every`` multiple (or a probe round)."""
        if self.loss_every is None:
            due, self._probed = self._probed, False
            return due
        if step < self._next_loss:
            return False
        self._next_loss = (step // self.loss_every + 1) * self.loss_every
        return True

    def _write_update(self) -> None:
        """Write the latest update's scalars to the run log, unless they are written already."""
        if self._update is not None:
            step, scalars = self._update
            for name, value in scalars.items():
                self.runner.scalar(name, step, value)
            self._update = None

    def _probe(self, step: int) -> None:
        if not self.runner.due(step):
            return
        state = np.random.get_state()  # SB3's buffers draw env indices from numpy's global RNG
        try:
            if self.inputs is None:
                self.inputs = self._observations()
                if self.inputs is None:
                    return
            ctx = probe_context(self.model, self.rng, self.inputs, step, build=self.context)
            self.runner.on_step(ctx)
        finally:
            np.random.set_state(state)
        self._probed = True

    def _on_training_end(self) -> None:
        if self.finish_at_training_end:
            self.finish()

    def finish(self, end: bool | str = True) -> None:
        """Write the last update's scalars and the ``run_end`` record (``end``: True, the status ``end_status``
        gives; False, none, e.g. after a crash; a status of :data:`runlog.RUN_END`, only that record, e.g.
        ``"write_error"`` after a failed write, if the disk still takes it), then close the log (once; also for a
        ``learn`` that raised, which skips ``on_training_end``)."""
        if self.runner is not None:
            try:
                step = self.model.num_timesteps
                if isinstance(end, str):
                    with contextlib.suppress(RunLogWriteError):  # the failure itself is being reported
                        self.runner.log.end(step, end)
                    return
                if not end:
                    return
                self._read_update()
                self._write_update()  # the last update, whatever the cadence
                status = self.end_status() if self.end_status is not None else \
                    ("finished" if step >= self.model._total_timesteps else "interrupted")
                self.runner.log.end(step, status)
            finally:  # the log is closed (and stays readable) whatever happens above
                self.runner.close()
                self.runner = None
