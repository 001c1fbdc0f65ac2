"""The policy-gradient member bench's stacked updates (agents.rl.bench_pg_members): they run on copies of the
model's networks and leave the model they measure untouched."""

from __future__ import annotations

import torch

from agents.rl.bench_pg_members import ppo_stacked, sac_stacked
from agents.rl.config import resolve
from agents.rl.run import build_model


def test_the_stacked_sac_update_runs_and_leaves_the_model_alone():
    model = build_model(resolve("sac", {"env": "Pendulum-v1", "act": "elephant", "hidden": [16, 16],
                                        "n_timesteps": 100, "progress": False}))
    before = {k: v.clone() for k, v in model.policy.state_dict().items()}
    assert sac_stacked(model, 3, 2, "cpu") > 0
    assert all(torch.equal(before[k], v) for k, v in model.policy.state_dict().items())
    model.get_env().close()


def test_the_stacked_ppo_update_runs_and_leaves_the_model_alone():
    model = build_model(resolve("ppo", {"env": "Pendulum-v1", "act": "elephant", "hidden": [16],
                                        "n_timesteps": 100, "progress": False}))
    before = {k: v.clone() for k, v in model.policy.state_dict().items()}
    acting, update = ppo_stacked(model, 3, 2, "cpu")
    assert acting > 0 and update > 0
    assert all(torch.equal(before[k], v) for k, v in model.policy.state_dict().items())
    model.get_env().close()
