"""Catcher from the PyGame Learning Environment (PLE), ported to numpy and Gymnasium.

Reproduces ``ple.games.catcher.Catcher(width=64, height=64, init_lives=3)`` driven by
``ple.PLE(game, fps=30, force_fps=True)``: every ``step`` advances the game by one frame
of ``dt = 1000 / 30`` milliseconds.

PLE rules reproduced (units: pixels, milliseconds):

* Positions live in integer pygame ``Rect`` s. A float ``Rect`` centre is converted to
  int by truncation toward zero (``rect_rounding="truncate"``: pygame < 2.3 and pygame-ce,
  the default) or by rounding half away from zero (``"round"``: pygame >= 2.3).
* Paddle: 13 x 3 pixels (``round(0.2 * 64)`` x ``round(0.04 * 64)``), centred at
  ``(32 - 6.5, 64 - 3 - 3)``, i.e. ``(25, 58)`` truncated or ``(26, 58)`` rounded. A key
  press adds ``dx = +-0.021 * 64`` pixels/frame to the velocity, which then decays by 0.9
  every frame (``vel = (vel + dx) * 0.9``); ``dt`` is ignored by the paddle. The new centre
  ``x + vel`` is clamped to ``[0, 64 - 13]`` (velocity reset to 0 at a wall) and
  converted to an int ``Rect`` centre.
* Fruit: 4 x 4 pixels, falls ``0.00095 * 64`` pixels/ms, i.e. its int centre ``y`` becomes
  ``y + 2.0267`` converted to int every frame (truncation toward zero makes it fall 3
  pixels per frame while above the screen). It respawns at ``x`` in ``range(8, 56, 4)``
  and ``y = -k`` for ``k`` in ``range(4, 32, 4)``.
* Frame order (``Catcher.step``): if the fruit centre ``y >= 64`` it is missed (reward -1,
  one life lost, respawn); then, if the paddle and fruit ``Rect`` s overlap, it is caught
  (reward +1, respawn); then paddle and fruit move; if no lives are left the loss reward
  -5 is added to that same frame. The tick reward is 0.
* Game over when the 3 lives are spent; like ``PLE.act`` a step after game over changes
  nothing and returns 0.
* ``render`` draws like PLE, which blits both sprites with their top-left corner at the
  ``Rect`` centre.

The observation is the authors' normalisation of PLE's ``getGameState()``:
``((player_x - 26) / 26, player_vel / 8, (fruit_x - 26) / 26, (fruit_y - 20) / 45)``; the
raw state dict is in ``info["state"]`` and the remaining lives in ``info["lives"]``.
Actions: 0 = left, 1 = right, 2 = noop (PLE's ``getActionSet()`` order).

The pygame ``Rect`` helpers below are shared with the Pixelcopter port.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

Rect = tuple[int, int, int, int]
CoordFn = Callable[[Any], np.ndarray]


def truncate_coord(value: float | np.ndarray) -> np.ndarray:
    """Float to ``Rect`` int as pygame < 2.3 and pygame-ce do: truncation toward zero."""
    return np.trunc(value).astype(np.int64)


def round_coord(value: float | np.ndarray) -> np.ndarray:
    """Float to ``Rect`` int as pygame >= 2.3 does: rounding half away from zero."""
    whole = np.trunc(value)
    return (whole + np.sign(value) * (np.abs(value - whole) >= 0.5)).astype(np.int64)


RECT_ROUNDING: dict[str, CoordFn] = {"truncate": truncate_coord, "round": round_coord}


def check_options(env: gym.Env, render_mode: str | None, rect_rounding: str) -> CoordFn:
    """Validate a PLE port's constructor options (clear errors), set ``env.render_mode``; the ``Rect`` coord fn."""
    if render_mode is not None and render_mode not in env.metadata["render_modes"]:
        raise ValueError(f"unsupported render_mode {render_mode!r}; choose from {env.metadata['render_modes']}")
    if rect_rounding not in RECT_ROUNDING:
        raise ValueError(f"unknown rect_rounding {rect_rounding!r}; choose from {sorted(RECT_ROUNDING)}")
    env.render_mode = render_mode
    return RECT_ROUNDING[rect_rounding]


