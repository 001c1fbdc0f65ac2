"""Batched envs against the single envs (Gymnasium's classic control, our PLE ports), copy by copy, on recorded
action sequences: the same states (bit for bit), observations, rewards, terminations, truncations and resets."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import pytest

from agents.envs import pixelcopter as copter
from agents.envs.catcher import rects_collide
from agents.population.envs import BATCHED_ENVS, BatchedEnv, make_batched


def _policy(env_id: str, obs: np.ndarray, rng: np.random.Generator, copy: int) -> int:
    """Copy ``copy``'s action on ``obs``: a controller with random actions mixed in, so that episodes end every way
    the task has.

    MountainCar, Acrobot: energy pumping (reaches the goal), 25% random. Catcher: chases the fruit, 60% random
    (catches, misses, game overs). Pixelcopter, even copies: hold the tunnel's centre and dodge the next gate, 5%
    random (gates passed and hit, ceiling hit, long enough episodes for the terrain to refill); odd copies: up with
    probability 0.09, sinking slowly (floor hit)."""
    if env_id == "Catcher-PLE-v0":
        if rng.random() < 0.6:
            return int(rng.integers(3))
        gap = obs[2] - obs[0]  # fruit x - paddle x (normalised)
        return 1 if gap > 0.05 else 0 if gap < -0.05 else 2
    if env_id == "Pixelcopter-PLE-v0":
        if copy % 2:
            return int(rng.random() >= 0.09)
        if rng.random() < 0.05:
            return int(rng.integers(2))
        y, velocity, gate_top = obs[0], obs[1], obs[5]
        target = y - (obs[2] - obs[3]) / 2  # the tunnel's centre
        if obs[4] < 16 and gate_top - 7 < target < gate_top + 8:
            target = gate_top - 8 if target < gate_top + 0.5 else gate_top + 9
        return 0 if velocity > 0 and y + 2 * velocity > target else 1
    if rng.random() < 0.25:
        return int(rng.integers(3))
    velocity = obs[1] if env_id == "MountainCar-v0" else obs[5]  # (Acrobot: the second joint's)
    return 2 if velocity >= 0 else 0


def _same_state(env: gym.Env, batched: BatchedEnv, i: int) -> bool:
    """Whether copy ``i`` of ``batched`` holds ``env``'s state, bit for bit."""
    u = env.unwrapped
    if env.spec.id == "Catcher-PLE-v0":
        return np.array_equal([u.paddle_x, u.paddle_vel, u.fruit_x, u.fruit_y, u.lives], batched.state[i])
    if env.spec.id == "Pixelcopter-PLE-v0":
        gates, columns = batched.n_gates[i], batched.n_terrain[i]
        return (np.array_equal([u.player_y, u.player_vel, u.lives], batched.state[i])
                and np.array_equal([(g.x, g.y) for g in u.gates],
                                   np.stack([batched.gate_x[i, :gates], batched.gate_y[i, :gates]], axis=1))
                and np.array_equal(u.terrain_x, batched.terrain_x[i, :columns])
                and np.array_equal(u.terrain_y, batched.terrain_y[i, :columns]))
    return np.array_equal(np.asarray(u.state, dtype=np.float64), batched.state[i])


def _events(env: gym.Env, reward: float, terminated: bool) -> list[str]:
    """What happened in the step ``env`` just took (before any reset), for the coverage checks."""
    if env.spec.id == "Catcher-PLE-v0":
        return ["caught"] * (reward == 1) + ["missed"] * (reward < 0)
    if env.spec.id != "Pixelcopter-PLE-v0":
        return []
    u, scroll = env.unwrapped, copter.SPEED * copter.DT_MS
    player, hits = u._player_rect(), u._terrain_hits()
    events = ["gate passed"] * sum(copter.PLAYER_X - scroll < g.x <= copter.PLAYER_X for g in u.gates)
    events += ["terrain refilled"] * bool(u.terrain_x[-1] == 238.0)
    if terminated:
        events += ["gate hit"] * any(rects_collide(player, u._gate_rect(g)) for g in u.gates)
        events += ["ceiling hit"] * any(u.player_y - copter.PLAYER_HEIGHT <= y - copter.TERRAIN_GAP_HALF
                                        for y in u.terrain_y[hits])
        events += ["floor hit"] * any(u.player_y >= y + copter.TERRAIN_GAP_HALF for y in u.terrain_y[hits])
    return events


