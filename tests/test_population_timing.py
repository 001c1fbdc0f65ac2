"""A grid's time estimate for populations (agents.population.timing): the model, and the timing on a real population."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.population import timing
from agents.population.engine import Member
from agents.population.run import member_configs

pytestmark = pytest.mark.unit


def _configs(members, **extra):
    return member_configs({"env": "MountainCar-v0", "act": "relu", "hidden": 16, "steps": 5000, "progress": False,
                           "set": ["learning_starts=100"], **extra}, members)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(timing, "_TIMED", {})
    monkeypatch.setattr(timing, "_SPEEDUP", {})


def test_the_estimate_applies_the_timed_steps_to_the_runs_schedule(monkeypatch):
    timed = []

    def fake(configs, members, implementation, device):
        timed.append((len(members), implementation, configs[0]["learning_starts"]))
        return (1e-3, 1e-2) if implementation == "device" else (1e-3, 2.5e-3)

    monkeypatch.setattr(timing, "step_seconds", fake)
    members = [Member(0, 1e-3, 100), Member(1, 3e-4, 300)]
    configs = _configs(members)
    assert timing.population_seconds(configs, members, "device", "cpu") == pytest.approx(100 * 1e-3 + 4900 * 1e-2)
    # compiled: its eager twin, scaled by the compiled step's speed-up (measured once per implementation and device)
    assert timing.population_seconds(configs, members, "device-compiled", "cpu") == \
        pytest.approx(100 * 1e-3 + 4900 * 2.5e-3)
    other = [Member(2, 1e-2, 100), Member(3, 1e-2, 300)]  # the same shape: not timed again
    assert timing.population_seconds(_configs(other), other, "device-compiled", "cpu") == \
        pytest.approx(100 * 1e-3 + 4900 * 2.5e-3)
    assert timed == [(2, "device", 100), (2, "device-compiled", 100)]


def test_a_compiled_step_that_fails_to_compile_is_estimated_by_its_eager_twin(monkeypatch):
    def fake(configs, members, implementation, device):
        if implementation == "device-compiled":
            raise RuntimeError("implementation 'device-compiled': torch.compile failed")
        return 1e-3, 1e-2

    monkeypatch.setattr(timing, "step_seconds", fake)
    members = [Member(0, 1e-3, 100)]
    assert timing.population_seconds(_configs(members), members, "device-compiled", "cpu") == \
        pytest.approx(100 * 1e-3 + 4900 * 1e-2)


def test_timing_a_real_population_leaves_the_threads_as_they_were():
    threads = torch.get_num_threads()
    members = [Member(0, 1e-3, 100), Member(1, 3e-4, 100)]
    for implementation in ("device", "batched"):
        random_s, full_s = timing.step_seconds(_configs(members), members, implementation, "cpu")
        assert np.isfinite([random_s, full_s]).all() and random_s > 0 and full_s > 0
    assert torch.get_num_threads() == threads


def test_a_long_grids_plan_says_how_long_it_will_take(tmp_path, monkeypatch):
    from agents.grid import plan, tasks
    from agents.grid import cli

    monkeypatch.setattr(timing, "step_seconds", lambda configs, members, implementation, device: (0.0, 3600 / 99_000))
    spec = {"command": "dqn", "engine": "population", "population_size": 1,
            "fixed": {"env": "MountainCar-v0", "hidden": 16, "steps": 100_000, "progress": False},
            "grids": [{"act": ["relu"], "seed": [0, 1]}]}  # two populations, each 99,000 steps past learning_starts
    work = tasks(plan(spec, tmp_path))
    assert "h one population" not in cli._population_plan(work)  # short: not timed
    monkeypatch.setattr(cli, "ESTIMATE_FROM", 1)
    with pytest.MonkeyPatch.context() as elsewhere:  # runs on a CUDA device this machine lacks
        elsewhere.setattr("agents.population.run._device", lambda config: "cuda")
        elsewhere.setattr(torch.cuda, "is_available", lambda: False)
        assert cli._population_plan(work).endswith("; no time estimate (its device is not on this machine)")
    assert cli._population_plan(work, workers=3).endswith(", 1.0 h with 3 at a time on separate cores or GPUs (steps "
                                                          "timed here, compiles not counted)")
    line = cli._population_plan(work, workers=2)
    assert line.endswith("; ~2.0 h one population at a time, 1.0 h with 2 at a time on separate cores or GPUs "
                         "(steps timed here, compiles not counted)"), line
