"""The paper's policy-gradient settings on MuJoCo (appendix "Policy Gradient Methods") as the authors' code runs
them (qlan3/Elephant: configs/mujoco_ppo.json, configs/mujoco_sac.json, agents/PPO.py, agents/SAC.py, utils/env.py),
pinned: the resolved configs of `agents.train ppo|sac` on the six tasks and the networks they build, whose
parameter counts are the authors' (counted from their architectures; PPO's differ by the authors' state-dependent
standard-deviation head, a documented deviation)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.grid.planning import plan
from agents.grid.spec import load_grid
from agents.rl.config import resolve
from agents.rl.run import build_model

TASKS = {"HalfCheetah-v4": 6, "Hopper-v4": 3, "Walker2d-v4": 6, "Ant-v4": 8, "Reacher-v4": 2, "Swimmer-v4": 2}

#: SAC per activation: (hidden widths, activation on the last hidden layer only, activation arguments, sigma_bias)
SAC = {"relu": ([256, 256], False, {}, None), "elephant": ([256, 256], False, {"d": 4, "h": 1, "a": 1.0}, 2.0),
       "fta": ([256, 220], True, {"k": 20, "bound": 20}, None), "maxout": ([256, 1024], False, {"k": 4}, None),
       "lwta": ([256, 256], False, {"k": 4}, None)}
#: PPO per activation: (the hidden width, activation arguments, sigma_bias)
PPO = {"tanh": (1000, {}, None), "elephant": (1000, {"d": 4, "h": 1, "a": 0.8}, 1.0),
       "fta": (150, {"k": 20, "bound": 20}, None), "maxout": (1000, {"k": 5}, None), "lwta": (1000, {"k": 5}, None)}


@pytest.mark.parametrize("env", TASKS)
@pytest.mark.parametrize("act", SAC)
def test_sac_on_mujoco_is_the_authors_sac(env, act):
    widths, last_only, kwargs, sigma = SAC[act]
    c = resolve("sac", {"env": env, "act": act})
    assert c["derived"]["hidden"] == {"pi": widths, "qf": widths}
    assert c.get("act_layers", "all") == ("last" if last_only else "all")
    assert c["act_kwargs"] == kwargs and c["sigma_bias"] == sigma and c["layer_norm"] == (act == "elephant")
    assert (c["learning_rate"], c["lr_schedule"], c["optimizer"], c["optimizer_kwargs"]) == (1e-3, "constant", "adam",
                                                                                           {})
    assert (c["batch_size"], c["buffer_size"], c["gamma"], c["tau"]) == (256, 1_000_000, 0.99, 0.005)
    assert (c["learning_starts"], c["train_freq"], c["gradient_steps"],
            c["target_update_interval"]) == (10_000, 1, 1, 1)
    assert c["ent_coef"] == "auto" and c["target_entropy"] == -TASKS[env] / 2
    assert not c.get("normalize_obs") and not c.get("normalize_reward") and c["n_timesteps"] == 1_000_000


@pytest.mark.parametrize("env", TASKS)
@pytest.mark.parametrize("act", PPO)
def test_ppo_on_mujoco_is_the_authors_ppo(env, act):
    width, kwargs, sigma = PPO[act]
    c = resolve("ppo", {"env": env, "act": act})
    assert c["derived"]["hidden"] == {"pi": [width], "vf": [width]}
    assert c["act_kwargs"] == kwargs and c["sigma_bias"] == sigma and c["layer_norm"] == (act == "elephant")
    assert (c["learning_rate"], c["lr_schedule"], c["optimizer"], c["optimizer_kwargs"]) == (1e-4, "linear", "adam",
                                                                                           {"eps": 1e-8})
    assert (c["n_envs"], c["n_steps"], c["batch_size"], c["n_epochs"]) == (1, 2048, 64, 10)
    assert (c["gamma"], c["gae_lambda"], c["clip_range"], c["vf_coef"], c["ent_coef"]) == (0.99, 0.95, 0.2, 0.5, 0.0)
    assert c["max_grad_norm"] == 0.5 and c["normalize_obs"] and c["normalize_reward"]
    assert c["policy_kwargs"] == {"ortho_init": False} and c["n_timesteps"] == 1_000_000


def _count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_the_networks_have_the_authors_layers_and_parameter_counts():
    """Hopper (11 observations, 3 actions). The authors' SAC: actor and two critics, target critics not counted;
    their PPO: actor (mean and a state-dependent std head) and critic, each one hidden layer."""
    want_sac = {"relu": 210_184, "elephant": 216_328, "fta": 215_580, "maxout": 212_488, "lwta": 210_184}
    for act, n in want_sac.items():
        policy = build_model(resolve("sac", {"env": "Hopper-v4", "act": act})).policy
        assert _count(policy.actor) + _count(policy.critic) == n, act
        if act == "fta":  # FTA on the last hidden layer only, ReLU before it, in the actor and both critics
            for net in (policy.actor.latent_pi, policy.critic.qf0, policy.critic.qf1):
                assert [type(m).__name__ for m in net][:4] == ["Linear", "ReLU", "Linear", "FTA"]
    authors_ppo = {"tanh": 31_007, "elephant": 39_007, "fta": 24_607, "maxout": 25_407, "lwta": 31_007}
    for act, n in authors_ppo.items():
        policy = build_model(resolve("ppo", {"env": "Hopper-v4", "act": act})).policy
        latent = policy.mlp_extractor.latent_dim_pi
        std_head = latent * 3 + 3  # the authors' Dense(|A|) std head; SB3 learns |A| log-stds instead
        assert _count(policy) == n - std_head + 3, act
        assert all(float(m.bias.detach().abs().max()) == 0 for m in policy.mlp_extractor.modules()
                   if type(m).__name__ == "Linear" and act != "elephant")  # zero hidden biases (Elephant: spread)


def test_act_layers_is_refused_where_it_cannot_hold():
    from agents.errors import ConfigError

    with pytest.raises(ConfigError, match="with act_layers=last give net_arch instead"):
        resolve("sac", {"env": "Hopper-v4", "act": "fta", "match_width": True})
    with pytest.raises(ConfigError, match="unknown dqn settings"):
        resolve("dqn", {"env": "CartPole-v1", "set": ["act_layers=last"]})
    from agents.rl.policies import act_blocks

    with pytest.raises(ValueError, match="act_layers must be one of all, last, got 'first'"):
        act_blocks(4, [8, 8], "fta", {"k": 4, "bound": 2}, act_layers="first")


def _grid(name: str, tmp_path: Path) -> list:
    return plan(load_grid(Path(__file__).parents[1] / "agents" / "grids" / name), tmp_path)


def test_the_policy_gradient_grids_plan_the_runs_their_pages_report(tmp_path):
    """The shipped grids resolve to the configs above (the authors' settings) and the lengths, buffers, activations
    and seeds their comments and reproduction pages state."""
    ppo = _grid("pg_ppo.yml", tmp_path / "ppo")
    assert len(ppo) == 108 and {(r.config["env"], r.config["act"], r.config["seed"]) for r in ppo} == \
        {(e, a, s) for e in TASKS for a in (*PPO, "relu") for s in (0, 1, 2)}
    for r in ppo:
        assert r.config == resolve("ppo", {"env": r.config["env"], "act": r.config["act"], "seed": r.config["seed"],
                                           "n_timesteps": 300_000, "progress": False})
    sac = _grid("pg_sac_buffers.yml", tmp_path / "sac")
    assert len(sac) == 54 and {(r.config["env"], r.config["act"], r.config["buffer_size"], r.config["seed"])
                               for r in sac} == {(e, a, b, s) for e in ("Swimmer-v4", "Reacher-v4")
                                                 for a in ("elephant", "relu", "lwta") for b in (1000, 10_000, 100_000)
                                                 for s in (0, 1, 2)}
    assert all(r.config["n_timesteps"] == 100_000 and r.config["learning_starts"] == 10_000 for r in sac)
    robot = _grid("pg_reacher_proxy.yml", tmp_path / "robot")  # the robot setting's SAC on Reacher
    assert len(robot) == 20 and {(r.config["act"], r.config["buffer_size"], r.config["seed"]) for r in robot} == \
        {(a, b, s) for a in ("elephant", "relu") for b in (2000, 200_000) for s in range(5)}
    for r in robot:
        c = r.config
        assert (c["env"], c["n_timesteps"], c["derived"]["hidden"]) == ("Reacher-v4", 100_000,
                                                                         {"pi": [256, 256], "qf": [256, 256]})
        assert (c["learning_rate"], c["train_freq"], c["gradient_steps"], c["batch_size"]) == (3e-4, 2, 1, 64)
        if c["act"] == "elephant":
            assert c["act_kwargs"] == {"d": 4, "h": 1, "a": 1.0} and c["sigma_bias"] == 1.6
