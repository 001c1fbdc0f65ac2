"""Pixelcopter from the PyGame Learning Environment (PLE), ported to numpy and Gymnasium.

Reproduces ``ple.games.pixelcopter.Pixelcopter(width=48, height=48)`` driven by
``ple.PLE(game, fps=30, force_fps=True)``: every ``step`` advances the game by one frame
of ``dt = 1000 / 30`` milliseconds.

PLE rules reproduced (units: pixels, milliseconds):

* Positions live in integer pygame ``Rect`` s; a float centre is converted to int by
  truncation toward zero (``rect_rounding="truncate"``: pygame < 2.3 and pygame-ce, the
  default) or by rounding half away from zero (``"round"``: pygame >= 2.3).
* Scroll speed ``0.0004 * 48`` pixels/ms (0.64 pixels/frame) for gates and terrain.
* Player at ``x = int(0.35 * 48) = 16``, starting at ``y = 24.0`` with momentum 0. Each frame
  ``momentum += a * dt; momentum *= 0.99; y += momentum`` with ``a = -0.875 * speed`` when
  climbing (action up) and ``a = 0.09 * speed`` otherwise. Its collision ``Rect`` is 2 x 2
  (pygame truncates the 2.4-pixel surface), while the ceiling test uses the height 2.4.
* Terrain: 4-pixel-wide columns, each a 4 x 72 ``Rect`` centred at ``(x, y)`` with an open
  gap ``y - 12 .. y + 12``; ``y = int(24 + 6 * sin(f * x + u))`` with one
  ``f = 4.5 / 48 + U(-0.01, 0.01)`` per batch and ``u = U(0, 0.5)`` per column. 48 columns
  are laid out at reset (centres 2, 6, ..., 190); a batch at centres 50, 54, ..., 238 is
  added whenever 13 or fewer columns remain.
* Gates: one 4 x 9 block centred at ``x`` in ``[48, 72)``, ``y`` in ``[12, 36)`` (integers).
* Frame order (``Pixelcopter.step``): move player, gates and terrain; lose a life per gate
  ``Rect`` hit; for every terrain column whose ``Rect`` the player's overlaps, lose a life
  if ``y - 2.4 <= column_y - 12`` (ceiling) and another if ``y >= column_y + 12`` (floor);
  when the only gate has ``x <= 16`` it is passed (+1) and a new gate spawns; gates with
  ``x <= -4`` are removed; every terrain column reaching ``x <= -4`` is removed with +1;
  lose a life if ``y < 6`` or ``y > 42``; refill terrain; if lives ``<= 0`` add the loss
  reward -5 to that frame. Tick reward 0.
* Game over when the single life is spent; like ``PLE.act`` a step after game over
  changes nothing and returns 0.

The observation is PLE's ``getGameState()`` in its order: ``player_y``, ``player_vel``,
``player_dist_to_ceil``, ``player_dist_to_floor``, ``next_gate_dist_to_player``,
``next_gate_block_top``, ``next_gate_block_bottom`` (as in PLE, "top" is the gate's centre
``y`` and "bottom" is centre ``y + 9``). The same values are in ``info["state"]``.
Deviation: when the player's ``Rect`` overlaps no terrain column (a rare one-step gap
between terrain batches, where PLE raises ``IndexError``) the distances refer to the
column whose centre is nearest in ``x``. Actions: 0 = up, 1 = noop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from agents.envs.catcher import Rect, check_options, blit, centered_rect, rects_collide

WIDTH = 48
HEIGHT = 48
FPS = 30
DT_MS = 1000.0 / FPS

REWARD_POSITIVE = 1.0
REWARD_TICK = 0.0
REWARD_LOSS = -5.0

SPEED = 0.0004 * WIDTH
CLIMB_ACCEL = SPEED * -0.875
FALL_ACCEL = SPEED * 0.09
MOMENTUM_DECAY = 0.99

PLAYER_X = int(WIDTH * 0.35)
PLAYER_START_Y = HEIGHT / 2
PLAYER_HEIGHT = HEIGHT * 0.05
PLAYER_RECT_SIZE = int(WIDTH * 0.05)

BLOCK_WIDTH = int(WIDTH * 0.1)
BLOCK_HEIGHT = int(HEIGHT * 0.2)

TERRAIN_WIDTH = int(WIDTH * 0.1)
TERRAIN_RECT_HEIGHT = int(HEIGHT * 1.5)
TERRAIN_GAP_HALF = HEIGHT * 0.25
TERRAIN_WALL_HEIGHT = int(HEIGHT * 0.5)
TERRAIN_FLOOR_TOP = int(HEIGHT * 1.05)
TERRAIN_MIN_COLUMNS = 10 + 3

SCREEN_TOP = HEIGHT * 0.125
SCREEN_BOTTOM = HEIGHT * 0.875
NO_GATE_DIST = 999

PLAYER_COLOR = (255, 255, 255)
WALL_COLOR = (120, 240, 80)


@dataclass
class Gate:
    """A gate block: centre ``x`` (float, scrolls) and centre ``y`` (int)."""

    x: float
    y: int


class PixelcopterEnv(gym.Env[np.ndarray, np.int64]):
    """PLE Pixelcopter (48 x 48, 1 life, 30 fps) with PLE's raw 7-d state observation.

    ``rect_rounding`` ("truncate" or "round") picks the pygame float-to-``Rect`` conversion.
    Game state: ``player_y`` (float), ``player_vel`` (momentum, pixels/frame), ``gates``
    (list of :class:`Gate`, oldest first), ``terrain_x`` (float centres) and ``terrain_y``
    (int gap centres) in creation order, and ``lives``.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": FPS}

    def __init__(self, render_mode: str | None = None, rect_rounding: str = "truncate") -> None:
        self._rect_coord = check_options(self, render_mode, rect_rounding)
        self.action_space = spaces.Discrete(2)
        self.observation_space = spaces.Box(
            low=np.array([-HEIGHT, -HEIGHT, -HEIGHT, -HEIGHT, 0, 0, 0], dtype=np.float32),
            high=np.array(
                [2 * HEIGHT, HEIGHT, 2 * HEIGHT, 2 * HEIGHT, 1.5 * WIDTH, HEIGHT, HEIGHT], dtype=np.float32
            ),
            dtype=np.float32,
        )
        self.player_y = PLAYER_START_Y
        self.player_vel = 0.0
        self.gates: list[Gate] = []
        self.terrain_x = np.zeros(0, dtype=np.float64)
        self.terrain_y = np.zeros(0, dtype=np.int64)
        self.lives = 1

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start a new game (PLE ``reset_game``); ``seed`` reseeds ``self.np_random``."""
        super().reset(seed=seed)
        self.player_y = PLAYER_START_Y
        self.player_vel = 0.0
        self.lives = 1
        self.gates = []
        self._add_gate()
        self.terrain_x = np.zeros(0, dtype=np.float64)
        self.terrain_y = np.zeros(0, dtype=np.int64)
        self._add_terrain(0, WIDTH * 4)
        return self._observe()

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Advance one frame of ``DT_MS`` ms under ``action`` (0 up, 1 noop)."""
        if not self.action_space.contains(action):
            raise ValueError(f"invalid action {action!r}")
        if self.lives <= 0:
            obs, info = self._observe()
            return obs, 0.0, True, False, info

        reward = REWARD_TICK
        self.player_vel += (CLIMB_ACCEL if int(action) == 0 else FALL_ACCEL) * DT_MS
        self.player_vel *= MOMENTUM_DECAY
        self.player_y += self.player_vel
        for gate in self.gates:
            gate.x -= SPEED * DT_MS
        self.terrain_x -= SPEED * DT_MS

        player = self._player_rect()
        self.lives -= sum(rects_collide(player, self._gate_rect(gate)) for gate in self.gates)
        for column_y in self.terrain_y[self._terrain_hits()]:
            if self.player_y - PLAYER_HEIGHT <= column_y - TERRAIN_GAP_HALF:
                self.lives -= 1
            if self.player_y >= column_y + TERRAIN_GAP_HALF:
                self.lives -= 1

        for gate in list(self.gates):
            if gate.x <= PLAYER_X and len(self.gates) == 1:
                reward += REWARD_POSITIVE
                self._add_gate()
            if gate.x <= -BLOCK_WIDTH:
                self.gates.remove(gate)

        gone = self.terrain_x <= -TERRAIN_WIDTH
        reward += REWARD_POSITIVE * int(gone.sum())
        self.terrain_x, self.terrain_y = self.terrain_x[~gone], self.terrain_y[~gone]

        if self.player_y < SCREEN_TOP:
            self.lives -= 1
        if self.player_y > SCREEN_BOTTOM:
            self.lives -= 1
        if self.terrain_x.size <= TERRAIN_MIN_COLUMNS:
            self._add_terrain(WIDTH, WIDTH * 5)

        if self.lives <= 0:
            reward += REWARD_LOSS
        obs, info = self._observe()
        return obs, reward, self.lives <= 0, False, info

    def render(self) -> np.ndarray | None:
        """Return an (H, W, 3) uint8 frame as PLE draws it, for ``render_mode="rgb_array"``."""
        if self.render_mode is None:
            return None
        frame = np.zeros((HEIGHT, WIDTH, 3), dtype=np.uint8)
        left, top, w, h = self._player_rect()
        blit(frame, left, top, w, h, PLAYER_COLOR)
        for gate in self.gates:
            blit(frame, *self._gate_rect(gate), WALL_COLOR)
        for x, y in zip(self._rect_coord(self.terrain_x), self.terrain_y):
            left, top, w, h = centered_rect(int(x), int(y), TERRAIN_WIDTH, TERRAIN_RECT_HEIGHT)
            blit(frame, left, top, w, TERRAIN_WALL_HEIGHT, WALL_COLOR)
            floor_top = top + TERRAIN_FLOOR_TOP
            blit(frame, left, floor_top, w, min(TERRAIN_WALL_HEIGHT, top + h - floor_top), WALL_COLOR)
        return frame

    def game_state(self) -> dict[str, float]:
        """PLE's ``getGameState()`` (pixels and pixels/frame)."""
        ahead = [gate for gate in self.gates if 0 < gate.x - PLAYER_X < NO_GATE_DIST]
        next_gate = min(ahead, key=lambda gate: gate.x)
        hits = np.flatnonzero(self._terrain_hits())
        column = hits[0] if hits.size else int(np.argmin(np.abs(self.terrain_x - PLAYER_X)))
        column_y = float(self.terrain_y[column])
        return {
            "player_y": self.player_y,
            "player_vel": self.player_vel,
            "player_dist_to_ceil": self.player_y - (column_y - TERRAIN_GAP_HALF),
            "player_dist_to_floor": (column_y + TERRAIN_GAP_HALF) - self.player_y,
            "next_gate_dist_to_player": next_gate.x - PLAYER_X,
            "next_gate_block_top": next_gate.y,
            "next_gate_block_bottom": next_gate.y + BLOCK_HEIGHT,
        }

    def _add_gate(self) -> None:
        x = int(self.np_random.integers(WIDTH, int(WIDTH * 1.5)))
        y = int(self.np_random.integers(int(HEIGHT * 0.25), int(HEIGHT * 0.75)))
        self.gates.append(Gate(float(x), y))

    def _add_terrain(self, start: int, end: int) -> None:
        centres = np.arange(start + TERRAIN_WIDTH // 2, end + TERRAIN_WIDTH // 2, TERRAIN_WIDTH)
        freq = 4.5 / WIDTH + self.np_random.uniform(-0.01, 0.01)
        phases = self.np_random.uniform(0.0, 0.5, size=centres.size)
        jitter = (HEIGHT * 0.125) * np.sin(freq * centres + phases)
        self.terrain_x = np.concatenate([self.terrain_x, centres.astype(np.float64)])
        self.terrain_y = np.concatenate([self.terrain_y, (HEIGHT / 2.0 + jitter).astype(np.int64)])

    def _player_rect(self) -> Rect:
        player_y = int(self._rect_coord(self.player_y))
        return centered_rect(PLAYER_X, player_y, PLAYER_RECT_SIZE, PLAYER_RECT_SIZE)

    def _gate_rect(self, gate: Gate) -> Rect:
        return centered_rect(int(self._rect_coord(gate.x)), gate.y, BLOCK_WIDTH, BLOCK_HEIGHT)

    def _terrain_hits(self) -> np.ndarray:
        """Boolean mask of the terrain columns whose ``Rect`` overlaps the player's."""
        p_left, p_top, p_w, p_h = self._player_rect()
        left = self._rect_coord(self.terrain_x) - TERRAIN_WIDTH // 2
        top = self.terrain_y - TERRAIN_RECT_HEIGHT // 2
        return (
            (p_left < left + TERRAIN_WIDTH)
            & (p_left + p_w > left)
            & (p_top < top + TERRAIN_RECT_HEIGHT)
            & (p_top + p_h > top)
        )

    def _observe(self) -> tuple[np.ndarray, dict[str, Any]]:
        """The observation and the info dict (raw state and lives) for the current frame."""
        state = self.game_state()
        return np.array(list(state.values()), dtype=np.float32), {"state": state, "lives": self.lives}

