"""Tasks stepped as tensors on the population's device: ``n`` copies in one call, with no host round trip.

Each is its numpy twin in :mod:`agents.population.envs` (the same float64 arithmetic in the same order; the device's
``cos`` may differ from numpy's in the last bit, so states agree to float tolerance and discrete outcomes exactly on
recorded action sequences: tests/test_population_device.py), with its resets drawn by counter
(:func:`agents.population.counter.uniform`, stream ``RESET``, the copy's ``k``-th reset) rather than from a numpy
generator, so that the numpy twin reproduces them with :class:`agents.population.counter.CounterGenerator`.
:meth:`TorchEnv.step` resets finished copies at once and returns the observation each ended in, as
:meth:`agents.population.envs.BatchedEnv.step`.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
from torch import Tensor

from .counter import RESET, uniform

__all__ = ["TorchEnv", "TorchMountainCar", "TORCH_ENVS", "TorchStep"]


class TorchStep(NamedTuple):
    """``obs (n, d)`` float32 after auto-reset, ``reward (n,)`` float32, ``terminated``, ``truncated`` ``(n,)`` bool,
    ``terminal (n, d)``: the observation each copy ended in."""

    obs: Tensor
    reward: Tensor
    terminated: Tensor
    truncated: Tensor
    terminal: Tensor


class TorchEnv:
    """``n`` copies of one task on ``device``, copy ``i`` drawing its resets with ``seeds[i]``."""

    env_id: ClassVar[str]
    obs_dim: ClassVar[int]
    n_actions: ClassVar[int]
    default_max_steps: ClassVar[int]

    def __init__(self, seeds: Tensor, max_episode_steps: int | None = None) -> None:
        self.seeds = seeds.to(torch.int64)
        self.n, self.device = len(seeds), seeds.device
        self.max_steps = int(max_episode_steps or self.default_max_steps)
        self.state = torch.zeros(self.n, self._state_dim(), dtype=torch.float64, device=self.device)
        self.elapsed = torch.zeros(self.n, dtype=torch.int64, device=self.device)
        self.resets = torch.zeros(self.n, dtype=torch.int64, device=self.device)  # draws made per copy

    def _state_dim(self) -> int:
        raise NotImplementedError

    def _initial(self) -> Tensor:
        """Every copy's next reset state ``(n, state_dim)`` (drawn whether or not it is used)."""
        raise NotImplementedError

    def _dynamics(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        """The state after ``actions``; ``(reward float32 (n,), terminated bool (n,))``, ``self.state`` updated."""
        raise NotImplementedError

    def observe(self) -> Tensor:
        return self.state.to(torch.float32)

    def reset(self) -> Tensor:
        self.state = self._initial()
        self.resets = self.resets + 1
        self.elapsed = torch.zeros_like(self.elapsed)
        return self.observe()

    def step(self, actions: Tensor) -> TorchStep:
        reward, terminated = self._dynamics(actions)
        elapsed = self.elapsed + 1
        truncated = (elapsed >= self.max_steps) & ~terminated
        terminal = self.observe()
        done = terminated | truncated
        self.state = torch.where(done[:, None], self._initial(), self.state)
        self.resets = self.resets + done
        self.elapsed = torch.where(done, 0, elapsed)
        return TorchStep(self.observe(), reward, terminated, truncated, terminal)


class TorchMountainCar(TorchEnv):
    """Gymnasium's MountainCar-v0 (discrete): state (position, velocity)."""

    env_id, obs_dim, n_actions, default_max_steps = "MountainCar-v0", 2, 3, 200
    min_position, max_position, max_speed, goal_position, goal_velocity = -1.2, 0.6, 0.07, 0.5, 0
    force, gravity = 0.001, 0.0025

    def _state_dim(self) -> int:
        return 2

    def _initial(self) -> Tensor:
        position = -0.6 + (-0.4 - -0.6) * uniform(self.seeds, RESET, self.resets)  # numpy: low + (high - low) * u
        return torch.stack([position, torch.zeros_like(position)], dim=1)

    def _dynamics(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        position, velocity = self.state[:, 0], self.state[:, 1]
        velocity = velocity + ((actions - 1).to(torch.float64) * self.force + torch.cos(3 * position) * -self.gravity)
        velocity = velocity.clamp(-self.max_speed, self.max_speed)
        position = (position + velocity).clamp(self.min_position, self.max_position)
        velocity = torch.where((position == self.min_position) & (velocity < 0), 0.0, velocity)
        terminated = (position >= self.goal_position) & (velocity >= self.goal_velocity)
        self.state = torch.stack([position, velocity], dim=1)
        return torch.full((self.n,), -1.0, dtype=torch.float32, device=self.device), terminated


TORCH_ENVS: dict[str, type[TorchEnv]] = {c.env_id: c for c in (TorchMountainCar,)}
