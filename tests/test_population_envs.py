"""Batched classic-control envs against Gymnasium's, copy by copy, on recorded action sequences: the same states
(bit for bit), observations, rewards, terminations, truncations and resets."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from agents.population.envs import BATCHED_ENVS, make_batched


def _policy(env_id: str, obs: np.ndarray, rng: np.random.Generator) -> int:
    """Mostly an energy-pumping controller (episodes end by reaching the goal), sometimes a random action."""
    if rng.random() < 0.25:
        return int(rng.integers(3))
    velocity = obs[1] if env_id == "MountainCar-v0" else obs[5]  # (Acrobot: the second joint's)
    return 2 if velocity >= 0 else 0


@pytest.mark.parametrize("env_id, limit", [("MountainCar-v0", 150), ("Acrobot-v1", 200)])
def test_batched_env_equals_gymnasium_copies(env_id, limit):
    n, seed, steps = 5, 11, 1500
    singles = [gym.make(env_id, max_episode_steps=limit) for _ in range(n)]
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(singles)])
    batched = make_batched(env_id, n, seed=seed, max_episode_steps=limit)
    assert np.array_equal(batched.reset(), obs)
    rng = np.random.default_rng(0)
    counts = {"terminated": 0, "truncated": 0}
    for _ in range(steps):
        actions = np.array([_policy(env_id, o, rng) for o in obs])
        out = batched.step(actions)
        for i, env in enumerate(singles):
            o, r, term, trunc, _ = env.step(int(actions[i]))
            assert np.array_equal(out.terminal[i], o) and out.reward[i] == r
            assert (bool(out.terminated[i]), bool(out.truncated[i])) == (term, trunc)
            counts["terminated"] += term
            counts["truncated"] += trunc
            if term or trunc:
                o, _ = env.reset()
            obs[i] = o
            assert np.array_equal(np.asarray(env.unwrapped.state, dtype=np.float64), batched.state[i])
        assert np.array_equal(out.obs, obs)
    assert counts["terminated"] > 5 and counts["truncated"] > 2  # both ends of an episode were exercised


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="no batched version of 'Pong'; the population engine runs"):
        make_batched("Pong", 2)
    env = make_batched("MountainCar-v0", 2)
    env.reset()
    with pytest.raises(ValueError, match=r"actions must be 2 integers in \[0, 3\)"):
        env.step(np.array([0, 3]))
    assert set(BATCHED_ENVS) == {"MountainCar-v0", "Acrobot-v1"}
