"""What a run says it will cost (agents.rl.budget) and how it revises that while it trains (agents.rl.callbacks):
one duration model, calibrated before the run without touching it, fitted again to the run itself; dated finish
times; a resumed run planned and memory-checked like a fresh one. Small CartPole runs (seconds)."""

from __future__ import annotations

import copy
import datetime
import io
import json
import re
import zipfile
from contextlib import redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import agents.rl.budget as budget
import agents.rl.callbacks as callbacks
import agents.rl.run as run
from agents.rl.budget import Estimate, calibrate
from agents.rl.callbacks import finish_time
from agents.rl.config import resolve
from agents.rl.run import build_env, build_model
from agents.train import main

DATE = r"\w{3} \d{1,2} \w{3}( \d{4})? \d\d:\d\d"  # Thu 3 Dec 07:38 (a year if not this one)


def _atari_like(total: int = 12_500_000, learning_starts: int = 32, decay: int = 1_000_000, final: float = 0.05,
                random_s: float = 0.5e-3, forward_s: float = 0.9e-3, update_s: float = 18e-3) -> Estimate:
    """The Atari DQN schedule (one update per 10 steps, epsilon 1 -> 0.05 over 1M steps after learning_starts)."""
    def epsilon(t: int) -> float:
        return 1.0 + min(max((t - learning_starts) / decay, 0.0), 1.0) * (final - 1.0)

    model = SimpleNamespace(exploration_steps=decay, epsilon=epsilon, exploration_fraction=0.1)
    grid, randomly = budget._random_table(model, total, learning_starts)
    return Estimate(total=total, learning_starts=learning_starts, rollout=10, gradient_steps=1, random_s=random_s,
                    forward_s=forward_s, update_s=update_s, grid=grid, random_steps=randomly)


def _config(algo: str = "dqn", steps: int = 1500, **extra) -> dict:
    return resolve(algo, {"env": "CartPole-v1", "hidden": "16", "n_timesteps": steps, "learning_starts": 100,
                          "probe": [], "progress": False, **extra})


# --- the model -----------------------------------------------------------------------------------------------


def test_the_schedule_counts_updates_and_greedy_steps_of_the_steps_still_to_go():
    est = _atari_like()
    assert est.updates(0) == 1_249_997  # rollout ends 40, 50, ..., 12.5M (SB3 updates after step 32)
    assert est.updates(6_000_000) == 650_000  # a resumed run: its remaining updates only
    # random: the 32 steps before learning starts, half of the 1M-step decay, 5% of the rest
    assert est.greedy_steps(0) == pytest.approx(12_500_000 - (32 + 525_000 + 0.05 * 11_499_968), rel=1e-6)
    assert est.greedy_steps(6_000_000) == pytest.approx(0.95 * 6_500_000)
    assert est.seconds(6_000_000) == pytest.approx(est.seconds(0) - est.seconds(0, 6_000_000), rel=1e-9)


def test_the_early_pace_is_not_the_runs_pace_and_the_fitted_model_is():
    """The first 30 s of an Atari run act at random (epsilon near 1): extrapolating their pace, as the in-run line
    did, promises a run ~25% shorter than it is; fitting the model to those seconds recovers the whole run, even on
    a machine where every cost differs from the calibration's (slower env steps, 3x slower network)."""
    first = _atari_like()
    truth = first.scaled(1.3, 3.0)
    a, b = 0, 8000  # the first steps
    acting, updating = truth.acting_seconds(a, b), truth.updates(a, b) * truth.update_s
    naive = (truth.total - a) / ((b - a) / (acting + updating))
    assert naive < 0.8 * truth.seconds(0)
    fitted = first.measured(a, b, acting, updating)
    assert fitted.seconds(b) == pytest.approx(truth.seconds(b), rel=0.02)
    # a run that goes exactly as the first estimate said keeps that estimate: one model, not two estimators
    same = first.measured(a, b, first.acting_seconds(a, b), first.updates(a, b) * first.update_s)
    assert same.seconds(b) == pytest.approx(first.seconds(b), rel=1e-9)


def test_finish_times_carry_their_date():
    thursday = datetime.datetime(2026, 12, 3, 0, 5).timestamp()
    assert finish_time(7 * 3600 + 33 * 60, now=thursday) == "Thu 3 Dec 07:38"
    assert finish_time(7 * 86400 + 7 * 3600 + 33 * 60, now=thursday) == "Thu 10 Dec 07:38"  # not "Thu 07:38"
    assert finish_time(30 * 86400, now=thursday) == "Sat 2 Jan 2027 00:05"
    assert re.fullmatch(DATE, finish_time(3600))


# --- calibration ----------------------------------------------------------------------------------------------


def _state(model) -> dict:
    return {"params": {k: v.clone() for k, v in model.policy.state_dict().items()},
            "optim": copy.deepcopy(model.policy.optimizer.state_dict()),
            "grads": {n: None if p.grad is None else p.grad.clone() for n, p in model.policy.named_parameters()},
            "buffer": (model.replay_buffer.pos, model.replay_buffer.full, model.replay_buffer.observations.copy()),
            "steps": (model.num_timesteps, model._n_updates, model.exploration_rate),
            "logged": dict(model.logger.name_to_value),
            "rng": (np.random.get_state()[1].copy(), torch.get_rng_state().clone())}


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