def _run_twins(env_id: str, seeds: Sequence[int], limit: int | None, steps: int, *, by_list: bool) -> Counter:
    """Step ``make_batched(env_id)`` and one ``gym.make(env_id)`` per seed on the same actions (each copy's
    actions from :func:`_policy` on its observations), asserting equality every step; the events seen. The batched
    env is seeded with the list ``seeds`` (``by_list``) or with ``seeds[0]`` (consecutive ``seeds``)."""
    kwargs = {} if limit is None else {"max_episode_steps": limit}
    singles = [gym.make(env_id, **kwargs) for _ in seeds]
    obs = np.stack([env.reset(seed=s)[0] for env, s in zip(singles, seeds)])
    batched = make_batched(env_id, len(seeds), seed=seeds[0], max_episode_steps=limit,
                           seeds=seeds if by_list else None)
    assert np.array_equal(batched.reset(), obs) and obs.dtype == np.float32
    rng = np.random.default_rng(0)
    seen: Counter = Counter()
    for _ in range(steps):
        actions = np.array([_policy(env_id, o, rng, i) for i, o in enumerate(obs)])
        out = batched.step(actions)
        for i, env in enumerate(singles):
            o, r, term, trunc, _ = env.step(int(actions[i]))
            assert np.array_equal(out.terminal[i], o) and out.reward[i] == r
            # (TimeLimit also truncates an episode that terminates on its last step; SB3 counts it terminated)
            assert (bool(out.terminated[i]), bool(out.truncated[i])) == (term, trunc and not term)
            seen.update(_events(env, r, term) + ["terminated"] * term + ["truncated"] * (trunc and not term))
            if term or trunc:
                o, _ = env.reset()
            obs[i] = o
            assert _same_state(env, batched, i)
        assert np.array_equal(out.obs, obs) and out.obs.dtype == np.float32
    return seen


@pytest.mark.parametrize("env_id, limit", [("MountainCar-v0", 150), ("Acrobot-v1", 200)])
def test_batched_env_equals_gymnasium_copies(env_id, limit):
    seen = _run_twins(env_id, range(11, 16), limit, 1500, by_list=False)
    assert seen["terminated"] > 5 and seen["truncated"] > 2  # both ends of an episode were exercised


@pytest.mark.parametrize("env_id, seeds, by_list, limit, steps, need", [
    pytest.param("Catcher-PLE-v0", range(3, 8), False, None, 1200, {"caught": 100, "missed": 30, "terminated": 10},
                 id="catcher"),
    pytest.param("Catcher-PLE-v0", [12, 7, 2024], True, 50, 600, {"caught": 20, "missed": 5, "truncated": 30},
                 id="catcher-limit-50"),
    pytest.param("Pixelcopter-PLE-v0", range(5, 9), False, None, 1500,
                 {"gate passed": 25, "gate hit": 5, "ceiling hit": 40, "floor hit": 30, "terrain refilled": 2,
                  "terminated": 100}, id="pixelcopter"),
    pytest.param("Pixelcopter-PLE-v0", [40, 1, 977, 3], True, 120, 800,
                 {"gate passed": 10, "gate hit": 5, "ceiling hit": 10, "floor hit": 10, "truncated": 3},
                 id="pixelcopter-limit-120"),
])
def test_batched_ple_games_equal_single_copies(env_id, seeds, by_list, limit, steps, need):
    seen = _run_twins(env_id, list(seeds), limit, steps, by_list=by_list)
    assert all(seen[event] >= count for event, count in need.items()), seen


def test_pixelcopter_without_overlapping_column_equals_single():
    """The single env's fallback (no column overlaps the player: the nearest one), on a copy whose columns near the
    player are taken out as in tests/test_ple_envs.py, then stepped on."""
    single = gym.make("Pixelcopter-PLE-v0")
    single.reset(seed=4)
    batched = make_batched("Pixelcopter-PLE-v0", 2, seed=3)
    batched.reset()
    u = single.unwrapped
    keep = np.abs(u.terrain_x - 16) > 6
    u.terrain_x, u.terrain_y = u.terrain_x[keep], u.terrain_y[keep]
    batched.terrain_x[1], batched.n_terrain[1] = batched.far, keep.sum()
    batched.terrain_x[1, :keep.sum()], batched.terrain_y[1, :keep.sum()] = u.terrain_x, u.terrain_y
    assert not u._terrain_hits().any() and _same_state(single, batched, 1)
    assert np.array_equal(batched.observe()[1], u._observe()[0])
    for action in [1, 1, 0, 1, 1]:
        o, r, term, _, _ = single.step(action)
        out = batched.step(np.array([1, action]))
        assert np.array_equal(out.terminal[1], o) and (out.reward[1], out.terminated[1]) == (r, term)
        assert _same_state(single, batched, 1)


def test_default_time_limits_are_the_registered_ones():
    for env_id in BATCHED_ENVS:
        assert make_batched(env_id, 1).max_steps == gym.spec(env_id).max_episode_steps


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="no batched version of 'Pong'; the population engine runs MountainCar-v0, "
                                         "Acrobot-v1, Catcher-PLE-v0, Pixelcopter-PLE-v0"):
        make_batched("Pong", 2)
    env = make_batched("MountainCar-v0", 2)
    env.reset()
    with pytest.raises(ValueError, match=r"actions must be 2 integers in \[0, 3\)"):
        env.step(np.array([0, 3]))
    assert set(BATCHED_ENVS) == {"MountainCar-v0", "Acrobot-v1", "Catcher-PLE-v0", "Pixelcopter-PLE-v0"}
