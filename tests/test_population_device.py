"""The population's device step (agents.population.device) against its slow twins: counter draws against a plain
Python hash, the tensor MountainCar against the numpy one, and the whole step against the exact engine driven by the
same draws, in float64 for every activation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.population.counter import ACTION, RESET, CounterDraws, CounterGenerator, below, uniform
from agents.population.device import DevicePopulation, device_refusal
from agents.population.device_envs import TorchMountainCar
from agents.population.engine import Member, Population
from agents.population.envs import BatchedMountainCar
from agents.population.networks import member_q_net
from agents.rl.config import resolve

ACTS = ("elephant", "relu", "maxout", "lwta", "fta")


def _lowbias32(x: int) -> int:
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = x * 0x7FEB352D & 0xFFFFFFFF
    x ^= x >> 15
    x = x * 0x846CA68B & 0xFFFFFFFF
    return x ^ (x >> 16)


def _uniform(seed: int, stream: int, counter: int, index: int) -> float:
    """The counter draw in plain Python integers (arbitrary precision: no overflow to avoid)."""
    h = _lowbias32(seed + 0x9E3779B9)
    for word in (stream, counter & 0xFFFFFFFF, counter >> 32, index):
        h = _lowbias32(h ^ word)
    a, b = _lowbias32(h ^ 0x85EBCA6B) >> 5, _lowbias32(h ^ 0xC2B2AE35) >> 6
    return (a * 67108864 + b) / 9007199254740992.0


def test_counter_draws_are_the_plain_python_hash_and_depend_only_on_their_key():
    rng = np.random.default_rng(0)
    keys = [(int(s), int(st), int(c), int(i)) for s, st, c, i in zip(
        [0, 2**32 - 1, *rng.integers(0, 2**32, 30)], [1, 4, *rng.integers(1, 5, 30)],
        [0, 2**63 - 1, *rng.integers(0, 2**62, 30)], [0, 2**32 - 1, *rng.integers(0, 2**32, 30)])]
    for seed, stream, counter, index in keys:
        assert float(uniform(torch.tensor(seed), stream, counter, index)) == _uniform(seed, stream, counter, index)
    seeds = torch.tensor([5, 9, 11])
    together = uniform(seeds[:, None], ACTION, 17, torch.arange(4)[None])
    assert torch.equal(together[1], uniform(torch.tensor([9])[:, None], ACTION, 17, torch.arange(4)[None])[0])
    u = uniform(torch.arange(8)[:, None], RESET, 3, torch.arange(20_000)[None])
    assert 0 <= float(u.min()) and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.01
    assert int(below(torch.tensor(1 - 2**-53, dtype=torch.float64), 3)) == 2  # never n, even where u * n rounds up


def _momentum(state: np.ndarray) -> np.ndarray:
    return np.where(state[:, 1] >= 0, 2, 0)  # pushes with the velocity: reaches the goal


def test_the_tensor_mountain_car_is_the_numpy_one_on_recorded_actions():
    seeds = [3, 5, 7, 11]
    ref = BatchedMountainCar(4, seeds=seeds, max_episode_steps=150)
    ref.rngs = [CounterGenerator(s) for s in seeds]  # the resets the tensor env draws
    env = TorchMountainCar(torch.tensor(seeds), max_episode_steps=150)
    assert np.array_equal(ref.reset(), env.reset().numpy())
    rng, ends = np.random.default_rng(0), {"terminated": 0, "truncated": 0}
    for t in range(1500):
        actions = rng.integers(0, 3, 4) if t % 300 < 100 else _momentum(ref.state)
        a, b = ref.step(actions), env.step(torch.as_tensor(actions))
        for name in ends:
            assert np.array_equal(getattr(a, name), getattr(b, name).numpy()), (t, name)
            ends[name] += int(getattr(a, name).sum())
        np.testing.assert_allclose(env.state.numpy(), ref.state, rtol=0, atol=1e-12)
        np.testing.assert_allclose(b.obs.numpy(), a.obs, rtol=0, atol=1e-6)
        np.testing.assert_allclose(b.terminal.numpy(), a.terminal, rtol=0, atol=1e-6)
        assert np.array_equal(b.reward.numpy(), a.reward)
    assert ends["terminated"] > 10 and ends["truncated"] > 4


def _config(act: str) -> dict:
    return resolve("dqn", {"env": "MountainCar-v0", "act": act, "n_timesteps": 400, "learning_starts": 100,
                           "target_update_interval": 50, "hidden": [16], "exploration_steps": 200,
                           "max_episode_steps": 120})


MEMBERS = [Member(seed=0, learning_rate=1e-3, buffer_size=1000),
           Member(seed=1, learning_rate=3e-4, buffer_size=200, exploration_final_eps=0.2, exploration_steps=50),
           Member(seed=2, learning_rate=3e-3, buffer_size=32),
           Member(seed=3, learning_rate=1e200, buffer_size=64)]  # diverges: stops, as a run stops


def _exact_twin(config: dict, members: list[Member]) -> Population:
    """The exact engine, one network call per member, drawing what the device step draws."""
    pop = Population(config, members, nets=[member_q_net(config, m.seed).double() for m in members],
                     implementation="loop")
    pop.draws = CounterDraws([m.seed for m in members], pop.n_actions, lambda: pop.num_timesteps)
    pop.env.rngs = [CounterGenerator(m.seed) for m in members]
    pop.obs = pop.env.reset()
    return pop


@pytest.mark.parametrize("act", ACTS)
def test_the_device_step_is_the_exact_engine_in_float64(act):
    config = _config(act)
    exact = _exact_twin(config, MEMBERS)
    device = DevicePopulation(config, MEMBERS, nets=[member_q_net(config, m.seed).double() for m in MEMBERS],
                              readback=64)
    exact.learn(400)
    device.learn(400)
    for m in range(3):
        want, got = exact.member_state(m), device.member_state(m)
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-7, msg=f"{act} member {m} {name}")
    assert device.episodes == exact.episodes and sum(map(len, exact.episodes)) > 0
    assert device.diverged.tolist() == exact.diverged.tolist()
    assert exact.diverged[3] > 100 and not exact.diverged[:3].any()


def test_a_member_equals_a_population_of_one():
    config = _config("elephant")
    pop = DevicePopulation(config, MEMBERS[:3])
    alone = DevicePopulation(config, [MEMBERS[1]])
    pop.learn(300)
    alone.learn(300)
    for name, value in alone.member_state(0).items():
        torch.testing.assert_close(pop.member_state(1)[name], value, rtol=1e-6, atol=1e-7, msg=name)
    assert alone.episodes[0] == pop.episodes[1]


@pytest.mark.parametrize("act", ["elephant", "maxout"])
def test_each_phase_of_the_step_traces_as_one_graph(act):
    """The proxy that a step needs no host synchronisation: Dynamo traces act, env step, store, sample and update
    without a graph break (``fullgraph=True`` would refuse one)."""
    import torch._dynamo as dynamo

    config = _config(act)
    pop = DevicePopulation(config, MEMBERS[:2], compile=True)
    pop._act, pop._update = pop.act_phase, pop.update_phase  # (the warm-up eagerly: no compile in the test)
    pop.learn(config["learning_starts"] + 2)
    for fn, args in ((pop.act_phase, (True,)), (pop.act_phase, (False,)), (pop.update_phase, ())):
        explained = dynamo.explain(fn)(*args)
        assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


def test_tasks_without_a_tensor_version_are_refused():
    config = resolve("dqn", {"env": "Acrobot-v1", "act": "relu"})
    assert "no tensor version of 'Acrobot-v1'" in device_refusal(config)
    with pytest.raises(ValueError, match="no tensor version"):
        DevicePopulation(config, MEMBERS[:1])
