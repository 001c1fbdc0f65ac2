"""Tasks stepped as tensors on the population's device: ``n`` copies in one call, with no host round trip.

Each is its numpy twin in :mod:`agents.population.envs` (the same float64 arithmetic in the same order; the device's
``cos`` and ``sin`` may differ from numpy's in the last bit, so MountainCar's and Acrobot's states agree to float
tolerance, Catcher's and Pixelcopter's bit for bit, and discrete outcomes exactly on recorded action sequences:
tests/test_population_device.py), with its resets and random events drawn by counter
(:func:`agents.population.counter.uniform`, stream ``RESET``, the copy's ``k``-th generator call) rather than from a numpy
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
from agents.envs import pixelcopter as _copter

from .counter import RESET, below, uniform
from .envs import AcrobotTask, MountainCarTask, rk4_step

__all__ = ["TorchEnv", "TorchMountainCar", "TorchAcrobot", "TorchCatcher", "TorchPixelcopter", "TORCH_ENVS",
           "TorchStep"]


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

    def _reset_where(self, done: Tensor) -> None:
        """Reset the copies where ``done`` (their next reset state; the generator calls it took)."""
        self.state = torch.where(done[:, None], self._initial(), self.state)
        self.resets = self.resets + done * self.draws_per_reset

    def reset(self) -> Tensor:
        self._reset_where(torch.ones(self.n, dtype=torch.bool, device=self.device))
        self.elapsed = torch.zeros_like(self.elapsed)
        return self.observe()

    def step(self, actions: Tensor) -> TorchStep:
        reward, terminated = self._dynamics(actions)
        elapsed = self.elapsed + 1
        truncated = (elapsed >= self.max_steps) & ~terminated
        terminal = self.observe()
        done = terminated | truncated
        self._reset_where(done)
        self.elapsed = torch.where(done, 0, elapsed)
        return TorchStep(self.observe(), reward, terminated, truncated, terminal)


class TorchMountainCar(MountainCarTask, TorchEnv):
    """Gymnasium's MountainCar-v0 (discrete): state (position, velocity)."""

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


class TorchAcrobot(AcrobotTask, TorchEnv):
    """Gymnasium's Acrobot-v1 ("book" dynamics, RK4 over dt = 0.2): state (theta1, theta2, dtheta1, dtheta2); a
    reset state stays float32 until the copy's first step, as in Gymnasium."""

    def __init__(self, seeds: Tensor, max_episode_steps: int | None = None) -> None:
        super().__init__(seeds, max_episode_steps)
        self.fresh = torch.zeros(self.n, dtype=torch.bool, device=self.device)  # reset, not stepped since
        self.torques = torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64, device=self.device)

    def _state_dim(self) -> int:
        return 4

    def _initial(self) -> Tensor:
        u = uniform(self.seeds[:, None], RESET, self.resets[:, None], torch.arange(4, device=self.device)[None])
        return (-0.1 + (0.1 - -0.1) * u).to(torch.float32).to(torch.float64)

    def _reset_where(self, done: Tensor) -> None:
        super()._reset_where(done)
        self.fresh = self.fresh | done  # (the dynamics cleared it for every copy stepped)

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
        ns = rk4_step(self._dsdt, self.state, self.torques[actions], self.dt)
        angles = ns[:, :2]
        for _ in range(5):  # Gymnasium's wrap: subtract (add) the range while above (below); a step's angles stay
            # within 9 pi (velocities clipped at 4 pi and 9 pi), which five passes cover
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


