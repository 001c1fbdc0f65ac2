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

import math
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor

from agents.envs import catcher as _catcher

from .counter import RESET, below, uniform

__all__ = ["TorchEnv", "TorchMountainCar", "TorchAcrobot", "TorchCatcher", "TORCH_ENVS", "TorchStep"]


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
    #: the generator calls a reset makes (each call one counter: its values are the counter's indices)
    draws_per_reset: ClassVar[int] = 1

    def __init__(self, seeds: Tensor, max_episode_steps: int | None = None) -> None:
        self.seeds = seeds.to(torch.int64)
        self.n, self.device = len(seeds), seeds.device
        self.max_steps = int(max_episode_steps or self.default_max_steps)
        self.state = torch.zeros(self.n, self._state_dim(), dtype=torch.float64, device=self.device)
        self.elapsed = torch.zeros(self.n, dtype=torch.int64, device=self.device)
        self.resets = torch.zeros(self.n, dtype=torch.int64, device=self.device)  # generator calls made per copy

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
        self.resets = self.resets + self.draws_per_reset
        self.elapsed = torch.zeros_like(self.elapsed)
        return self.observe()

    def step(self, actions: Tensor) -> TorchStep:
        reward, terminated = self._dynamics(actions)
        elapsed = self.elapsed + 1
        truncated = (elapsed >= self.max_steps) & ~terminated
        terminal = self.observe()
        done = terminated | truncated
        self.state = torch.where(done[:, None], self._initial(), self.state)
        self.resets = self.resets + done * self.draws_per_reset
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