@pytest.mark.parametrize("algo", ["dqn", "rainbow"])
def test_calibration_measures_real_updates_and_leaves_the_run_as_it_was(algo):
    """Calibrating a model that has trained (gradients, replay, optimiser moments, as after --resume) changes
    nothing of it, nor the global random generators (Rainbow's noise draws from torch's)."""
    config = _config(algo)
    model = build_model(config)
    model.learn(300)
    before = _state(model)
    est = calibrate(config, model, lambda: build_env(config, seed=7), seconds=0.2)
    assert _same(before, _state(model))
    assert est.random_s > 0 and est.update_s > 0 and est.forward_s >= 0 and est.calibration_s >= 0.2
    assert est.updates(0) == config["n_timesteps"] - 100  # one update per step after learning_starts


@pytest.mark.parametrize("algo", ["dqn", "rainbow"])
def test_a_run_trains_identically_with_and_without_its_calibration(tmp_path, monkeypatch, algo):
    config = _config(algo, steps=600)
    weights = []
    for calibrated in (False, True):
        monkeypatch.setattr(run, "CALIBRATE_ABOVE", 0 if calibrated else 10 ** 9)
        monkeypatch.setattr(budget, "CALIBRATION_S", 0.1)
        run_dir = tmp_path / str(calibrated)
        run.train(config, run_dir)
        with zipfile.ZipFile(run_dir / "model.zip") as z:
            weights.append(torch.load(io.BytesIO(z.read("policy.pth")), weights_only=False))
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


# --- what the user sees -----------------------------------------------------------------------------------------


def _cli(args: list[str], capsys, status: int = 0) -> tuple[dict | None, str]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main([*args, "--no-progress"]) == status
    out = buf.getvalue()
    return (json.loads(out) if out.strip() else None), capsys.readouterr().err


def test_the_updated_estimate_replaces_the_first_and_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run, "CALIBRATE_ABOVE", 0)
    monkeypatch.setattr(budget, "CALIBRATION_S", 0.1)
    monkeypatch.setattr(callbacks, "ESTIMATE_AFTER_S", 0.5)
    monkeypatch.setattr(callbacks, "LONG_S", 0.0)  # (a short run shows the lines too)
    _, err = _cli(["dqn", "--env", "CartPole-v1", "--hidden", "16", "--steps", "3000", "--set", "learning_starts=100",
                   "--out", str(tmp_path)], capsys)
    first = re.search(rf"3,000 env steps, 2,900 updates: first estimate about (.+?) on this machine, done around "
                      rf"{DATE} \(from a [\d.]+ s calibration", err)
    assert first, err
    updated = re.search(rf"updated estimate from the first \d+ s of training: about .+? \(replaces the first "
                        rf"estimate, (.+?)\), done around {DATE}", err)
    assert updated and updated.group(1) == first.group(1), err
    assert err.index(first.group(0)) < err.index(updated.group(0))
    assert "in all" not in err and "steps/s here" not in err  # the old, unexplained second estimate


def _interrupted(config: dict, run_dir: Path, monkeypatch, at: int) -> None:
    """Train ``config`` into ``run_dir`` until a stop request at step ``at`` (as Ctrl-C): a checkpoint remains."""
    pace = callbacks.RunCallback._pace

    def stop_at(self, step):
        if step >= at:
            self.stop_requested = True
        pace(self, step)

    monkeypatch.setattr(callbacks.RunCallback, "_pace", stop_at)
    with pytest.raises(SystemExit) as exc:
        run.train(config, run_dir)
    assert exc.value.code == 130 and (run_dir / "checkpoint.pkl").exists()
    monkeypatch.setattr(callbacks.RunCallback, "_pace", pace)


def test_a_resumed_run_plans_and_checks_its_memory_like_a_fresh_one(tmp_path, monkeypatch, capsys):
    """The peak counts the replay buffer the checkpoint brings (not the memory in use once it is loaded), and a
    buffer that does not fit is refused before the checkpoint is read."""
    from agents.commands import get_command

    for module in (budget, run):  # a process holding 100 MB on a machine with 10 GB available
        monkeypatch.setattr(module, "rss", lambda: 100_000_000)
        monkeypatch.setattr(module, "available_memory", lambda: 10_000_000_000)
    flags = ["dqn", "--env", "CartPole-v1", "--hidden", "16", "--steps", "800", "--buffer-size", "20000", "--set",
             "learning_starts=100", "--set", "checkpoint_every=200"]
    _, fresh = _cli([*flags, "--out", str(tmp_path / "fresh")], capsys)
    plan = re.search(r"replay buffer of 20,000 transitions: 960 kB; peak memory about (.+?) of", fresh)
    assert plan and plan.group(1) == "101 MB", fresh  # 100 MB + 20,000 x 48 bytes

    cmd = get_command("dqn")
    config = cmd.make_config({"env": "CartPole-v1", "hidden": "16", "steps": 800, "buffer_size": 20000,
                              "set": ["learning_starts=100", "checkpoint_every=200"], "progress": False})
    run_dir = cmd.run_dir(config, tmp_path / "resumed")
    _interrupted(config, run_dir, monkeypatch, at=450)
    capsys.readouterr()
    summary, resumed = _cli([*flags, "--out", str(tmp_path / "resumed"), "--resume"], capsys)
    assert "resuming at step" in resumed and summary["status"] == "finished", resumed
    assert f"replay buffer of 20,000 transitions: 960 kB; peak memory about {plan.group(1)} of" in resumed, resumed

    _interrupted(config, run_dir, monkeypatch, at=450)
    capsys.readouterr()
    for module in (budget, run):
        monkeypatch.setattr(module, "available_memory", lambda: 100_500_000)
    status = main([*flags, "--out", str(tmp_path / "resumed"), "--resume", "--no-progress"])
    refused = capsys.readouterr().err
    assert status == 2 and "the replay buffer of 20,000 transitions needs 960 kB" in refused, refused
    assert "free memory to resume this run" in refused and "resuming at step" not in refused
