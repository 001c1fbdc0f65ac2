"""Tests for the numpy ports of PLE's Catcher and Pixelcopter (agents.envs)."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import agents.envs
from agents.envs import CatcherEnv, PixelcopterEnv, register_envs
from agents.envs import catcher as C
from agents.envs import pixelcopter as P
from agents.envs.pixelcopter import Gate

ENV_IDS = ("Catcher-PLE-v0", "Pixelcopter-PLE-v0")


@pytest.fixture
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def step_until_reward(env: gym.Env, action: int, max_steps: int = 100) -> tuple[float, bool, int]:
    """Step with a fixed action until a non-zero reward; return (reward, terminated, steps)."""
    for n in range(1, max_steps + 1):
        _, reward, terminated, _, _ = env.step(action)
        if reward != 0.0:
            return reward, terminated, n
    raise AssertionError("no reward within max_steps")


# ---------------------------------------------------------------- registration / API


def test_registration_is_idempotent(no_warnings: None) -> None:
    importlib.reload(agents.envs)
    register_envs()
    assert gym.spec("Catcher-PLE-v0").max_episode_steps == 2000
    assert gym.spec("Pixelcopter-PLE-v0").max_episode_steps == 500


@pytest.mark.parametrize("env_id", ENV_IDS)
@pytest.mark.parametrize("render_mode", [None, "rgb_array"])
def test_env_checker(env_id: str, render_mode: str | None, no_warnings: None) -> None:
    check_env(gym.make(env_id, render_mode=render_mode).unwrapped)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_seeded_trajectories_are_identical(env_id: str) -> None:
    def rollout(seed: int) -> list[tuple]:
        env = gym.make(env_id)
        actions = np.random.default_rng(7).integers(env.action_space.n, size=400)
        obs, info = env.reset(seed=seed)
        trace = [(obs.tobytes(), info)]
        for action in actions:
            obs, reward, terminated, truncated, info = env.step(int(action))
            trace.append((obs.tobytes(), reward, terminated, truncated, info))
            if terminated or truncated:
                obs, info = env.reset()
                trace.append((obs.tobytes(), info))
        return trace

    assert rollout(3) == rollout(3)
    assert rollout(3) != rollout(4)


# ---------------------------------------------------------------- Catcher


@pytest.fixture
def catcher() -> CatcherEnv:
    env = CatcherEnv(render_mode="rgb_array")
    env.reset(seed=0)
    return env


def test_catcher_initial_state_and_normalisation(catcher: CatcherEnv) -> None:
    obs, info = catcher.reset(seed=5)
    state = info["state"]
    assert list(state) == ["player_x", "player_vel", "fruit_x", "fruit_y"]
    assert state["player_x"] == 25 and state["player_vel"] == 0.0  # int(32 - 6.5)
    assert state["fruit_x"] in range(8, 56, 4) and -state["fruit_y"] in range(4, 32, 4)
    assert info["lives"] == 3
    expected = [
        (state["player_x"] - 26) / 26,
        state["player_vel"] / 8,
        (state["fruit_x"] - 26) / 26,
        (state["fruit_y"] - 20) / 45,
    ]
    assert obs.dtype == np.float32 and obs.shape == (4,)
    np.testing.assert_allclose(obs, expected, rtol=1e-6)
    assert catcher.action_space == gym.spaces.Discrete(3)


def test_catcher_paddle_and_fruit_motion(catcher: CatcherEnv) -> None:
    catcher.fruit_y = -28
    _, _, _, _, info = catcher.step(1)  # right
    assert info["state"]["player_vel"] == pytest.approx(C.PLAYER_SPEED * 0.9)
    assert info["state"]["player_x"] == 26  # int(25 + 1.2096)
    assert info["state"]["fruit_y"] == -25  # int(-28 + 2.0267) truncates toward zero
    catcher.step(0)  # left cancels the push: vel = (1.2096 - 1.344) * 0.9 < 0
    assert catcher.paddle_vel == pytest.approx((C.PLAYER_SPEED * 0.9 - C.PLAYER_SPEED) * 0.9)
    assert catcher.paddle_x == 25
    catcher.fruit_y = 10
    catcher.step(2)
    assert catcher.fruit_y == 12


def test_catcher_pygame_round_mode() -> None:
    env = CatcherEnv(rect_rounding="round")
    _, info = env.reset(seed=0)
    assert info["state"]["player_x"] == 26  # round(25.5) away from zero
    env.fruit_y = -28
    env.step(2)
    assert env.fruit_y == -26


def test_catcher_catch_gives_plus_one_and_respawns(catcher: CatcherEnv) -> None:
    catcher.fruit_x, catcher.fruit_y = catcher.paddle_x, 40
    reward, terminated, steps = step_until_reward(catcher, 2)
    assert reward == 1.0 and not terminated and steps == 9  # the frame starting at centre y 56
    assert catcher.lives == 3
    assert catcher.fruit_y < 0 and catcher.fruit_x in C.FRUIT_XS


def test_catcher_miss_costs_a_life(catcher: CatcherEnv) -> None:
    catcher.fruit_x, catcher.fruit_y = 52, 40  # paddle spans x 19..31
    reward, terminated, steps = step_until_reward(catcher, 2)
    assert reward == -1.0 and not terminated and steps == 13  # the frame starting at centre y 64
    assert catcher.lives == 2
    assert catcher.fruit_y < 0


def test_catcher_game_over_after_three_misses(catcher: CatcherEnv) -> None:
    rewards, terminations = [], []
    for _ in range(3):
        catcher.paddle_x, catcher.fruit_x, catcher.fruit_y = 0, 52, 60
        reward, terminated, _ = step_until_reward(catcher, 0)
        rewards.append(reward)
        terminations.append(terminated)
    assert rewards == [-1.0, -1.0, -6.0]  # the last miss also carries the loss reward -5
    assert terminations == [False, False, True]
    obs, reward, terminated, truncated, info = catcher.step(1)
    assert (reward, terminated, truncated, info["lives"]) == (0.0, True, False, 0)


@pytest.mark.parametrize(("action", "wall"), [(0, 0), (1, C.WIDTH - C.PADDLE_WIDTH)])
def test_catcher_paddle_stays_on_screen(catcher: CatcherEnv, action: int, wall: int) -> None:
    for _ in range(80):
        catcher.step(action)
        assert 0 <= catcher.paddle_x <= C.WIDTH - C.PADDLE_WIDTH
        catcher.lives = 3
    assert catcher.paddle_x == wall and catcher.paddle_vel == 0.0
    catcher.fruit_y = -20
    frame = catcher.render()
    assert frame.shape == (64, 64, 3) and frame.dtype == np.uint8
    rows, cols = np.nonzero((frame == C.PADDLE_COLOR).all(axis=2))
    assert set(rows) == {58, 59, 60}  # PLE blits the sprite's top-left at the Rect centre
    assert cols.min() == wall and cols.max() == wall + C.PADDLE_WIDTH - 1


# ---------------------------------------------------------------- Pixelcopter


@pytest.fixture
def copter() -> PixelcopterEnv:
    """A game with a flat tunnel (ceiling y = 12, floor y = 36) and a far-away gate."""
    env = PixelcopterEnv(render_mode="rgb_array")
    env.reset(seed=0)
    env.terrain_y[:] = 24
    env.gates = [Gate(70.0, 40)]
    return env


def test_copter_initial_state(copter: PixelcopterEnv) -> None:
    obs, info = copter.reset(seed=11)
    state = info["state"]
    assert list(state) == [
        "player_y",
        "player_vel",
        "player_dist_to_ceil",
        "player_dist_to_floor",
        "next_gate_dist_to_player",
        "next_gate_block_top",
        "next_gate_block_bottom",
    ]
    assert obs.dtype == np.float32 and obs.shape == (7,)
    np.testing.assert_array_equal(obs, np.array(list(state.values()), dtype=np.float32))
    assert state["player_y"] == 24.0 and state["player_vel"] == 0.0
    assert state["player_dist_to_ceil"] + state["player_dist_to_floor"] == 24.0
    assert 48 - 16 <= state["next_gate_dist_to_player"] < 72 - 16
    assert 12 <= state["next_gate_block_top"] < 36
    assert state["next_gate_block_bottom"] == state["next_gate_block_top"] + 9
    assert copter.terrain_x.size == 48 and set(copter.terrain_y) <= set(range(18, 31))
    assert copter.action_space == gym.spaces.Discrete(2)


def test_copter_up_action_changes_velocity(copter: PixelcopterEnv) -> None:
    _, reward, terminated, _, info = copter.step(0)
    climb = P.SPEED * -0.875 * P.DT_MS * 0.99
    assert info["state"]["player_vel"] == pytest.approx(climb)
    assert info["state"]["player_y"] == pytest.approx(24.0 + climb)
    assert (reward, terminated) == (0.0, False)
    copter.player_vel = 0.0
    copter.step(1)
    assert copter.player_vel == pytest.approx(P.SPEED * 0.09 * P.DT_MS * 0.99)


@pytest.mark.parametrize(
    ("player_y", "crashes"),
    [(16.0, False), (14.0, True), (35.9, False), (35.95, True)],  # ceiling: y - 2.4 <= 12; floor: y >= 36
)
def test_copter_tunnel_crash(copter: PixelcopterEnv, player_y: float, crashes: bool) -> None:
    copter.player_y = player_y
    _, reward, terminated, _, info = copter.step(1)
    assert terminated is crashes
    assert reward == (-5.0 if crashes else 0.0)
    assert info["lives"] <= 0 if crashes else info["lives"] == 1


def test_copter_gate_crash(copter: PixelcopterEnv) -> None:
    copter.gates = [Gate(17.0, 24)]
    _, reward, terminated, _, _ = copter.step(1)
    assert (reward, terminated) == (-5.0, True)


def test_copter_passing_a_gate_gives_plus_one(copter: PixelcopterEnv) -> None:
    copter.gates = [Gate(16.5, 40)]  # below the player, reaches x <= 16 this frame
    _, reward, terminated, _, info = copter.step(1)
    assert (reward, terminated) == (1.0, False)
    assert len(copter.gates) == 2 and 48 - 1 <= copter.gates[1].x < 72
    assert info["state"]["next_gate_dist_to_player"] == copter.gates[1].x - 16
    _, reward, _, _, _ = copter.step(1)
    assert reward == 0.0  # only rewarded once per gate


def test_copter_terrain_columns_scroll_out_with_plus_one(copter: PixelcopterEnv) -> None:
    copter.terrain_x[0] = -3.5
    _, reward, terminated, _, _ = copter.step(1)
    assert (reward, terminated) == (1.0, False)
    assert copter.terrain_x.size == 47


def test_copter_terrain_refills(copter: PixelcopterEnv) -> None:
    copter.terrain_x, copter.terrain_y = copter.terrain_x[:14], copter.terrain_y[:14]
    copter.terrain_x[0] = -3.5
    copter.step(1)
    assert copter.terrain_x.size == 13 + 48
    np.testing.assert_array_equal(copter.terrain_x[13:], np.arange(50, 240, 4))


def test_copter_state_without_overlapping_column(copter: PixelcopterEnv) -> None:
    keep = np.abs(copter.terrain_x - 16) > 6
    copter.terrain_x, copter.terrain_y = copter.terrain_x[keep], copter.terrain_y[keep]
    copter.terrain_y[np.argmin(np.abs(copter.terrain_x - 16))] = 20
    state = copter.game_state()
    assert state["player_dist_to_ceil"] == 24.0 - 8.0


def test_copter_render(copter: PixelcopterEnv) -> None:
    frame = copter.render()
    assert frame.shape == (48, 48, 3) and frame.dtype == np.uint8
    assert (frame[23:25, 15:17] == P.PLAYER_COLOR).all()
    assert (frame[:12, :] == P.WALL_COLOR).all() and (frame[38:, :] == P.WALL_COLOR).all()
    assert (frame[12:23, :] == 0).all()


# ---------------------------------------------------------------- random policy vs PLE


@pytest.mark.parametrize(
    ("env_id", "episodes", "ple_return", "return_tol", "ple_length", "length_tol"),
    [
        ("Catcher-PLE-v0", 200, -6.9, 0.4, 150.0, 15.0),
        ("Pixelcopter-PLE-v0", 1000, -4.8, 0.15, 7.0, 1.0),
    ],
)
def test_random_policy_matches_ple(
    env_id: str, episodes: int, ple_return: float, return_tol: float, ple_length: float, length_tol: float
) -> None:
    env = gym.make(env_id)
    rng = np.random.default_rng(0)
    returns, lengths = [], []
    for episode in range(episodes):
        env.reset(seed=episode)
        total, steps, done = 0.0, 0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            total, steps, done = total + reward, steps + 1, terminated or truncated
        returns.append(total)
        lengths.append(steps)
    assert np.mean(returns) == pytest.approx(ple_return, abs=return_tol)
    assert np.mean(lengths) == pytest.approx(ple_length, abs=length_tol)


@pytest.mark.parametrize("env_cls", [CatcherEnv, PixelcopterEnv])
def test_bad_constructor_options_are_named(env_cls: type) -> None:
    with pytest.raises(ValueError, match="unsupported render_mode 'human'"):
        env_cls(render_mode="human")
    with pytest.raises(ValueError, match="unknown rect_rounding 'floor'"):
        env_cls(rect_rounding="floor")
