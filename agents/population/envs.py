"""Tasks stepped as arrays: ``n`` copies of MountainCar-v0, Acrobot-v1, Catcher-PLE-v0 or Pixelcopter-PLE-v0 in
one numpy call per step (and per-copy Python only for the PLE games' random events).

Each copy is the single env, step for step: the same float64 arithmetic in the same order (squares through
``pow`` as Gymnasium's scalar code; tests/test_population_envs.py compares states bit for bit on recorded action
sequences), the same ``float32`` observations, rewards and terminations, the time limit as ``TimeLimit`` applies it
(``max_episode_steps``; truncated only where not terminated), and resets drawn from each copy's own generator,
seeded as SB3's ``make_vec_env`` seeds env ``i`` (``seed + i``) and advanced only by that copy's resets (and, in the
PLE games, by its fruit respawns, gates and terrain, in the single env's order).

:meth:`BatchedEnv.step` resets finished copies at once, as SB3's ``DummyVecEnv`` does, and returns the observation
each finished copy ended in (``terminal``) beside the new ones. Acrobot's torque noise (0 in Gymnasium) is not
modelled; the PLE games run with their default ``rect_rounding="truncate"``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
from gymnasium.utils import seeding

from agents.envs import catcher as _catcher
from agents.envs import pixelcopter as _copter

__all__ = ["BatchedEnv", "BatchedMountainCar", "BatchedAcrobot", "BatchedCatcher", "BatchedPixelcopter", "BATCHED_ENVS",
           "make_batched", "Step"]


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


class MountainCarTask:
    """Gymnasium's MountainCar-v0's constants (for the numpy and the tensor version)."""

    env_id, obs_dim, n_actions, default_max_steps = "MountainCar-v0", 2, 3, 200
    min_position, max_position, max_speed, goal_position, goal_velocity = -1.2, 0.6, 0.07, 0.5, 0
    force, gravity = 0.001, 0.0025


class BatchedMountainCar(MountainCarTask, BatchedEnv):
    """Gymnasium's MountainCar-v0 (discrete): state (position, velocity)."""

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


class AcrobotTask:
    """Gymnasium's Acrobot-v1's constants (for the numpy and the tensor version)."""

    env_id, obs_dim, n_actions, default_max_steps = "Acrobot-v1", 6, 3, 500
    dt = 0.2
    m1 = m2 = l1 = 1.0
    lc1 = lc2 = 0.5
    moi = 1.0
    max_vel_1, max_vel_2 = 4 * math.pi, 9 * math.pi


class BatchedAcrobot(AcrobotTask, BatchedEnv):
    """Gymnasium's Acrobot-v1 ("book" dynamics, RK4 over dt = 0.2): state (theta1, theta2, dtheta1, dtheta2)."""

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
        ns = rk4_step(self._dsdt, self.state, a, self.dt)
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


def rk4_step(dsdt: Callable[[Any, Any], Any], y0: Any, a: Any, dt: float) -> Any:
    """One classic Runge-Kutta step of ``dsdt(y, a)`` from ``y0`` over ``dt`` (numpy arrays or torch tensors alike:
    the numpy and the tensor Acrobot take the same step, in the same order as Gymnasium's ``rk4``)."""
    dt2 = dt / 2.0
    k1 = dsdt(y0, a)
    k2 = dsdt(y0 + dt2 * k1, a)
    k3 = dsdt(y0 + dt2 * k2, a)
    k4 = dsdt(y0 + dt * k3, a)
    return y0 + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)


def _wrap(x: np.ndarray, m: float, big: float) -> np.ndarray:
    """Gymnasium's ``wrap`` elementwise: subtract (add) the range while above (below) it."""
    x = x.copy()
    diff = big - m
    while (above := x > big).any():
        x[above] = x[above] - diff
    while (below := x < m).any():
        x[below] = x[below] + diff
    return x


def _collide(a_left: np.ndarray | int, a_top: np.ndarray | int, a_w: int, a_h: int, b_left: np.ndarray | int,
             b_top: np.ndarray | int, b_w: int, b_h: int) -> np.ndarray:
    """pygame ``Rect.colliderect`` (:func:`agents.envs.catcher.rects_collide`) elementwise over broadcast arrays of
    left and top coordinates (whole numbers, float or int)."""
    return (a_left < b_left + b_w) & (a_left + a_w > b_left) & (a_top < b_top + b_h) & (a_top + a_h > b_top)