def centered_rect(cx: int, cy: int, w: int, h: int) -> Rect:
    """Return the pygame ``Rect`` ``(left, top, w, h)`` whose integer centre is ``(cx, cy)``."""
    return cx - w // 2, cy - h // 2, w, h


def rects_collide(a: Rect, b: Rect) -> bool:
    """pygame ``Rect.colliderect``: strict overlap of two integer rectangles."""
    return a[0] < b[0] + b[2] and a[0] + a[2] > b[0] and a[1] < b[1] + b[3] and a[1] + a[3] > b[1]


def blit(frame: np.ndarray, left: int, top: int, w: int, h: int, color: tuple[int, int, int]) -> None:
    """Fill the on-screen part of the ``w`` x ``h`` rectangle at ``(left, top)`` with ``color``."""
    frame[max(top, 0) : max(top + h, 0), max(left, 0) : max(left + w, 0)] = color


WIDTH = 64
HEIGHT = 64
FPS = 30
DT_MS = 1000.0 / FPS
INIT_LIVES = 3

REWARD_POSITIVE = 1.0
REWARD_NEGATIVE = -1.0
REWARD_TICK = 0.0
REWARD_LOSS = -5.0

FRUIT_SIZE = int(np.round(HEIGHT * 0.06))
FRUIT_FALL_SPEED = 0.00095 * HEIGHT
PLAYER_SPEED = 0.021 * WIDTH
PADDLE_WIDTH = int(np.round(WIDTH * 0.2))
PADDLE_HEIGHT = int(np.round(HEIGHT * 0.04))
PADDLE_START_X = WIDTH / 2 - PADDLE_WIDTH / 2
PADDLE_Y = HEIGHT - PADDLE_HEIGHT - 3
PADDLE_MAX_X = WIDTH - PADDLE_WIDTH
# |vel| stays below the fixed point of vel -> (vel + PLAYER_SPEED) * 0.9.
MAX_PADDLE_SPEED = PLAYER_SPEED * 0.9 / (1.0 - 0.9)

