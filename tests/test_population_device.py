"""The population's device step (agents.population.device) against its slow twins: counter draws against a plain
Python hash, the tensor MountainCar against the numpy one, and the whole step against the exact engine driven by the
same draws, in float64 for every activation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.population.counter import ACTION, RESET, CounterDraws, CounterGenerator, below, uniform
from agents.population.device import DevicePopulation, device_refusal
from agents.population.device_envs import TORCH_ENVS
from agents.population.engine import Member, Population
from agents.population.envs import BATCHED_ENVS
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
    for word, salt in ((stream, 0x85EBCA6B), (counter & 0xFFFFFFFF, 0xC2B2AE35), (counter >> 32, 0x27D4EB2F),
                       (index, 0x165667B1)):
        h = _lowbias32(h ^ _lowbias32(word + salt))
    a, b = _lowbias32(h ^ 0x68E31DA4) >> 5, _lowbias32(h ^ 0xB5297A4D) >> 6
    return (a * 67108864 + b) / 9007199254740992.0


def test_counter_draws_are_the_plain_python_hash_and_depend_only_on_their_key():
    rng = np.random.default_rng(0)
    keys = [(int(s), int(st), int(c), int(i)) for s, st, c, i in zip(
        [0, 2**32 - 1, *rng.integers(0, 2**32, 30)], [1, 4, *rng.integers(1, 5, 30)],
        [0, 2**63 - 1, *rng.integers(0, 2**62, 30)], [0, 2**32 - 1, *rng.integers(0, 2**32, 30)])]
    for seed, stream, counter, index in keys:
        want = _uniform(seed, stream, counter, index)
        assert float(uniform(torch.tensor(seed), stream, counter, index)) == want  # Python ints as keys
        assert float(uniform(torch.tensor(seed), stream, torch.tensor(counter), torch.tensor(index))) == want
    # two seeds' streams are not one another's reordered (a key folded in by plain XOR would make them so)
    a, b = (set(uniform(torch.tensor(s), ACTION, torch.arange(2**16)).tolist()) for s in (2160, 2655))
    assert len(a & b) < 5
    seeds = torch.tensor([5, 9, 11])
    together = uniform(seeds[:, None], ACTION, 17, torch.arange(4)[None])
    assert torch.equal(together[1], uniform(torch.tensor([9])[:, None], ACTION, 17, torch.arange(4)[None])[0])
    u = uniform(torch.arange(8)[:, None], RESET, 3, torch.arange(20_000)[None])
    assert 0 <= float(u.min()) and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.01
    assert int(below(torch.tensor(1 - 2**-53, dtype=torch.float64), 3)) == 2  # never n, even where u * n rounds up


def _pushing(env: str, ref) -> np.ndarray:
    """A policy that reaches the goal: push with MountainCar's velocity, or with Acrobot's second joint's; move
    Catcher's paddle towards the fruit; climb when Pixelcopter is nearer the gap's floor than its ceiling."""
    state = ref.state
    if env == "Catcher-PLE-v0":
        return np.where(state[:, 2] < state[:, 0], 0, 1)
    if env == "Pixelcopter-PLE-v0":
        obs = ref.observe()
        return np.where(obs[:, 2] > obs[:, 3], 0, 1)
    return np.where(state[:, 1 if env == "MountainCar-v0" else 3] >= 0, 2, 0)


@pytest.mark.parametrize("env, atol, limit, random", [("MountainCar-v0", 1e-12, 150, 100), ("Acrobot-v1", 1e-6, 100, 100),
                                                      ("Catcher-PLE-v0", 0.0, 400, 300),
                                                      ("Pixelcopter-PLE-v0", 0.0, 40, 100)])
def test_the_tensor_envs_are_the_numpy_ones_on_recorded_actions(env, atol, limit, random):
    """Terminations, truncations and rewards exactly; states to ``atol`` (the device's ``cos`` and squares may
    differ from numpy's in the last bit, which Acrobot's chaotic double pendulum amplifies within an episode: over
    100-step episodes to 1e-6, and 1e-9 over each episode's first 20 steps)."""
    seeds = [3, 5, 7, 11]
    ref = BATCHED_ENVS[env](4, seeds=seeds, max_episode_steps=limit)
    ref.rngs = [CounterGenerator(s) for s in seeds]  # the resets the tensor env draws
    tensor_env = TORCH_ENVS[env](torch.tensor(seeds), max_episode_steps=limit)
    np.testing.assert_allclose(tensor_env.reset().numpy(), ref.reset(), rtol=0, atol=1e-6)
    rng, ends, rewarded = np.random.default_rng(0), {"terminated": 0, "truncated": 0}, 0
    for t in range(3000):
        actions = rng.integers(0, ref.n_actions, 4) if t % 600 < random else _pushing(env, ref)
        a, b = ref.step(actions), tensor_env.step(torch.as_tensor(actions))
        for name in ends:
            assert np.array_equal(getattr(a, name), getattr(b, name).numpy()), (t, name)
            ends[name] += int(getattr(a, name).sum())
        rewarded += int((a.reward > 0).sum())
        young = ref.elapsed < 20
        np.testing.assert_allclose(tensor_env.state.numpy()[young], ref.state[young], rtol=0, atol=1e-9)
        np.testing.assert_allclose(tensor_env.state.numpy(), ref.state, rtol=0, atol=atol)
        np.testing.assert_allclose(b.obs.numpy(), a.obs, rtol=0, atol=max(atol, 1e-6))
        np.testing.assert_allclose(b.terminal.numpy(), a.terminal, rtol=0, atol=max(atol, 1e-6))
        assert np.array_equal(b.reward.numpy(), a.reward)
    assert ends["terminated"] > 10 and ends["truncated"] > 0 and (env not in ("Catcher-PLE-v0", "Pixelcopter-PLE-v0")
                                                                  or rewarded > 100)


def _config(act: str, env: str = "MountainCar-v0") -> dict:
    return resolve("dqn", {"env": env, "act": act, "n_timesteps": 400, "learning_starts": 100,
                           "target_update_interval": 50, "hidden": [16], "exploration_steps": 200,
                           "max_episode_steps": 120})


MEMBERS = [Member(seed=0, learning_rate=1e-3, buffer_size=1000),
           Member(seed=1, learning_rate=3e-4, buffer_size=200, exploration_final_eps=0.2, exploration_steps=50),
           Member(seed=2, learning_rate=1e-3, buffer_size=32),  # (a larger rate amplifies rounding chaotically)
           Member(seed=3, learning_rate=1e200, buffer_size=64)]  # diverges: stops, as a run stops


def _exact_twin(config: dict, members: list[Member]) -> Population:
    """The exact engine, one network call per member, drawing what the device step draws."""
    pop = Population(config, members, nets=[member_q_net(config, m.seed).double() for m in members],
                     implementation="loop")
    pop.draws = CounterDraws([m.seed for m in members], pop.n_actions, lambda: pop.num_timesteps)
    pop.env.rngs = [CounterGenerator(m.seed) for m in members]
    pop.obs = pop.env.reset()
    return pop


@pytest.mark.parametrize("env, act", [*(("MountainCar-v0", a) for a in ACTS), *(
    (e, a) for e in ("Acrobot-v1", "Catcher-PLE-v0", "Pixelcopter-PLE-v0") for a in ("elephant", "relu"))])
def test_the_device_step_is_the_exact_engine_in_float64(env, act):
    config = _config(act, env)
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


@pytest.mark.parametrize("act, env", [("elephant", "MountainCar-v0"), ("maxout", "MountainCar-v0"),
                                      *(("relu", e) for e in ("Acrobot-v1", "Catcher-PLE-v0", "Pixelcopter-PLE-v0"))])
def test_each_phase_of_the_step_traces_as_one_graph(act, env):
    """The proxy that a step needs no host synchronisation: Dynamo traces act, env step, store, sample and update
    without a graph break (``fullgraph=True`` would refuse one)."""
    import torch._dynamo as dynamo

    config = _config(act, env)
    pop = DevicePopulation(config, MEMBERS[:2], compile=True)
    pop._act, pop._update = pop.act_phase, pop.update_phase  # (the warm-up eagerly: no compile in the test)
    pop.learn(config["learning_starts"] + 2)
    for fn, args in ((pop.act_phase, (True,)), (pop.act_phase, (False,)), (pop.update_phase, ())):
        explained = dynamo.explain(fn)(*args)
        assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


def test_tasks_without_a_tensor_version_are_refused(monkeypatch):
    from agents.population import device

    monkeypatch.setattr(device, "TORCH_ENVS", {k: v for k, v in TORCH_ENVS.items() if k != "Pixelcopter-PLE-v0"})
    config = resolve("dqn", {"env": "Pixelcopter-PLE-v0", "act": "relu"})
    assert "no tensor version of 'Pixelcopter-PLE-v0'" in device_refusal(config)
    with pytest.raises(ValueError, match="no tensor version"):
        DevicePopulation(config, MEMBERS[:1])


_RUN = """
import sys
from agents.population.engine import Member
from agents.population.run import run_population
members = [Member(0, 1e-3, 1000), Member(1, 3e-4, 64), Member(2, 1e200, 64)]
values = {{"env": "MountainCar-v0", "act": "elephant", "n_timesteps": 600, "progress": False,
          "set": ["learning_starts=200", "hidden=[32]", "max_episode_steps=120", "probe=[gradcov]", "probe_every=300"]}}
run_population(values, members, {out!r}, implementation="device", resume={resume}, checkpoint_every=200)
"""


def test_a_killed_device_population_resumes_to_the_uninterrupted_result(tmp_path):
    """SIGKILL right after the second checkpoint, then resume: every member's log (episodes, losses, probes, its end,
    a diverged member's too) and final weights equal an uninterrupted run's."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from runlog import read_run
    from runlog.failpoints import ENV as KILL_AT

    root = Path(__file__).resolve().parents[1]

    def run(out: Path, resume: bool = False, kill: str | None = None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in __import__("os").environ.items() if k != KILL_AT} | ({KILL_AT: kill} if kill else {})
        return subprocess.run([sys.executable, "-c", _RUN.format(out=str(out), resume=resume)], cwd=root, env=env,
                              capture_output=True, text=True, timeout=300)

    assert run(tmp_path / "ref").returncode == 0
    assert run(tmp_path / "run", kill="checkpoint.after_rename:2").returncode == -signal.SIGKILL
    resumed = run(tmp_path / "run", resume=True)
    assert resumed.returncode == 0 and "resuming the population of 3 at step 400" in resumed.stderr, resumed.stderr
    logs = sorted((tmp_path / "ref").rglob("run.h5"))
    assert len(logs) == 3
    for a in logs:
        b = tmp_path / "run" / a.relative_to(tmp_path / "ref")
        ra, rb = read_run(a), read_run(b)
        assert ra.attrs["engine"] == "population:device"
        for name in ra.scalars:
            assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(ra.scalars[name], rb.scalars[name])), name
        for group, fields in ra.probes.items():
            for f, v in fields.items():
                assert np.array_equal(v, rb.probes[group][f]), (group, f)
        wa, wb = torch.load(a.parent / "q_net.pt"), torch.load(b.parent / "q_net.pt")
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ends = {read_run(a).config["learning_rate"]: read_run(a).scalars["run_end"] for a in logs}
    assert ends[1e200][0][0] > 200 and ends[1e-3][0][0] == 600 and len(read_run(logs[0]).scalars["episode_return"][0])


def test_population_engine_chooses_the_device_step_from_the_cli_and_only_for_populations(tmp_path, capsys):
    from agents.train import main
    from runlog import read_run

    flags = ["--env", "MountainCar-v0", "--act", "relu", "--steps", "300", "--set", "learning_starts=100",
             "--set", "hidden=[16]", "--set", "population_engine=device", "--no-progress", "--out", str(tmp_path)]
    assert main(["dqn", "--seeds", "0-1", *flags]) == 0
    assert "2 runs as one population" in capsys.readouterr().err
    logs = sorted(tmp_path.rglob("run.h5"))
    assert len(logs) == 2 and all("population_engine=device" in str(p) for p in logs)  # results differ: own folders
    assert all(read_run(p).attrs["engine"] == "population:device" for p in logs)
    assert main(["dqn", *flags]) == 2
    assert "population_engine=device is for populations" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):
        main(["rainbow", "--env", "CartPole-v1", "--set", "population_engine=device", "--out", str(tmp_path)])
    assert "rainbow trains no populations" in capsys.readouterr().err


def test_a_diverged_device_member_logs_all_it_did_up_to_its_end_and_nothing_after(tmp_path):
    """The host learns of a divergence at a read-back or a loss log, later than the step: the member's log still
    holds every episode up to that step, its loss there, and no probe record or episode after it."""
    from agents.population.run import run_population
    from runlog import read_run

    members = [Member(0, 1e-3, 1000), Member(1, 1e200, 1000)]
    values = {"env": "MountainCar-v0", "act": "relu", "n_timesteps": 600, "progress": False,
              "set": ["learning_starts=239", "hidden=[16]", "max_episode_steps=120", "probe=[sparsity]",
                      "probe_every=1"]}
    summaries = run_population(values, members, tmp_path, implementation="device", checkpoint_every=0)
    assert [s["status"] for s in summaries] == ["finished", "nan"]
    end = summaries[1]["steps"]
    assert 239 < end < 600
    run = read_run(next(p for p in tmp_path.rglob("run.h5") if "learning_rate=1e+200" in str(p)))
    assert run.scalars["run_end"][0].tolist() == [end]
    assert run.scalars["episode_return"][0].tolist() == [s for s in (120, 240, 360, 480) if s <= end]
    steps, losses = run.scalars["loss"]
    assert steps[-1] == end and not np.isfinite(losses[-1])
    assert max(run.probes["sparsity"]["step"]) <= end
