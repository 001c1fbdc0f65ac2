"""The SAC member bench's stacked update (agents.rl.bench_sac_members): it runs on copies of the model's networks
and leaves the model it measures untouched."""

from __future__ import annotations

import torch

from agents.rl.bench_sac_members import stacked_rate
from agents.rl.config import resolve
from agents.rl.run import build_model


def test_the_stacked_sac_update_runs_and_leaves_the_model_alone():
    model = build_model(resolve("sac", {"env": "Pendulum-v1", "act": "elephant", "hidden": [16, 16],
                                        "n_timesteps": 100, "progress": False}))
    before = {k: v.clone() for k, v in model.policy.state_dict().items()}
    assert stacked_rate(model, 3, 2, "cpu") > 0
    assert all(torch.equal(before[k], v) for k, v in model.policy.state_dict().items())
    model.get_env().close()
