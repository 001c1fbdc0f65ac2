"""Classic-control tasks stepped as arrays: ``n`` copies of MountainCar-v0 or Acrobot-v1 in one numpy call per step.

Each copy is the Gymnasium env, step for step: the same float64 arithmetic in the same order (squares through
``pow`` as Gymnasium's scalar code; tests/test_population_envs.py compares states bit for bit on recorded action
sequences), the same ``float32`` observations, rewards and terminations, the time limit as ``TimeLimit`` applies it
(``max_episode_steps``; truncated only where not terminated), and resets drawn from each copy's own generator,
seeded as SB3's ``make_vec_env`` seeds env ``i`` (``seed + i``) and advanced only by that copy's resets.

:meth:`BatchedEnv.step` resets finished copies at once, as SB3's ``DummyVecEnv`` does, and returns the observation
each finished copy ended in (``terminal``) beside the new ones. Acrobot's torque noise (0 in Gymnasium) is not
modelled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
from gymnasium.utils import seeding

__all__ = ["BatchedEnv", "BatchedMountainCar", "BatchedAcrobot", "BATCHED_ENVS", "make_batched", "Step"]


class Step:
    """One step of ``n`` copies: ``obs (n, d)`` after auto-reset, ``reward (n,)`` float32, ``terminated``,
    ``truncated`` ``(n,)`` bool, ``terminal (n, d)``: the observation each copy ended in (``obs`` where it did not)."""

    __slots__ = ("obs", "reward", "terminated", "truncated", "terminal")

    def __init__(self, obs: np.ndarray, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                 terminal: np.ndarray) -> None:
        self.obs, self.reward, self.terminated, self.truncated, self.terminal = obs, reward, terminated, truncated, \
            terminal

    @property
    def done(self) -> np.ndarray:
        return self.terminated | self.truncated


class BatchedEnv:
    """``n`` copies of one task (subclasses: the dynamics); ``max_episode_steps`` as Gymnasium's registration; copy
    ``i`` seeded with ``seed + i``, or ``seeds[i]``."""

    env_id: ClassVar[str]
    obs_dim: ClassVar[int]
    n_actions: ClassVar[int]
    default_max_steps: ClassVar[int]

    def __init__(self, n: int, seed: int = 0, max_episode_steps: int | None = None,
                 seeds: Sequence[int] | None = None) -> None:
        if n < 1:
            raise ValueError(f"{type(self).__name__}: n must be >= 1, got {n}")
        if seeds is not None and len(seeds) != n:
            raise ValueError(f"{type(self).__name__}: {len(seeds)} seeds for {n} copies")
        self.n = int(n)
        self.max_steps = int(max_episode_steps or self.default_max_steps)
        self.rngs = [seeding.np_random(s)[0] for s in (seeds if seeds is not None else range(seed, seed + self.n))]
        self.state = np.zeros((self.n, self._state_dim()))
        self.elapsed = np.zeros(self.n, dtype=np.int64)

    def _state_dim(self) -> int:
        raise NotImplementedError

    def _reset_one(self, i: int) -> None:
        raise NotImplementedError

    def _dynamics(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Advance ``self.state``; ``(reward float32 (n,), terminated bool (n,))``."""
        raise NotImplementedError

    def observe(self) -> np.ndarray:
        raise NotImplementedError

    def reset(self) -> np.ndarray:
        """Reset every copy; observations ``(n, obs_dim)`` float32."""
        for i in range(self.n):
            self._reset_one(i)
        self.elapsed[:] = 0
        return self.observe()

    def step(self, actions: np.ndarray) -> Step:
        actions = np.asarray(actions)
        if actions.shape != (self.n,) or actions.min() < 0 or actions.max() >= self.n_actions:
            raise ValueError(f"{self.env_id}: actions must be {self.n} integers in [0, {self.n_actions}), got "
                             f"shape {actions.shape}")
        reward, terminated = self._dynamics(actions.astype(np.int64))
        self.elapsed += 1
        truncated = (self.elapsed >= self.max_steps) & ~terminated
        obs = self.observe()
        terminal = obs.copy()
        done = np.flatnonzero(terminated | truncated)
        for i in done:
            self._reset_one(int(i))
            self.elapsed[i] = 0
        if done.size:
            obs = self.observe()
        return Step(obs, reward, terminated, truncated, terminal)


