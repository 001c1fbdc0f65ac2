"""Atari members of different activations in one process (agents.population.atari_groups.AtariGroups): each
sub-population's members are the runs they are in a population of their activation alone, bit for bit (weights,
games, evaluations), across a pickle; grids and ``agents.train`` group such runs into one population."""

from __future__ import annotations

import pickle

import pytest
import torch

from agents.population.atari import AtariPopulation
from agents.population.atari_groups import AtariGroups
from agents.population.engine import Member
from agents.population.run import POPULATION, member_configs
from agents.rl.config import resolve

STEPS = 200  # learning_starts 32, one update per 10 steps: 17 updates
SETTINGS = {"env": "ALE/Breakout-v5", "atari_env": "ale-vector", "n_timesteps": STEPS, "max_episode_steps": 150,
            "exploration_steps": 100, "target_update_interval": 50, "eval_every": None, "probe": [],
            "checkpoint_every": None}
A, B = Member(seed=0, learning_rate=1e-4, buffer_size=2000), Member(seed=1, learning_rate=3e-4, buffer_size=120)


def _states(pop, ms):
    return [{k: v.clone() for k, v in pop.member_state(m).items()} for m in ms]


@pytest.mark.parametrize("algo", ["dqn", pytest.param("rainbow", marks=pytest.mark.long)])
def test_members_of_two_activations_are_the_runs_of_their_own_populations(algo):
    """Elephant A, ReLU B, Elephant B in one AtariGroups (pickled and restored half-way) against a population of
    Elephant A and B and one of ReLU B: the same weights, games and evaluation games, bit for bit ("loop")."""
    elephant = member_configs({**SETTINGS, "act": "elephant"}, [A, B], algo)
    relu = member_configs({**SETTINGS, "act": "relu"}, [B], algo)
    groups = AtariGroups([elephant[0], relu[0], elephant[1]], [A, B, B], implementation="loop")
    assert [len(g.members) for g in groups.groups] == [2, 1] and groups.implementation == "loop"
    groups.learn(STEPS // 2)
    groups = pickle.loads(pickle.dumps(groups))
    groups.learn(STEPS - STEPS // 2)
    alone = [AtariPopulation(elephant[0], [A, B], implementation="loop"),
             AtariPopulation(relu[0], [B], implementation="loop")]
    for pop in alone:
        pop.learn(STEPS)
    expected = [(alone[0], 0), (alone[1], 0), (alone[0], 1)]  # member m of the groups: (population, its index)
    for m, (pop, j) in enumerate(expected):
        ours, theirs = groups.member_state(m), pop.member_state(j)
        assert ours.keys() == theirs.keys()
        for name in ours:
            assert torch.equal(ours[name], theirs[name]), (m, name)
        assert groups.episodes[m] == pop.episodes[j] and len(pop.episodes[j]) >= 1
        g, i = groups.where[m]
        assert groups.replay[m] is groups.groups[g].replay[i] and groups.episodes[m] is groups.groups[g].episodes[i]
    assert torch.equal(groups.last_losses, torch.stack([alone[0].last_losses[0], alone[1].last_losses[0],
                                                         alone[0].last_losses[1]]))
    games = groups.evaluate([7, 8, 9], 1)
    assert games == [alone[0].evaluate([7, 9], 1)[0], alone[1].evaluate([8], 1)[0], alone[0].evaluate([7, 9], 1)[1]]


def test_a_member_diverging_in_one_sub_population_stops_alone():
    """A ReLU member whose loss overflows (learning rate 1e30) between two Elephant members: it stops at the step its
    own population of one stops (``diverged_at`` in member order) with the same training games, and the Elephant
    members are the runs of their own population, bit for bit ("loop")."""
    wild = Member(seed=1, learning_rate=1e30, buffer_size=120)
    elephant = member_configs({**SETTINGS, "act": "elephant"}, [A, B])
    [relu] = member_configs({**SETTINGS, "act": "relu"}, [wild])
    groups = AtariGroups([elephant[0], relu, elephant[1]], [A, wild, B], implementation="loop")
    groups.learn(STEPS)
    alone = [AtariPopulation(elephant[0], [A, B], implementation="loop"),
             AtariPopulation(relu, [wild], implementation="loop")]
    for pop in alone:
        pop.learn(STEPS)
    at = groups.diverged_at
    assert at[0] == at[2] == 0 and at[1] == alone[1].diverged_at[0] > 0
    assert not torch.isfinite(groups.last_losses[1]) and torch.isfinite(groups.last_losses[[0, 2]]).all()
    assert groups.episodes[1] == alone[1].episodes[0]
    for m, j in ((0, 0), (2, 1)):
        ours, theirs = groups.member_state(m), alone[0].member_state(j)
        assert all(torch.equal(ours[k], theirs[k]) for k in ours), m
        assert groups.episodes[m] == alone[0].episodes[j]


def test_atari_runs_of_different_activations_group_into_one_population_and_classic_ones_do_not():
    atari = [resolve("dqn", {**SETTINGS, "act": act, "seed": s}) for act in ("elephant", "relu", "fta") for s in (0, 1)]
    assert len({POPULATION.group(c) for c in atari}) == 1 and POPULATION.refusal(atari) is None
    other_game = resolve("dqn", {**SETTINGS, "env": "ALE/Pong-v5", "act": "relu", "seed": 0})
    assert POPULATION.group(other_game) != POPULATION.group(atari[0])
    why = POPULATION.refusal([atari[0], other_game])
    assert why is not None and "their network" in why and "\n" not in why
    classic = [resolve("dqn", {"env": "Acrobot-v1", "act": act, "seed": 0}) for act in ("elephant", "relu")]
    assert POPULATION.group(classic[0]) != POPULATION.group(classic[1])
    why = POPULATION.refusal(classic)
    assert why is not None and "only" in why and "network" not in why


def test_an_atari_grid_plans_its_activations_as_one_population(tmp_path):
    from agents.grid import PopulationTask, plan, tasks

    spec = {"command": "dqn", "engine": "population",
            "fixed": {"env": "ALE/Breakout-v5", "atari_env": "ale-vector", "n_timesteps": 400, "progress": False},
            "grids": [{"act": ["elephant", "relu"], "seed": [0, 1]}]}
    todo = tasks(plan(spec, tmp_path))
    assert len(todo) == 1 and isinstance(todo[0], PopulationTask) and len(todo[0].runs) == 4


@pytest.mark.long
def test_a_grid_of_two_activations_writes_the_runs_their_own_populations_write(tmp_path):
    """``engine: population`` over Elephant and ReLU x seeds 0-1 on Breakout: one population of four (two
    sub-populations) whose member folders hold what ``agents.train dqn --act A --seeds 0-1`` writes for each
    activation: logs (training games, losses, evaluations, the gradient-covariance probe) and weights, equal; also
    when the grid is SIGKILLed right after its second checkpoint and resumed with ``--resume``."""
    import os
    import signal

    from runlog.failpoints import ENV as KILL_AT

    import subprocess
    import sys
    from pathlib import Path

    import numpy as np
    import yaml

    from runlog import read_run

    root = Path(__file__).resolve().parents[1]
    settings = {"atari_env": "ale-vector", "max_episode_steps": 300, "eval_every": 500, "eval_episodes": 1,
                "buffer_size": 2000, "learning_starts": 200, "probe_kwargs": {"gradcov": {"at": [1000], "k": 8}}}
    for act in ("elephant", "relu"):
        ref = subprocess.run([sys.executable, "-m", "agents.train", "dqn", "--env", "ALE/Breakout-v5", "--act", act,
                              "--seeds", "0-1", "--steps", "1200", "--checkpoint-every", "400", "--no-progress",
                              *[a for k, v in settings.items() for a in ("--set", f"{k}={json_value(v)}")],
                              "--out", str(tmp_path / "ref")], cwd=root, capture_output=True, text=True)
        assert ref.returncode == 0, ref.stderr[-3000:]
    grid = tmp_path / "grid.yml"
    grid.write_text(yaml.safe_dump({"command": "dqn", "engine": "population", "fixed": {
        "env": "ALE/Breakout-v5", "n_timesteps": 1200, "checkpoint_every": 400, "progress": False, **settings},
        "grids": [{"act": ["elephant", "relu"], "seed": [0, 1]}]}))
    args = [sys.executable, "-m", "agents.grid", str(grid), "--workers", "1"]
    env = {k: v for k, v in os.environ.items() if k != KILL_AT}
    run = subprocess.run([*args, "--out", str(tmp_path / "run")], cwd=root, capture_output=True, text=True, env=env)
    assert run.returncode == 0 and "4 runs, 0 already finished; 4 to train in 1 population" in run.stderr, \
        run.stderr[-3000:]
    killed = subprocess.run([*args, "--out", str(tmp_path / "killed")], cwd=root, capture_output=True, text=True,
                            env={**env, KILL_AT: "checkpoint.after_rename:2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = subprocess.run([*args, "--out", str(tmp_path / "killed"), "--resume"], cwd=root, capture_output=True,
                             text=True, env=env)
    assert resumed.returncode == 0 and "resuming the population of 4 at step 800" in resumed.stderr, \
        resumed.stderr[-3000:]
    logs = sorted((tmp_path / "ref").rglob("run.h5"))
    assert len(logs) == 4
    for a, out in ((a, out) for a in logs for out in ("run", "killed")):
        b = tmp_path / out / a.relative_to(tmp_path / "ref")
        ra, rb = read_run(a), read_run(b)
        assert len(ra.scalars["eval_return"][0]) == 2 and len(ra.probes["gradcov"]["step"]) == 1
        assert rb.attrs["population_size"] == 4 and ra.attrs["population_size"] == 2
        for name in ra.scalars:
            assert all(np.array_equal(x, y) for x, y in zip(ra.scalars[name], rb.scalars[name])), (a, name)
        for group, fields in ra.probes.items():
            for f, v in fields.items():
                assert np.array_equal(v, rb.probes[group][f]), (a, group, f)
        wa, wb = torch.load(a.parent / "q_net.pt"), torch.load(b.parent / "q_net.pt")
        assert all(torch.equal(wa[k], wb[k]) for k in wa)


def json_value(v):
    import json

    return json.dumps(v) if isinstance(v, dict) else str(v)