class TorchPixelcopter(TorchEnv):
    """Our PLE Pixelcopter port (:class:`agents.population.envs.BatchedPixelcopter`, whose layout it keeps): state
    (player y, velocity, lives); gates in ``gate_x``, ``gate_y`` ``(n, 2)`` (``n_gates``, oldest first), terrain
    columns in ``terrain_x``, ``terrain_y`` ``(n, terrain_slots)`` (``n_terrain``, in creation order), empty slots at
    x = ``far``. The gate events the numpy env runs per copy (a gate passed or scrolled out, at most two gates) are
    written out case by case as selections. Generator calls: a new gate two (x, y), a terrain batch two (its
    frequency, then its phases by index); a reset four (a gate, then a batch)."""

    env_id, obs_dim, n_actions, default_max_steps = "Pixelcopter-PLE-v0", 7, 2, 500
    draws_per_reset = 4
    c = _copter
    scroll = c.SPEED * c.DT_MS
    terrain_batch = c.WIDTH * 4 // c.TERRAIN_WIDTH
    terrain_slots = c.TERRAIN_MIN_COLUMNS + terrain_batch + 2
    far = 1e9
    player_left, player_size = c.PLAYER_X - c.PLAYER_RECT_SIZE // 2, c.PLAYER_RECT_SIZE
    hit_from = player_left - (c.TERRAIN_WIDTH - c.TERRAIN_WIDTH // 2) + 1

    def __init__(self, seeds: Tensor, max_episode_steps: int | None = None) -> None:
        super().__init__(seeds, max_episode_steps)
        dev, f64, n = self.device, torch.float64, self.n
        self.accel = torch.tensor([self.c.CLIMB_ACCEL * self.c.DT_MS, self.c.FALL_ACCEL * self.c.DT_MS], dtype=f64,
                                  device=dev)
        self.gate_x, self.gate_y = torch.full((n, 2), self.far, dtype=f64, device=dev), torch.zeros(n, 2, dtype=f64,
                                                                                                    device=dev)
        self.n_gates = torch.zeros(n, dtype=torch.int64, device=dev)
        self.terrain_x = torch.full((n, self.terrain_slots), self.far, dtype=f64, device=dev)
        self.terrain_y = torch.zeros(n, self.terrain_slots, dtype=f64, device=dev)
        self.n_terrain = torch.zeros(n, dtype=torch.int64, device=dev)
        self.slots = torch.arange(self.terrain_slots, device=dev)
        self.start = torch.tensor([self.c.PLAYER_START_Y, 0.0, 1.0], dtype=f64, device=dev)  # (made once: no copy
        # from the host in a step)

    def _state_dim(self) -> int:
        return 3

    def _initial(self) -> Tensor:
        return self.start.expand(self.n, 3)

    def _new_gate(self, call: Tensor) -> tuple[Tensor, Tensor]:
        """Every copy's new gate ``(x, y)`` from generator calls ``call`` and ``call + 1``."""
        c = self.c
        x = c.WIDTH + below(uniform(self.seeds, RESET, call), int(c.WIDTH * 1.5) - c.WIDTH)
        low, high = int(c.HEIGHT * 0.25), int(c.HEIGHT * 0.75)
        y = low + below(uniform(self.seeds, RESET, call + 1), high - low)
        return x.to(torch.float64), y.to(torch.float64)

    def _add_terrain(self, where: Tensor, start: int, end: int, call: Tensor) -> None:
        """Append a batch of columns to the copies ``where`` (generator calls ``call``: the frequency, ``call + 1``:
        the phases by index), as ``PixelcopterEnv._add_terrain``."""
        c = self.c
        centres = torch.arange(start + c.TERRAIN_WIDTH // 2, end + c.TERRAIN_WIDTH // 2, c.TERRAIN_WIDTH,
                               dtype=torch.float64, device=self.device)
        freq = 4.5 / c.WIDTH + (-0.01 + (0.01 - -0.01) * uniform(self.seeds, RESET, call))
        index = torch.arange(len(centres), device=self.device)
        phases = 0.0 + (0.5 - 0.0) * uniform(self.seeds[:, None], RESET, call[:, None] + 1, index[None])
        jitter = (c.HEIGHT * 0.125) * torch.sin(freq[:, None] * centres[None] + phases)
        heights = torch.trunc(c.HEIGHT / 2.0 + jitter)
        at = self.slots[None] - self.n_terrain[:, None]  # (n, slots): the batch's column for each slot
        put = where[:, None] & (at >= 0) & (at < len(centres))
        at = at.clamp(0, len(centres) - 1)
        self.terrain_x = torch.where(put, centres[at], self.terrain_x)
        self.terrain_y = torch.where(put, heights.gather(1, at), self.terrain_y)
        self.n_terrain = self.n_terrain + where * len(centres)

    def _reset_where(self, done: Tensor) -> None:
        self.state = torch.where(done[:, None], self._initial(), self.state)
        x, y = self._new_gate(self.resets)
        self.gate_x = torch.where(done[:, None], torch.stack([x, torch.full_like(x, self.far)], 1), self.gate_x)
        self.gate_y = torch.where(done[:, None], torch.stack([y, self.gate_y[:, 1]], 1), self.gate_y)
        self.n_gates = torch.where(done, 1, self.n_gates)
        self.terrain_x = torch.where(done[:, None], self.far, self.terrain_x)
        self.n_terrain = torch.where(done, 0, self.n_terrain)
        self._add_terrain(done, 0, self.c.WIDTH * 4, self.resets + 2)
        self.resets = self.resets + done * self.draws_per_reset

    def _columns_at_player(self, top: Tensor) -> tuple[Tensor, Tensor]:
        c = self.c
        first = (self.terrain_x < self.hit_from).sum(1, keepdim=True)
        slots = first + torch.arange(2, device=self.device)[None]
        x, y = self.terrain_x.gather(1, slots), self.terrain_y.gather(1, slots)
        hits = _collide(self.player_left, top, self.player_size, self.player_size, torch.trunc(x) - c.TERRAIN_WIDTH // 2,
                        y - c.TERRAIN_RECT_HEIGHT // 2, c.TERRAIN_WIDTH, c.TERRAIN_RECT_HEIGHT)
        return y, hits

    def _gate_events(self) -> Tensor:
        """``PixelcopterEnv.step``'s gate loop over the (at most two) gates, oldest first; the reward for passing."""
        c, far = self.c, self.far
        (x0, x1), (y0, y1), count = self.gate_x.unbind(1), self.gate_y.unbind(1), self.n_gates
        passed0 = (count == 1) & (x0 <= c.PLAYER_X)  # the first gate: passed while alone (a new one is added)
        nx, ny = self._new_gate(self.resets)
        self.resets = self.resets + 2 * passed0
        bx, by, n = torch.where(passed0, nx, x1), torch.where(passed0, ny, y1), count + passed0
        gone0 = x0 <= -c.BLOCK_WIDTH  # the first gate scrolled out
        ax, ay = torch.where(gone0, bx, x0), torch.where(gone0, by, y0)
        bx, by, n = torch.where(gone0, far, bx), torch.where(gone0, 0.0, by), n - gone0.long()
        second = count == 2  # the second gate of the list the loop began with
        passed1 = second & (x1 <= c.PLAYER_X) & (n == 1)
        nx, ny = self._new_gate(self.resets)
        self.resets = self.resets + 2 * passed1
        bx, by, n = torch.where(passed1, nx, bx), torch.where(passed1, ny, by), n + passed1
        gone1 = second & (x1 <= -c.BLOCK_WIDTH)  # it sits first if the first gate went, else second
        ax, ay = torch.where(gone1 & gone0, bx, ax), torch.where(gone1 & gone0, by, ay)
        bx, by = torch.where(gone1, far, bx), torch.where(gone1, 0.0, by)
        self.gate_x, self.gate_y, self.n_gates = torch.stack([ax, bx], 1), torch.stack([ay, by], 1), n - gone1.long()
        return (passed0 | passed1).to(torch.float32)

    def _dynamics(self, actions: Tensor) -> tuple[Tensor, Tensor]:
        c = self.c
        y, v, lives = self.state.unbind(1)
        v = (v + self.accel[actions]) * c.MOMENTUM_DECAY
        y = y + v
        top = torch.trunc(y)[:, None] - self.player_size // 2
        self.gate_x = self.gate_x - self.scroll
        self.terrain_x = self.terrain_x - self.scroll
        gate_hits = _collide(self.player_left, top, self.player_size, self.player_size,
                             torch.trunc(self.gate_x) - c.BLOCK_WIDTH // 2, self.gate_y - c.BLOCK_HEIGHT // 2,
                             c.BLOCK_WIDTH, c.BLOCK_HEIGHT)
        column_y, hits = self._columns_at_player(top)
        ceiling = (y - c.PLAYER_HEIGHT)[:, None] <= column_y - c.TERRAIN_GAP_HALF
        floor = y[:, None] >= column_y + c.TERRAIN_GAP_HALF
        lives = lives - (gate_hits.sum(1) + (hits & ceiling).sum(1) + (hits & floor).sum(1) + (y < c.SCREEN_TOP)
                         + (y > c.SCREEN_BOTTOM))
        self.state = torch.stack([y, v, lives], 1)
        reward = self._gate_events()
        gone = self.terrain_x[:, 0] <= -c.TERRAIN_WIDTH  # (one column at most, the first)
        shifted = lambda t, empty: torch.cat([t[:, 1:], torch.full_like(t[:, :1], empty)], 1)  # noqa: E731
        self.terrain_x = torch.where(gone[:, None], shifted(self.terrain_x, self.far), self.terrain_x)
        self.terrain_y = torch.where(gone[:, None], shifted(self.terrain_y, 0.0), self.terrain_y)
        self.n_terrain = self.n_terrain - gone.long()
        reward = reward + gone
        refill = self.n_terrain <= c.TERRAIN_MIN_COLUMNS
        self._add_terrain(refill, c.WIDTH, c.WIDTH * 5, self.resets)
        self.resets = self.resets + 2 * refill
        terminated = lives <= 0
        return torch.where(terminated, reward + c.REWARD_LOSS, reward).to(torch.float32), terminated

    def observe(self) -> Tensor:
        c, y = self.c, self.state[:, 0]
        column_y, hits = self._columns_at_player(torch.trunc(y)[:, None] - self.player_size // 2)
        column_y = torch.where(hits[:, 0], column_y[:, 0], column_y[:, 1])
        nearest = (self.terrain_x - c.PLAYER_X).abs().argmin(1, keepdim=True)
        column_y = torch.where(hits.any(1), column_y, self.terrain_y.gather(1, nearest)[:, 0])
        ahead = self.gate_x - c.PLAYER_X
        gate = torch.where((0 < ahead) & (ahead < c.NO_GATE_DIST), self.gate_x, math.inf).argmin(1, keepdim=True)
        gate_y, ahead = self.gate_y.gather(1, gate)[:, 0], ahead.gather(1, gate)[:, 0]
        return torch.stack([y, self.state[:, 1], y - (column_y - c.TERRAIN_GAP_HALF),
                            (column_y + c.TERRAIN_GAP_HALF) - y, ahead, gate_y, gate_y + c.BLOCK_HEIGHT],
                           1).to(torch.float32)


TORCH_ENVS: dict[str, type[TorchEnv]] = {c.env_id: c for c in (TorchMountainCar, TorchAcrobot, TorchCatcher,
                                                                TorchPixelcopter)}