class BatchedCatcher(BatchedEnv):
    """Our PLE Catcher port (:class:`agents.envs.catcher.CatcherEnv`, ``rect_rounding="truncate"``, its default):
    state (paddle centre x, paddle velocity, fruit centre x, fruit centre y, lives), the ``Rect`` ints as floats.
    Fruit respawns draw from the copy's generator as the single env does (x, then y)."""

    env_id, obs_dim, n_actions, default_max_steps = "Catcher-PLE-v0", 4, 3, 2000
    action_dx = np.array(_catcher.ACTION_DX)
    fruit_fall = _catcher.FRUIT_FALL_SPEED * _catcher.DT_MS
    obs_offset, obs_scale = np.array([26.0, 0.0, 26.0, 20.0]), np.array([26.0, 8.0, 26.0, 45.0])

    def _state_dim(self) -> int:
        return 5

    def _reset_one(self, i: int) -> None:
        self.state[i, :2] = (math.trunc(_catcher.PADDLE_START_X), 0.0)
        self.state[i, 4] = _catcher.INIT_LIVES
        self._respawn_fruit(i)

    def _respawn_fruit(self, i: int) -> None:
        """``CatcherEnv._respawn_fruit``: ``rng.choice(a)`` draws ``a[rng.integers(len(a))]``, so written (faster)."""
        xs, ys = _catcher.FRUIT_XS, _catcher.FRUIT_YS
        self.state[i, 2] = xs[self.rngs[i].integers(xs.size)]
        self.state[i, 3] = ys[self.rngs[i].integers(ys.size)]

    def _dynamics(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s, c = self.state, _catcher
        missed = s[:, 3] >= c.HEIGHT
        s[:, 4] -= missed
        for i in np.flatnonzero(missed):
            self._respawn_fruit(int(i))
        half = c.FRUIT_SIZE // 2
        caught = _collide(s[:, 0] - c.PADDLE_WIDTH // 2, c.PADDLE_Y - c.PADDLE_HEIGHT // 2, c.PADDLE_WIDTH,
                          c.PADDLE_HEIGHT, s[:, 2] - half, s[:, 3] - half, c.FRUIT_SIZE, c.FRUIT_SIZE)
        for i in np.flatnonzero(caught):
            self._respawn_fruit(int(i))
        velocity = (s[:, 1] + self.action_dx[actions]) * 0.9
        x = s[:, 0] + velocity
        left = x <= 0
        velocity[left], x[left] = 0.0, 0
        right = x + c.PADDLE_WIDTH >= c.WIDTH
        velocity[right], x[right] = 0.0, c.PADDLE_MAX_X
        s[:, 0], s[:, 1] = np.trunc(x), velocity
        s[:, 3] = np.trunc(s[:, 3] + self.fruit_fall)
        terminated = s[:, 4] == 0
        reward = caught.astype(np.float32) - missed
        reward[terminated] += c.REWARD_LOSS
        return reward, terminated

    def observe(self) -> np.ndarray:
        """The normalised state (``normalize_state``) ``(n, 4)``."""
        return ((self.state[:, :4] - self.obs_offset) / self.obs_scale).astype(np.float32)


class BatchedPixelcopter(BatchedEnv):
    """Our PLE Pixelcopter port (:class:`agents.envs.pixelcopter.PixelcopterEnv`, ``rect_rounding="truncate"``):
    state (player y, player velocity, lives); gates in ``gate_x``, ``gate_y`` ``(n, 2)`` (``n_gates`` of them per
    copy, oldest first: a copy never has more than two) and terrain columns in ``terrain_x``, ``terrain_y``
    ``(n, terrain_slots)`` (``n_terrain`` per copy, at most 61, in creation order). Empty slots sit at x = ``far``
    (off screen to the right: never hit, passed or removed). Gate events (a gate passed or scrolled out), terrain
    batches and resets run per copy, drawing from the copy's generator as the single env does.

    Creation order is also x order (a batch is added right of the columns left), consecutive columns are at least 2
    pixels apart (4 within a batch), and one column at most scrolls out per frame: so the columns that scroll out are
    each copy's first, and only the first column at ``x >= hit_from`` and the next can overlap the player.
    """

    env_id, obs_dim, n_actions, default_max_steps = "Pixelcopter-PLE-v0", 7, 2, 500
    accel = np.array([_copter.CLIMB_ACCEL * _copter.DT_MS, _copter.FALL_ACCEL * _copter.DT_MS])  # (up, noop)
    scroll = _copter.SPEED * _copter.DT_MS
    terrain_batch = _copter.WIDTH * 4 // _copter.TERRAIN_WIDTH  # columns added at once
    terrain_slots = _copter.TERRAIN_MIN_COLUMNS + terrain_batch + 2  # (2 empty: the candidate pair stays in range)
    far = 1e9
    player_left, player_size = _copter.PLAYER_X - _copter.PLAYER_RECT_SIZE // 2, _copter.PLAYER_RECT_SIZE
    # the least x whose column Rect reaches right of the player's left edge
    hit_from = player_left - (_copter.TERRAIN_WIDTH - _copter.TERRAIN_WIDTH // 2) + 1

    def __init__(self, n: int, seed: int = 0, max_episode_steps: int | None = None,
                 seeds: Sequence[int] | None = None) -> None:
        super().__init__(n, seed, max_episode_steps, seeds)
        self.gate_x, self.gate_y = np.full((self.n, 2), self.far), np.zeros((self.n, 2), dtype=np.int64)
        self.n_gates = np.zeros(self.n, dtype=np.int64)
        self.terrain_x = np.full((self.n, self.terrain_slots), self.far)
        self.terrain_y = np.zeros((self.n, self.terrain_slots), dtype=np.int64)
        self.n_terrain = np.zeros(self.n, dtype=np.int64)
        self.rows = np.arange(self.n)

    def _state_dim(self) -> int:
        return 3

    def _reset_one(self, i: int) -> None:
        self.state[i] = (_copter.PLAYER_START_Y, 0.0, 1)
        self._set_gates(i, [self._new_gate(i)])
        self.terrain_x[i], self.n_terrain[i] = self.far, 0
        self._add_terrain(i, 0, _copter.WIDTH * 4)

    def _new_gate(self, i: int) -> list[float]:
        """``[x, y]`` of a new gate, drawn as ``PixelcopterEnv._add_gate`` draws it."""
        x = int(self.rngs[i].integers(_copter.WIDTH, int(_copter.WIDTH * 1.5)))
        y = int(self.rngs[i].integers(int(_copter.HEIGHT * 0.25), int(_copter.HEIGHT * 0.75)))
        return [float(x), y]

    def _set_gates(self, i: int, gates: list[list[float]]) -> None:
        self.gate_x[i], self.n_gates[i] = self.far, len(gates)
        for j, (x, y) in enumerate(gates):
            self.gate_x[i, j], self.gate_y[i, j] = x, y

    def _add_terrain(self, i: int, start: int, end: int) -> None:
        """Append a batch of columns to copy ``i``: ``PixelcopterEnv._add_terrain``'s draws and arithmetic."""
        c, rng = _copter, self.rngs[i]
        centres = np.arange(start + c.TERRAIN_WIDTH // 2, end + c.TERRAIN_WIDTH // 2, c.TERRAIN_WIDTH)
        freq = 4.5 / c.WIDTH + rng.uniform(-0.01, 0.01)
        phases = rng.uniform(0.0, 0.5, size=centres.size)
        jitter = (c.HEIGHT * 0.125) * np.sin(freq * centres + phases)
        k = self.n_terrain[i]
        self.terrain_x[i, k:k + centres.size] = centres
        self.terrain_y[i, k:k + centres.size] = (c.HEIGHT / 2.0 + jitter).astype(np.int64)
        self.n_terrain[i] += centres.size

    def _gate_events(self, i: int) -> int:
        """Pass and remove copy ``i``'s gates as ``PixelcopterEnv.step`` does; the reward for passing."""
        k = self.n_gates[i]
        gates = [[float(x), int(y)] for x, y in zip(self.gate_x[i, :k], self.gate_y[i, :k])]
        reward = 0
        for gate in list(gates):
            if gate[0] <= _copter.PLAYER_X and len(gates) == 1:
                reward += 1
                gates.append(self._new_gate(i))
            if gate[0] <= -_copter.BLOCK_WIDTH:
                gates.remove(gate)
        self._set_gates(i, gates)
        return reward

    def _player_top(self, player_y: np.ndarray) -> np.ndarray:
        """``(n, 1)``: the top of the player's ``Rect``."""
        return np.trunc(player_y)[:, None] - self.player_size // 2

    def _columns_at_player(self, player_top: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The two columns per copy that can overlap the player (see the class doc), given the player's ``Rect`` top
        ``(n, 1)``: their gap centres ``(n, 2)`` and whether their ``Rect`` overlaps the player's ``(n, 2)``."""
        c = _copter
        first = (self.terrain_x < self.hit_from).sum(1)
        slots = (self.rows[:, None], first[:, None] + (0, 1))
        x, y = self.terrain_x[slots], self.terrain_y[slots]
        hits = _collide(self.player_left, player_top, self.player_size, self.player_size,
                        np.trunc(x) - c.TERRAIN_WIDTH // 2, y - c.TERRAIN_RECT_HEIGHT // 2, c.TERRAIN_WIDTH,
                        c.TERRAIN_RECT_HEIGHT)
        return y, hits

    def _dynamics(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s, c = self.state, _copter
        s[:, 1] = (s[:, 1] + self.accel[actions]) * c.MOMENTUM_DECAY
        s[:, 0] += s[:, 1]
        y, top = s[:, 0], self._player_top(s[:, 0])
        self.gate_x -= self.scroll
        self.terrain_x -= self.scroll
        gate_hits = _collide(self.player_left, top, self.player_size, self.player_size,
                             np.trunc(self.gate_x) - c.BLOCK_WIDTH // 2, self.gate_y - c.BLOCK_HEIGHT // 2,
                             c.BLOCK_WIDTH, c.BLOCK_HEIGHT)
        column_y, hits = self._columns_at_player(top)
        ceiling = (y - c.PLAYER_HEIGHT)[:, None] <= column_y - c.TERRAIN_GAP_HALF
        floor = y[:, None] >= column_y + c.TERRAIN_GAP_HALF
        s[:, 2] -= (gate_hits.sum(1) + (hits & ceiling).sum(1) + (hits & floor).sum(1) + (y < c.SCREEN_TOP)
                    + (y > c.SCREEN_BOTTOM))

        reward = np.zeros(self.n, dtype=np.float32)
        events = ((self.n_gates == 1) & (self.gate_x[:, 0] <= c.PLAYER_X)) | (self.gate_x <= -c.BLOCK_WIDTH).any(1)
        for i in np.flatnonzero(events):
            reward[i] += self._gate_events(int(i))
        gone = self.terrain_x[:, 0] <= -c.TERRAIN_WIDTH  # (one column at most, the first)
        if gone.any():
            self.terrain_x[gone, :-1], self.terrain_y[gone, :-1] = self.terrain_x[gone, 1:], self.terrain_y[gone, 1:]
            self.terrain_x[gone, -1] = self.far
            self.n_terrain -= gone
            reward += gone
        for i in np.flatnonzero(self.n_terrain <= c.TERRAIN_MIN_COLUMNS):
            self._add_terrain(int(i), c.WIDTH, c.WIDTH * 5)
        terminated = s[:, 2] <= 0
        reward[terminated] += c.REWARD_LOSS
        return reward, terminated

    def observe(self) -> np.ndarray:
        """PLE's ``getGameState()`` per copy ``(n, 7)``, with the single env's fallback column where none overlaps."""
        c, rows, y = _copter, self.rows, self.state[:, 0]
        column_y, hits = self._columns_at_player(self._player_top(y))
        column_y = np.where(hits[:, 0], column_y[:, 0], column_y[:, 1]).astype(np.float64)
        none = ~hits.any(1)
        if none.any():
            column_y[none] = self.terrain_y[none, np.abs(self.terrain_x[none] - c.PLAYER_X).argmin(1)]
        ahead = self.gate_x - c.PLAYER_X
        gate = np.where((0 < ahead) & (ahead < c.NO_GATE_DIST), self.gate_x, np.inf).argmin(1)
        gate_y = self.gate_y[rows, gate]
        return np.array([y, self.state[:, 1], y - (column_y - c.TERRAIN_GAP_HALF), (column_y + c.TERRAIN_GAP_HALF) - y,
                         ahead[rows, gate], gate_y, gate_y + c.BLOCK_HEIGHT], dtype=np.float32).T.copy()


BATCHED_ENVS: dict[str, type[BatchedEnv]] = {c.env_id: c for c in (BatchedMountainCar, BatchedAcrobot, BatchedCatcher,
                                                                     BatchedPixelcopter)}


def make_batched(env_id: str, n: int, seed: int = 0, max_episode_steps: int | None = None,
                 seeds: Sequence[int] | None = None) -> BatchedEnv:
    """``n`` copies of ``env_id``; ValueError naming the tasks that have a batched version."""
    if env_id not in BATCHED_ENVS:
        raise ValueError(f"no batched version of {env_id!r}; the population engine runs {', '.join(BATCHED_ENVS)}")
    return BATCHED_ENVS[env_id](n, seed, max_episode_steps, seeds)
