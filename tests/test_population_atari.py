"""Atari population members against single runs of ``agents.train dqn --set atari_env=ale-vector`` (SB3's DQN on
the same C++ vector env), in lockstep: each member draws from its single run's streams, and its weights after 37
updates (3-step returns, Adam, target copies, life losses, game overs and truncations on the way) equal the run's
bit for bit ("loop"); the stacked form ("vmap") equals the loop in float64; a pickled population continues as the
uninterrupted one. (ReLU's cases run with the long tests: the default run keeps Elephant's.)"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from agents.population.atari import AtariPopulation, atari_refusal
from agents.population.engine import Member
from agents.population.run import member_configs
from agents.rl.config import resolve
from agents.rl.run import build_model

STEPS = 400  # learning_starts 32, one update per 10 steps: 37 updates
SETTINGS = {"env": "ALE/Breakout-v5", "atari_env": "ale-vector", "n_timesteps": STEPS, "max_episode_steps": 150,
            "exploration_steps": 200, "target_update_interval": 100, "eval_every": None, "probe": [],
            "checkpoint_every": None}
#: the second member has its own learning rate, a buffer that wraps and its own epsilon schedule
MEMBERS = [Member(seed=0, learning_rate=1e-4, buffer_size=2000),
           Member(seed=1, learning_rate=3e-4, buffer_size=300, exploration_initial_eps=0.6, exploration_final_eps=0.1,
                  exploration_steps=100)]


def sb3_run(config: dict) -> tuple[dict, dict[str, torch.Tensor], list]:
    """Train SB3's DQN (agents.train dqn's model) for STEPS; its draws (exploration coins, random actions, replay
    positions), final weights and finished games."""
    model = build_model(config)
    draws = {"coins": [], "actions": [], "indices": []}
    sample, rand, get = model.action_space.sample, np.random.rand, model.replay_buffer._get_samples

    def recorded_sample(*args, **kwargs):
        a = sample(*args, **kwargs)
        draws["actions"].append(int(a))
        return a

    def recorded_rand(*args):
        u = rand(*args)
        draws["coins"].append(float(u))
        return u

    def recorded_get(batch_inds, env=None):
        draws["indices"].append(np.array(batch_inds))
        return get(batch_inds, env)

    model.action_space.sample, model.replay_buffer._get_samples, np.random.rand = recorded_sample, recorded_get, \
        recorded_rand
    try:
        model.learn(STEPS)
    finally:
        np.random.rand = rand
    games = [(e["r"], e["l"]) for e in model.ep_info_buffer]
    return draws, {k: v.detach().clone() for k, v in model.q_net.state_dict().items()}, games


@pytest.mark.parametrize("act", ["elephant", pytest.param("relu", marks=pytest.mark.long)])
def test_members_are_the_single_runs_of_their_seeds_bit_for_bit(act):
    """Nothing injected: each member draws from the streams its single run draws from (SingleRunDraws), so after
    37 updates its weights and games are the single run's; the draws recorded from the single runs are the ones the
    members made."""
    configs = member_configs({**SETTINGS, "act": act}, MEMBERS)
    runs = [sb3_run(c) for c in configs]
    recorded = Recording(AtariPopulation(configs[0], MEMBERS).draws)
    pop = AtariPopulation(configs[0], MEMBERS, draws=recorded, implementation="loop")
    pop.learn(STEPS)
    assert pop.adam_steps == STEPS // 10 - 32 // 10  # after steps 40, 50, ..., 400
    for m, (draws, weights, games) in enumerate(runs):
        assert {k: [np.asarray(x).tolist() for x in v] for k, v in draws.items()} == \
            {k: [np.asarray(x).tolist() for x in v] for k, v in recorded.made[m].items()}
        state = pop.member_state(m)
        assert state.keys() == weights.keys()
        for name, w in weights.items():
            assert torch.equal(state[name], w), (m, name, (state[name] - w).abs().max())  # bit for bit
        assert [(r, n) for _, r, n in pop.episodes[m]] == games and len(games) >= 2  # truncated at 150 steps
    assert pop.replay[1].size() == 300  # (the second member's buffer wrapped)


class Recording:
    """Draws that record, per member, what they made (as sb3_run records a single run's)."""

    def __init__(self, draws) -> None:
        self.draws, self.made = draws, [{"coins": [], "actions": [], "indices": []} for _ in MEMBERS]

    def explore(self, m):
        self.made[m]["coins"].append(u := self.draws.explore(m))
        return u

    def action(self, m):
        self.made[m]["actions"].append(a := self.draws.action(m))
        return a

    def all_indices(self, sizes, k):
        idx = self.draws.all_indices(sizes, k)
        for m, row in enumerate(idx):
            self.made[m]["indices"].append(row)
        return idx


def float64_population(config: dict, members: list[Member], implementation: str) -> AtariPopulation:
    from agents.population.networks import member_q_net

    return AtariPopulation(config, members, nets=[member_q_net(config, m.seed).double() for m in members],
                           implementation=implementation)


@pytest.mark.parametrize("act", ["elephant", pytest.param("relu", marks=pytest.mark.long)])
def test_the_stacked_network_is_the_loop_in_float64(act):
    """One torch.func call over stacked parameters (grouped convolutions) and one Adam step on stacked tensors
    against each member's own module and torch.optim.Adam, in float64 so that rounding cannot hide a wrong formula:
    equal to 1e-10 after the first update (step 40; a wrong formula is off by about the learning rate, 1e-4), and to
    1e-7 after 17 (Adam divides each gradient by its running scale, so rounding-level differences in gradients that
    cancel over the batch grow by orders of magnitude per update; measured: 1e-13 after 7 updates, 2e-9 after 17,
    2e-7 after 27), with the same games played."""
    members = [*MEMBERS, Member(seed=2, learning_rate=1e-3, buffer_size=64)]
    config = member_configs({**SETTINGS, "act": act}, members)[0]
    pops = {impl: float64_population(config, members, impl) for impl in ("vmap", "loop")}
    for steps, atol in ((40, 1e-10), (160, 1e-7)):
        for pop in pops.values():
            pop.learn(steps)
        for m in range(len(members)):
            fast, slow = pops["vmap"].member_state(m), pops["loop"].member_state(m)
            for name in slow:
                assert torch.allclose(fast[name], slow[name], atol=atol, rtol=0), \
                    (m, name, (fast[name] - slow[name]).abs().max())
        assert torch.allclose(pops["vmap"].last_losses, pops["loop"].last_losses, atol=atol, rtol=0)
    assert pops["vmap"].episodes == pops["loop"].episodes


def test_a_pickled_population_continues_as_the_uninterrupted_one():
    """The emulators (replayed from each game's seed and actions), frame buffers, generators, networks, targets and
    Adam states all travel in the pickle."""
    config = member_configs(SETTINGS, MEMBERS)[0]
    whole = AtariPopulation(config, MEMBERS)
    whole.learn(STEPS)
    half = AtariPopulation(config, MEMBERS)
    half.learn(STEPS // 2 + 7)  # (mid-way between updates, inside a game)
    half = pickle.loads(pickle.dumps(half))
    half.learn(STEPS - STEPS // 2 - 7)
    for m in range(len(MEMBERS)):
        for name, w in whole.member_state(m).items():
            assert torch.equal(half.member_state(m)[name], w), (m, name)
    assert half.episodes == whole.episodes
    assert np.array_equal(half.env.games.observation(), whole.env.games.observation())


def test_a_member_evaluates_as_a_single_runs_evaluation():
    """The authors' test protocol (whole games, raw scores, greedy) on a test env seeded as a single run's
    evaluation env: the same games as EvalCallback plays with the member's network."""
    from agents.rl.envs import make_env

    config = member_configs({**SETTINGS, "act": "relu", "max_episode_steps": 200}, MEMBERS)[0]
    pop = AtariPopulation(config, MEMBERS[:1], implementation="loop")
    pop.learn(100)
    ours = pop.evaluate([123], episodes=2)[0]
    env, net, games = make_env(config["env"], seed=123, atari_env="ale-vector", evaluation=True,
                               max_episode_steps=200), pop.nets[0], []
    obs = env.reset()
    while len(games) < 2:
        with torch.no_grad():
            obs, _, dones, infos = env.step(net(torch.as_tensor(obs)).argmax(1).numpy())
        games += [(info["episode"]["r"], info["episode"]["l"]) for d, info in zip(dones, infos) if d and "episode" in info]
    env.close()
    assert ours == games[:2]


def test_settings_the_atari_population_cannot_run_are_refused_in_one_line():
    ok = resolve("dqn", SETTINGS)
    assert atari_refusal(ok) is None
    for change, word in (({"atari_env": "sb3"}, "ale-vector"), ({"env": "CartPole-v1"}, "Atari ids"),
                         ({"optimizer": "rmsprop"}, "optimizer"), ({"td_loss": "huber"}, "td_loss"),
                         ({"optimizer_kwargs": {"amsgrad": True}}, "amsgrad"),
                         ({"learning_starts": 0}, "learning_starts >= 1"),
                         ({"n_timesteps": 405}, "multiple of train_freq")):
        why = atari_refusal({**ok, **change})
        assert why is not None and word in why and "\n" not in why, (change, why)
    with pytest.raises(ValueError, match="ale-vector"):
        AtariPopulation({**ok, "atari_env": "sb3"}, MEMBERS)


@pytest.mark.long
@pytest.mark.parametrize("algo", ["dqn", "rainbow"])
def test_a_killed_atari_population_resumes_to_the_uninterrupted_result(tmp_path, algo):
    """``agents.train dqn|rainbow --env ALE/Breakout-v5 --seeds 0-1 --set atari_env=ale-vector``: SIGKILL right
    after the second checkpoint, then --resume: every member's log (training games, losses, evaluations, the gradient
    covariance probe) and final weights equal an uninterrupted population's; the frame replays came back from the
    chunk files in the members' folders (with their priorities, for Rainbow), which are gone once the population
    finished."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from runlog import read_run
    from runlog.failpoints import ENV as KILL_AT

    root = Path(__file__).resolve().parents[1]
    args = [sys.executable, "-m", "agents.train", algo, "--env", "ALE/Breakout-v5", "--act", "elephant", "--seeds",
            "0-1", "--steps", "1200", "--set", "atari_env=ale-vector", "--set", "max_episode_steps=300", "--set",
            "eval_every=500", "--set", "eval_episodes=1", "--set", "buffer_size=2000", "--set",
            "probe_kwargs={gradcov: {at: [1000], k: 8}}", "--checkpoint-every", "400", "--no-progress"]
    env = {k: v for k, v in os.environ.items() if k != KILL_AT}
    ref = subprocess.run([*args, "--out", str(tmp_path / "ref")], cwd=root, env=env, capture_output=True, text=True)
    assert ref.returncode == 0, ref.stderr
    killed = subprocess.run([*args, "--out", str(tmp_path / "run")], cwd=root, capture_output=True, text=True,
                            env={**env, KILL_AT: "checkpoint.after_rename:2"})
    assert killed.returncode == -signal.SIGKILL
    assert len(list((tmp_path / "run").rglob("replay/frames-*.npy"))) >= 2  # (each member's chunks)
    resumed = subprocess.run([*args, "--resume", "--out", str(tmp_path / "run")], cwd=root, env=env,
                             capture_output=True, text=True)
    assert resumed.returncode == 0 and "resuming the population of 2 at step 800" in resumed.stderr, resumed.stderr
    logs = sorted((tmp_path / "ref").rglob("run.h5"))
    assert len(logs) == 2
    for a in logs:
        b = tmp_path / "run" / a.relative_to(tmp_path / "ref")
        ra, rb = read_run(a), read_run(b)
        assert len(ra.scalars["eval_return"][0]) == 2 and len(ra.probes["gradcov"]["step"]) == 1
        for name in ra.scalars:
            assert all(np.array_equal(x, y) for x, y in zip(ra.scalars[name], rb.scalars[name])), name
        for group, fields in ra.probes.items():
            for f, v in fields.items():
                assert np.array_equal(v, rb.probes[group][f]), (group, f)
        wa, wb = torch.load(a.parent / "q_net.pt"), torch.load(b.parent / "q_net.pt")
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not list((tmp_path / "run").rglob("replay")) and not list((tmp_path / "run" / "populations").glob("*.pkl"))


RAINBOW = {**SETTINGS, "per_beta_steps": 300}  # (beta annealed within the test)


def rainbow_run(config: dict) -> tuple[dict[str, torch.Tensor], list]:
    """Train agents.train rainbow's model for STEPS: its final weights (noise buffers included) and games."""
    model = build_model(config)
    model.learn(STEPS)
    return {k: v.detach().clone() for k, v in model.q_net.state_dict().items()}, \
        [(e["r"], e["l"]) for e in model.ep_info_buffer]


@pytest.mark.parametrize("act", ["elephant", pytest.param("relu", marks=pytest.mark.long)])
def test_rainbow_members_are_the_single_runs_of_their_seeds_bit_for_bit(act):
    """Every component (noisy nets redrawn before each action and update from the run's torch stream, C51, PER from
    its numpy stream with beta annealed, 3-step returns, dueling, double Q, fused Adam): a member's weights and
    games after 37 updates are its single run's."""
    configs = [resolve("rainbow", {**RAINBOW, "act": act, "seed": m.seed, "learning_rate": m.learning_rate,
                                   "buffer_size": m.buffer_size}) for m in MEMBERS[:1]] + \
        [resolve("rainbow", {**RAINBOW, "act": act, "seed": 1, "learning_rate": 3e-4, "buffer_size": 300,
                             "exploration_initial_eps": 0.6, "exploration_final_eps": 0.1, "exploration_steps": 100})]
    runs = [rainbow_run(c) for c in configs]
    pop = AtariPopulation(configs[0], MEMBERS)
    assert pop.implementation == "loop"
    pop.learn(STEPS)
    for m, (weights, games) in enumerate(runs):
        state = pop.member_state(m)
        assert state.keys() == weights.keys()
        for name, w in weights.items():
            assert torch.equal(state[name], w), (m, name, (state[name] - w).abs().max())
        assert [(r, n) for _, r, n in pop.episodes[m]] == games and len(games) >= 2
    again = pickle.loads(pickle.dumps(pop))  # (the members' torch streams travel as states)
    assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(pop.noise, again.noise))


def test_the_population_engine_setting_picks_the_exact_loop_or_is_refused(tmp_path):
    """``population_engine: exact`` is ``loop`` (a member is its single run on any device); the classic tasks'
    device step is refused in one line; a population without probes writes its members' run folders."""
    from agents.population.run import POPULATION, _implementation, run_population

    config = resolve("dqn", SETTINGS)
    assert _implementation({**config, "population_engine": "exact"}) == "loop"
    assert _implementation(config) == "auto"
    why = POPULATION.refusal([resolve("dqn", {**SETTINGS, "set": ["population_engine=device"]})])
    assert why is not None and "Atari populations take auto or exact" in why and "\n" not in why
    summaries = run_population({**SETTINGS, "n_timesteps": 100}, MEMBERS[:1], tmp_path)
    assert summaries[0]["status"] == "finished" and summaries[0]["engine"] == "population:loop"


def test_the_stacked_rainbow_is_the_loop_in_float64(monkeypatch):
    """Rainbow's stacked form (one torch.func call per step and update; noise, PER and draws from the same member
    streams) against its loop (Rainbow's own methods per member), in float64 (SB3's float32 cast of observations
    replaced by a float64 one in both): 1e-10 after the first update, 1e-6 after 17, the same games (rounding grows
    faster through noisy layers and C51's log-softmax than in DQN: measured 2e-13, 3e-11, 3e-10, 5e-9, 1e-7 after
    1, 5, 9, 13, 17 updates; a wrong formula is off by about the learning rate, 1e-4, from the first)."""
    import stable_baselines3.common.policies as sb3_policies

    monkeypatch.setattr(sb3_policies, "preprocess_obs", lambda obs, space, normalize_images=True: obs.double())
    config = resolve("rainbow", {**RAINBOW, "act": "elephant"})
    members = [*MEMBERS, Member(seed=2, learning_rate=1e-3, buffer_size=64)]
    pops = {impl: AtariPopulation(config, members, implementation=impl, dtype=torch.float64)
            for impl in ("vmap", "loop")}
    for steps, atol in ((40, 1e-10), (160, 1e-6)):
        for pop in pops.values():
            pop.learn(steps)
        for m in range(len(members)):
            fast, slow = pops["vmap"].member_state(m), pops["loop"].member_state(m)
            assert fast.keys() == slow.keys()
            for name in slow:
                assert torch.allclose(fast[name], slow[name], atol=atol, rtol=0), \
                    (m, name, (fast[name] - slow[name]).abs().max())
        assert torch.allclose(pops["vmap"].last_losses, pops["loop"].last_losses, atol=atol, rtol=0)
    assert pops["vmap"].episodes == pops["loop"].episodes


@pytest.mark.parametrize("algo", ["dqn", pytest.param("rainbow", marks=pytest.mark.long)])
def test_frames_on_the_device_train_what_frames_on_the_host_train(algo):
    """``frames_on: device`` (here the CPU's torch ring: the device path's code) against the host's numpy ring: a
    population's members and a single run end with the same weights and games, bit for bit."""
    settings = {**SETTINGS, "act": "elephant", "n_timesteps": 120}  # (9 updates: samples from the first one on)
    pops = []
    for where in ("host", "device"):
        configs = member_configs({**settings, "frames_on": where}, MEMBERS, algo)
        pop = AtariPopulation(configs[0], MEMBERS, implementation="loop")
        pop.learn(120)
        assert isinstance(pop.replay[0].frames, torch.Tensor) == (where == "device")
        pops.append(pop)
    for m in range(len(MEMBERS)):
        a, b = pops[0].member_state(m), pops[1].member_state(m)
        assert all(torch.equal(a[k], b[k]) for k in a) and pops[0].episodes[m] == pops[1].episodes[m]
    models = []
    for where in ("host", "device"):
        model = build_model(resolve(algo, {**settings, "seed": 0, "buffer_size": 2000, "frames_on": where}))
        model.learn(120)
        assert isinstance(model.replay_buffer.frames, torch.Tensor) == (where == "device")
        models.append({k: v.detach().clone() for k, v in model.q_net.state_dict().items()})
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])