FRUIT_XS = np.arange(FRUIT_SIZE * 2, WIDTH - FRUIT_SIZE * 2, FRUIT_SIZE)
FRUIT_YS = -np.arange(FRUIT_SIZE, HEIGHT // 2, FRUIT_SIZE)
# Highest fruit centre: the last unmissed one (HEIGHT - 1) after one more frame's 2-pixel fall.
FRUIT_MAX_Y = HEIGHT - 1 + int(FRUIT_FALL_SPEED * DT_MS)

ACTION_DX = (-PLAYER_SPEED, PLAYER_SPEED, 0.0)

PADDLE_COLOR = (255, 255, 255)
FRUIT_COLOR = (255, 120, 120)


def normalize_state(player_x: float, player_vel: float, fruit_x: float, fruit_y: float) -> np.ndarray:
    """The authors' normalisation of Catcher's PLE state, as a float32 vector."""
    return np.array(
        [(player_x - 26.0) / 26.0, player_vel / 8.0, (fruit_x - 26.0) / 26.0, (fruit_y - 20.0) / 45.0],
        dtype=np.float32,
    )


class CatcherEnv(gym.Env[np.ndarray, np.int64]):
    """PLE Catcher (64 x 64, 3 lives, 30 fps) with the normalised 4-d state observation.

    ``rect_rounding`` ("truncate" or "round") picks the pygame float-to-``Rect`` conversion.
    Attributes ``paddle_x`` (int centre x), ``paddle_vel`` (pixels/frame), ``fruit_x``,
    ``fruit_y`` (int centre) and ``lives`` hold the game state.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": FPS}

    def __init__(self, render_mode: str | None = None, rect_rounding: str = "truncate") -> None:
        self._rect_coord = check_options(self, render_mode, rect_rounding)
        self.action_space = spaces.Discrete(3)
        self.observation_space = spaces.Box(
            low=normalize_state(0, -MAX_PADDLE_SPEED, FRUIT_XS.min(), FRUIT_YS.min()),
            high=normalize_state(PADDLE_MAX_X, MAX_PADDLE_SPEED, FRUIT_XS.max(), FRUIT_MAX_Y),
            dtype=np.float32,
        )
        self.paddle_x = 0
        self.paddle_vel = 0.0
        self.fruit_x = 0
        self.fruit_y = 0
        self.lives = INIT_LIVES

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start a new game (PLE ``reset_game``); ``seed`` reseeds ``self.np_random``."""
        super().reset(seed=seed)
        self.paddle_x = int(self._rect_coord(PADDLE_START_X))
        self.paddle_vel = 0.0
        self.lives = INIT_LIVES
        self._respawn_fruit()
        return self._observe()

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Advance one frame of ``DT_MS`` ms under ``action`` (0 left, 1 right, 2 noop)."""
        if not self.action_space.contains(action):
            raise ValueError(f"invalid action {action!r}")
        if self.lives == 0:
            obs, info = self._observe()
            return obs, 0.0, True, False, info

        reward = REWARD_TICK
        if self.fruit_y >= HEIGHT:
            reward += REWARD_NEGATIVE
            self.lives -= 1
            self._respawn_fruit()
        if rects_collide(self._paddle_rect(), self._fruit_rect()):
            reward += REWARD_POSITIVE
            self._respawn_fruit()

        self._move_paddle(ACTION_DX[int(action)])
        self.fruit_y = int(self._rect_coord(self.fruit_y + FRUIT_FALL_SPEED * DT_MS))

        if self.lives == 0:
            reward += REWARD_LOSS
        obs, info = self._observe()
        return obs, reward, self.lives == 0, False, info

    def render(self) -> np.ndarray | None:
        """Return an (H, W, 3) uint8 frame as PLE draws it, for ``render_mode="rgb_array"``."""
        if self.render_mode is None:
            return None
        frame = np.zeros((HEIGHT, WIDTH, 3), dtype=np.uint8)
        blit(frame, self.paddle_x, PADDLE_Y, PADDLE_WIDTH, PADDLE_HEIGHT, PADDLE_COLOR)
        blit(frame, self.fruit_x, self.fruit_y, FRUIT_SIZE, FRUIT_SIZE, FRUIT_COLOR)
        return frame

    def game_state(self) -> dict[str, float]:
        """PLE's ``getGameState()``: paddle centre x, paddle velocity, fruit centre x and y."""
        return {
            "player_x": self.paddle_x,
            "player_vel": self.paddle_vel,
            "fruit_x": self.fruit_x,
            "fruit_y": self.fruit_y,
        }

    def _respawn_fruit(self) -> None:
        self.fruit_x = int(self.np_random.choice(FRUIT_XS))
        self.fruit_y = int(self.np_random.choice(FRUIT_YS))

    def _move_paddle(self, dx: float) -> None:
        self.paddle_vel += dx
        self.paddle_vel *= 0.9
        new_x = self.paddle_x + self.paddle_vel
        if new_x <= 0:
            self.paddle_vel = 0.0
            new_x = 0
        if new_x + PADDLE_WIDTH >= WIDTH:
            self.paddle_vel = 0.0
            new_x = PADDLE_MAX_X
        self.paddle_x = int(self._rect_coord(new_x))

    def _paddle_rect(self) -> Rect:
        return centered_rect(self.paddle_x, PADDLE_Y, PADDLE_WIDTH, PADDLE_HEIGHT)

    def _fruit_rect(self) -> Rect:
        return centered_rect(self.fruit_x, self.fruit_y, FRUIT_SIZE, FRUIT_SIZE)

    def _observe(self) -> tuple[np.ndarray, dict[str, Any]]:
        """The normalised observation and the info dict (raw state and lives)."""
        state = self.game_state()
        return normalize_state(**state), {"state": state, "lives": self.lives}