class TorchAcrobot(TorchEnv):
    """Gymnasium's Acrobot-v1 ("book" dynamics, RK4 over dt = 0.2): state (theta1, theta2, dtheta1, dtheta2); a
    reset state stays float32 until the copy's first step, as in Gymnasium."""

    env_id, obs_dim, n_actions, default_max_steps = "Acrobot-v1", 6, 3, 500
    dt = 0.2
    m1 = m2 = l1 = 1.0
    lc1 = lc2 = 0.5
    moi = 1.0
    max_vel_1, max_vel_2 = 4 * math.pi, 9 * math.pi

    def __init__(self, seeds: Tensor, max_episode_steps: int | None = None) -> None:
        super().__init__(seeds, max_episode_steps)
        self.fresh = torch.zeros(self.n, dtype=torch.bool, device=self.device)  # reset, not stepped since
        self.torques = torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64, device=self.device)

    def _state_dim(self) -> int:
        return 4

    def _initial(self) -> Tensor:
        u = uniform(self.seeds[:, None], RESET, self.resets[:, None], torch.arange(4, device=self.device)[None])
        return (-0.1 + (0.1 - -0.1) * u).to(torch.float32).to(torch.float64)

    def reset(self) -> Tensor:
        self.fresh = torch.ones_like(self.fresh)
        return super().reset()

    def step(self, actions: Tensor) -> TorchStep:
        out = super().step(actions)
        self.fresh = out.terminated | out.truncated
        return out._replace(obs=self.observe())

    def _dsdt(self, s: Tensor, a: Tensor) -> Tensor:
        """:meth:`agents.population.envs.BatchedAcrobot._dsdt`: the same expressions, term order kept."""
        m1, m2, l1, lc1, lc2, I1, I2, g, pi = self.m1, self.m2, self.l1, self.lc1, self.lc2, self.moi, self.moi, 9.8, \
            math.pi
        theta1, theta2, dtheta1, dtheta2 = s.unbind(1)
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * torch.cos(theta2)) + I1 + I2
        d2 = m2 * (lc2**2 + l1 * lc2 * torch.cos(theta2)) + I2
        phi2 = m2 * lc2 * g * torch.cos(theta1 + theta2 - pi / 2.0)
        phi1 = (-m2 * l1 * lc2 * dtheta2.square() * torch.sin(theta2)
                - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * torch.sin(theta2)
                + (m1 * lc1 + m2 * l1) * g * torch.cos(theta1 - pi / 2) + phi2)
        ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * dtheta1.square() * torch.sin(theta2) - phi2) / \
            (m2 * lc2**2 + I2 - d2.square() / d1)
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return torch.stack([dtheta1, dtheta2, ddtheta1, ddtheta2], dim=1)

    def _dynamics(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        a, y0, dt = self.torques[actions], self.state, self.dt
        dt2 = dt / 2.0
        k1 = self._dsdt(y0, a)
        k2 = self._dsdt(y0 + dt2 * k1, a)
        k3 = self._dsdt(y0 + dt2 * k2, a)
        k4 = self._dsdt(y0 + dt * k3, a)
        ns = y0 + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        angles = ns[:, :2]
        for _ in range(2):  # Gymnasium's wrap: subtract (add) the range while above (below); twice covers a step
            angles = torch.where(angles > math.pi, angles - 2 * math.pi, angles)
            angles = torch.where(angles < -math.pi, angles + 2 * math.pi, angles)
        ns = torch.cat([angles, ns[:, 2:3].clamp(-self.max_vel_1, self.max_vel_1),
                        ns[:, 3:4].clamp(-self.max_vel_2, self.max_vel_2)], dim=1)
        self.state = ns
        self.fresh = torch.zeros_like(self.fresh)
        terminated = -torch.cos(ns[:, 0]) - torch.cos(ns[:, 1] + ns[:, 0]) > 1.0
        return torch.where(terminated, 0.0, -1.0).to(torch.float32), terminated

    def observe(self) -> Tensor:
        def obs(s: Tensor) -> Tensor:
            return torch.stack([s[:, 0].cos(), s[:, 0].sin(), s[:, 1].cos(), s[:, 1].sin(), s[:, 2], s[:, 3]],
                               dim=1).to(torch.float32)

        # (cos and sin of a float32 reset state in float32, as Gymnasium computes them)
        return torch.where(self.fresh[:, None], obs(self.state.to(torch.float32)), obs(self.state))


def _collide(a_left: Tensor | float, a_top: Tensor | float, a_w: int, a_h: int, b_left: Tensor | float,
             b_top: Tensor | float, b_w: int, b_h: int) -> Tensor:
    """pygame ``Rect.colliderect`` elementwise (:func:`agents.population.envs._collide`)."""
    return (a_left < b_left + b_w) & (a_left + a_w > b_left) & (a_top < b_top + b_h) & (a_top + a_h > b_top)


class TorchCatcher(TorchEnv):
    """Our PLE Catcher port (:class:`agents.population.envs.BatchedCatcher`): state (paddle centre x, paddle
    velocity, fruit centre x, fruit centre y, lives). A fruit's respawn takes two generator calls (x, then y)."""

    env_id, obs_dim, n_actions, default_max_steps = "Catcher-PLE-v0", 4, 3, 2000
    draws_per_reset = 2

    def __init__(self, seeds: Tensor, max_episode_steps: int | None = None) -> None:
        super().__init__(seeds, max_episode_steps)
        dev, f64 = self.device, torch.float64
        self.action_dx = torch.tensor(_catcher.ACTION_DX, dtype=f64, device=dev)
        self.xs = torch.as_tensor(_catcher.FRUIT_XS, dtype=f64, device=dev)
        self.ys = torch.as_tensor(_catcher.FRUIT_YS, dtype=f64, device=dev)
        self.offset = torch.tensor([26.0, 0.0, 26.0, 20.0], dtype=f64, device=dev)
        self.scale = torch.tensor([26.0, 8.0, 26.0, 45.0], dtype=f64, device=dev)

    def _state_dim(self) -> int:
        return 5

    def _fruit(self) -> tuple[Tensor, Tensor]:
        """Every copy's next fruit ``(x, y)`` (generator calls ``resets`` and ``resets + 1``)."""
        x = self.xs[below(uniform(self.seeds, RESET, self.resets), len(self.xs))]
        return x, self.ys[below(uniform(self.seeds, RESET, self.resets + 1), len(self.ys))]

    def _initial(self) -> Tensor:
        x, y = self._fruit()
        paddle = torch.full_like(x, float(math.trunc(_catcher.PADDLE_START_X)))
        return torch.stack([paddle, torch.zeros_like(x), x, y, torch.full_like(x, _catcher.INIT_LIVES)], dim=1)

    def _respawn(self, where: Tensor, fx: Tensor, fy: Tensor) -> tuple[Tensor, Tensor]:
        x, y = self._fruit()
        self.resets = self.resets + 2 * where
        return torch.where(where, x, fx), torch.where(where, y, fy)

    def _dynamics(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        c = _catcher
        px, pv, fx, fy, lives = self.state.unbind(1)
        missed = fy >= c.HEIGHT
        lives = lives - missed.to(torch.float64)
        fx, fy = self._respawn(missed, fx, fy)
        half = c.FRUIT_SIZE // 2
        caught = _collide(px - c.PADDLE_WIDTH // 2, c.PADDLE_Y - c.PADDLE_HEIGHT // 2, c.PADDLE_WIDTH,
                          c.PADDLE_HEIGHT, fx - half, fy - half, c.FRUIT_SIZE, c.FRUIT_SIZE)
        fx, fy = self._respawn(caught, fx, fy)
        velocity = (pv + self.action_dx[actions]) * 0.9
        x = px + velocity
        left = x <= 0
        velocity, x = torch.where(left, 0.0, velocity), torch.where(left, 0.0, x)
        right = x + c.PADDLE_WIDTH >= c.WIDTH
        velocity, x = torch.where(right, 0.0, velocity), torch.where(right, float(c.PADDLE_MAX_X), x)
        fy = torch.trunc(fy + c.FRUIT_FALL_SPEED * c.DT_MS)
        self.state = torch.stack([torch.trunc(x), velocity, fx, fy, lives], dim=1)
        terminated = lives == 0
        reward = caught.to(torch.float32) - missed.to(torch.float32)
        return torch.where(terminated, reward + c.REWARD_LOSS, reward), terminated

    def observe(self) -> Tensor:
        return ((self.state[:, :4] - self.offset) / self.scale).to(torch.float32)


TORCH_ENVS: dict[str, type[TorchEnv]] = {c.env_id: c for c in (TorchMountainCar, TorchAcrobot, TorchCatcher)}