class BatchedMountainCar(BatchedEnv):
    """Gymnasium's MountainCar-v0 (discrete): state (position, velocity)."""

    env_id, obs_dim, n_actions, default_max_steps = "MountainCar-v0", 2, 3, 200
    min_position, max_position, max_speed, goal_position, goal_velocity = -1.2, 0.6, 0.07, 0.5, 0
    force, gravity = 0.001, 0.0025

    def _state_dim(self) -> int:
        return 2

    def _reset_one(self, i: int) -> None:
        self.state[i] = (self.rngs[i].uniform(low=-0.6, high=-0.4), 0)

    def _dynamics(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        position, velocity = self.state[:, 0].copy(), self.state[:, 1].copy()
        velocity += (actions - 1) * self.force + np.cos(3 * position) * (-self.gravity)
        velocity = np.clip(velocity, -self.max_speed, self.max_speed)
        position += velocity
        position = np.clip(position, self.min_position, self.max_position)
        velocity[(position == self.min_position) & (velocity < 0)] = 0
        terminated = (position >= self.goal_position) & (velocity >= self.goal_velocity)
        self.state[:, 0], self.state[:, 1] = position, velocity
        return np.full(self.n, -1.0, dtype=np.float32), terminated

    def observe(self) -> np.ndarray:
        return self.state.astype(np.float32)


class BatchedAcrobot(BatchedEnv):
    """Gymnasium's Acrobot-v1 ("book" dynamics, RK4 over dt = 0.2): state (theta1, theta2, dtheta1, dtheta2)."""

    env_id, obs_dim, n_actions, default_max_steps = "Acrobot-v1", 6, 3, 500
    dt = 0.2
    m1 = m2 = l1 = 1.0
    lc1 = lc2 = 0.5
    moi = 1.0
    max_vel_1, max_vel_2 = 4 * math.pi, 9 * math.pi
    torques = np.array([-1.0, 0.0, 1.0])

    def _state_dim(self) -> int:
        return 4

    def _reset_one(self, i: int) -> None:
        self.state[i] = self.rngs[i].uniform(low=-0.1, high=0.1, size=(4,)).astype(np.float32)
        self.fresh[i] = True  # Gymnasium keeps a reset state as float32 until the first step

    def __init__(self, n: int, seed: int = 0, max_episode_steps: int | None = None,
                 seeds: Sequence[int] | None = None) -> None:
        super().__init__(n, seed, max_episode_steps, seeds)
        self.fresh = np.zeros(self.n, dtype=bool)  # copies reset and not stepped since

    def _dsdt(self, s: np.ndarray, a: np.ndarray) -> np.ndarray:
        """Gymnasium's ``_dsdt`` on ``(n, 4)`` states and torques ``(n,)``: the same expressions, term order kept."""
        m1, m2, l1, lc1, lc2, I1, I2, g, pi = self.m1, self.m2, self.l1, self.lc1, self.lc2, self.moi, self.moi, 9.8, \
            math.pi
        theta1, theta2, dtheta1, dtheta2 = s[:, 0], s[:, 1], s[:, 2], s[:, 3]
        sq = _square
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * np.cos(theta2)) + I1 + I2
        d2 = m2 * (lc2**2 + l1 * lc2 * np.cos(theta2)) + I2
        phi2 = m2 * lc2 * g * np.cos(theta1 + theta2 - pi / 2.0)
        phi1 = (-m2 * l1 * lc2 * sq(dtheta2) * np.sin(theta2) - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * np.sin(theta2)
                + (m1 * lc1 + m2 * l1) * g * np.cos(theta1 - pi / 2) + phi2)
        ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * sq(dtheta1) * np.sin(theta2) - phi2) / \
            (m2 * lc2**2 + I2 - sq(d2) / d1)
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return np.stack([dtheta1, dtheta2, ddtheta1, ddtheta2], axis=1)

    def _dynamics(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # Gymnasium's rk4 integrates the state augmented with the torque (whose derivative is 0): the same numbers
        a = self.torques[actions]
        y0, dt = self.state, self.dt
        dt2 = dt / 2.0
        k1 = self._dsdt(y0, a)
        k2 = self._dsdt(y0 + dt2 * k1, a)
        k3 = self._dsdt(y0 + dt2 * k2, a)
        k4 = self._dsdt(y0 + dt * k3, a)
        ns = y0 + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        ns[:, 0] = _wrap(ns[:, 0], -math.pi, math.pi)
        ns[:, 1] = _wrap(ns[:, 1], -math.pi, math.pi)
        ns[:, 2] = np.minimum(np.maximum(ns[:, 2], -self.max_vel_1), self.max_vel_1)
        ns[:, 3] = np.minimum(np.maximum(ns[:, 3], -self.max_vel_2), self.max_vel_2)
        self.state = ns
        self.fresh[:] = False
        terminated = -np.cos(ns[:, 0]) - np.cos(ns[:, 1] + ns[:, 0]) > 1.0
        return np.where(terminated, 0.0, -1.0).astype(np.float32), terminated

    def observe(self) -> np.ndarray:
        obs = _acrobot_obs(self.state)
        if self.fresh.any():  # (cos and sin of the float32 reset state in float32, as Gymnasium computes them)
            obs[self.fresh] = _acrobot_obs(self.state[self.fresh].astype(np.float32))
        return obs


def _acrobot_obs(s: np.ndarray) -> np.ndarray:
    return np.stack([np.cos(s[:, 0]), np.sin(s[:, 0]), np.cos(s[:, 1]), np.sin(s[:, 1]), s[:, 2], s[:, 3]],
                    axis=1).astype(np.float32)


def _square(x: np.ndarray) -> np.ndarray:
    """``x ** 2`` as Gymnasium's scalar code computes it (C's ``pow``; numpy's array ``**2`` multiplies instead,
    which differs in the last bit for about 1 value in 1300)."""
    return np.float_power(x, 2)


def _wrap(x: np.ndarray, m: float, big: float) -> np.ndarray:
    """Gymnasium's ``wrap`` elementwise: subtract (add) the range while above (below) it."""
    x = x.copy()
    diff = big - m
    while (above := x > big).any():
        x[above] = x[above] - diff
    while (below := x < m).any():
        x[below] = x[below] + diff
    return x


BATCHED_ENVS: dict[str, type[BatchedEnv]] = {c.env_id: c for c in (BatchedMountainCar, BatchedAcrobot)}


def make_batched(env_id: str, n: int, seed: int = 0, max_episode_steps: int | None = None,
                 seeds: Sequence[int] | None = None) -> BatchedEnv:
    """``n`` copies of ``env_id``; ValueError naming the tasks that have a batched version."""
    if env_id not in BATCHED_ENVS:
        raise ValueError(f"no batched version of {env_id!r}; the population engine runs {', '.join(BATCHED_ENVS)}")
    return BATCHED_ENVS[env_id](n, seed, max_episode_steps, seeds)
