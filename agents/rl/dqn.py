"""The paper's DQN for classic tasks, as a subclass of SB3's DQN.

Differences from SB3's DQN, each a constructor argument (the YAML files set the paper's values):

* ``td_loss="mse"``: squared TD error (SB3 uses the Huber loss, ``"huber"``). The attribute ``td_loss`` is what
  :class:`probes.sb3.ProbeCallback` reads, so the gradient-covariance probe measures the loss being trained.
* ``max_grad_norm=None``: no gradient clipping (SB3 clips at 10).
* ``exploration_steps=N``: epsilon decays linearly from ``exploration_initial_eps`` to ``exploration_final_eps``
  over ``N`` env steps *after* ``learning_starts`` (absolute steps, independent of the training length); before
  ``learning_starts`` SB3 already acts uniformly at random. ``None`` keeps SB3's ``exploration_fraction``.

* ``replay="frames"``: the frame-deduplicated replay buffer (:class:`agents.rl.frame_buffer.FrameReplayBuffer`,
  n-step returns as SB3's); ``"full"`` keeps SB3's buffers (whole observations).

A non-finite TD loss skips that update and sets ``nonfinite_loss`` (the training callback then stops the run).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from stable_baselines3 import DQN
from torch.nn import functional as F

from .frame_buffer import FrameReplayBuffer

__all__ = ["PaperDQN"]

TD_LOSSES = ("mse", "huber")
REPLAYS = ("full", "frames")


class PaperDQN(DQN):
    """SB3 DQN with a choice of TD loss, optional gradient clipping and an absolute-step epsilon schedule."""

    def __init__(self, *args: Any, td_loss: str = "mse", exploration_steps: int | None = None,
                 max_grad_norm: float | None = None, replay: str = "full", frames_on: str = "host",
                 **kwargs: Any) -> None:
        if td_loss not in TD_LOSSES:
            raise ValueError(f"td_loss must be one of {TD_LOSSES}, got {td_loss!r}")
        if replay not in REPLAYS:
            raise ValueError(f"replay must be one of {REPLAYS}, got {replay!r}")
        if replay == "frames" and kwargs.get("replay_buffer_class") is None:
            kwargs["replay_buffer_class"] = FrameReplayBuffer
            kwargs["replay_buffer_kwargs"] = {"n_steps": kwargs.pop("n_steps", 1), "gamma": kwargs.get("gamma", 0.99),
                                              "frames_on": frames_on, **(kwargs.get("replay_buffer_kwargs") or {})}
        self.replay = replay
        if exploration_steps is not None and exploration_steps < 0:
            raise ValueError(f"exploration_steps must be >= 0 or None, got {exploration_steps!r}")
        self.td_loss = td_loss
        self.exploration_steps = exploration_steps
        self.nonfinite_loss: float | None = None
        super().__init__(*args, max_grad_norm=max_grad_norm, **kwargs)  # type: ignore[arg-type]

    def epsilon(self, num_timesteps: int) -> float:
        """Exploration rate after ``num_timesteps`` env steps (absolute schedule)."""
        t = num_timesteps - self.learning_starts
        frac = 1.0 if self.exploration_steps == 0 else min(max(t / self.exploration_steps, 0.0), 1.0)
        return self.exploration_initial_eps + frac * (self.exploration_final_eps - self.exploration_initial_eps)

    def _on_step(self) -> None:
        super()._on_step()  # target-network copies and SB3's fraction schedule
        if self.exploration_steps is not None:
            self.exploration_rate = self.epsilon(self.num_timesteps)
            self.logger.record("rollout/exploration_rate", self.exploration_rate)

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        losses = []
        for _ in range(gradient_steps):
            replay_data = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)  # type: ignore[union-attr]
            discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma
            with th.no_grad():
                next_q_values = self.q_net_target(replay_data.next_observations).max(dim=1).values.reshape(-1, 1)
                target_q_values = replay_data.rewards + (1 - replay_data.dones) * discounts * next_q_values
            current_q_values = th.gather(self.q_net(replay_data.observations), dim=1,
                                         index=replay_data.actions.long())
            if self.td_loss == "mse":
                loss = F.mse_loss(current_q_values, target_q_values)
            else:
                loss = F.smooth_l1_loss(current_q_values, target_q_values)
            if not self._step(loss, losses):
                break
        self._record_updates(gradient_steps, losses)

    def _step(self, loss: th.Tensor, values: list[float]) -> bool:
        """One optimiser step on ``loss`` (its value appended to ``values``); ``False`` if the loss is not finite:
        the parameters stay as they are and ``nonfinite_loss`` tells the training callback to stop the run."""
        value = loss.item()
        values.append(value)
        if not np.isfinite(value):
            self.nonfinite_loss = value
            return False
        self.policy.optimizer.zero_grad()
        loss.backward()
        if self.max_grad_norm is not None:
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
        self.policy.optimizer.step()
        return True

    def _record_updates(self, gradient_steps: int, values: list[float]) -> None:
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", float(np.mean(values)))
