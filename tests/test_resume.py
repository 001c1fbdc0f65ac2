"""Exact resume: runs killed at seeded times and at the dangerous moments, then ``--resume``d, end with
the weights, optimiser states and log records of an uninterrupted run with the same seed.

Each scenario kills a run (SIGKILL at a named kill point, :mod:`runlog.failpoints`, or after a seeded delay, or
SIGTERM), then resumes it (again if a resume is itself killed) and compares with a reference run: every dataset of
``run.h5`` (not the bytes: the log of a resumed run records its resumes in an attribute) and every tensor of
``model.zip``. Scenarios run in parallel processes, one batch per algorithm.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from runlog import read_run
from runlog.failpoints import ENV as KILL_AT

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
ENV.pop(KILL_AT, None)

#: small but complete runs: probes with state (cadence, RNG, inputs, gradients), several checkpoints and updates;
#: PPO with 8 envs x 32 steps per rollout
ALGOS = {
    "dqn": ["dqn", "--env", "CartPole-v1", "--hidden", "16", "--steps", "1000", "--set", "learning_starts=100",
            "--probe", "gradcov,weights,sparsity", "--probe-every", "200", "--checkpoint-every", "250"],
    "ppo": ["ppo", "--env", "CartPole-v1", "--hidden", "16", "--steps", "1024", "--set", "n_epochs=2",
            "--probe", "gradcov,weights", "--probe-every", "300", "--checkpoint-every", "256"],
    # Rainbow's own state: the sum tree and largest priority, the noisy layers' current noise, beta's schedule
    "rainbow": ["rainbow", "--env", "CartPole-v1", "--hidden", "16", "--steps", "800", "--set", "learning_starts=100",
                "--set", "per_beta_steps=800", "--probe", "gradcov,plasticity", "--probe-every", "200",
                "--checkpoint-every", "250"],
    # Atari: ALE's emulator state, the Atari wrappers and frame stack, the frame buffer's chunk files (the buffer
    # wraps: 400 transitions of 600 steps, so chunks are also pruned)
    "atari-dqn": ["dqn", "--env", "ALE/Breakout-v5", "--steps", "600", "--set", "learning_starts=100", "--set",
                  "buffer_size=400", "--probe", "gradcov", "--probe-every", "300", "--checkpoint-every", "150",
                  "--threads", "1"],
    # ale-py's C++ vector env: its games restarted from their seeds and their actions replayed
    "atari-vector-dqn": ["dqn", "--env", "ALE/Breakout-v5", "--steps", "600", "--set", "learning_starts=100", "--set",
                         "buffer_size=400", "--set", "atari_env=ale-vector", "--probe", "gradcov", "--probe-every",
                         "300", "--checkpoint-every", "150", "--threads", "1"],
    "atari-rainbow": ["rainbow", "--env", "ALE/Breakout-v5", "--steps", "600", "--set", "learning_starts=100",
                      "--set", "buffer_size=400", "--probe", "gradcov", "--probe-every", "300",
                      "--checkpoint-every", "150", "--threads", "1"],
    # MuJoCo with the paper's settings: PPO's observation and reward normalisation statistics (Elephant); SAC's FTA
    # on the last hidden layer only, its float64 observations and the gradient covariance of actor and critic
    "mujoco-ppo": ["ppo", "--env", "Hopper-v4", "--hidden", "16", "--steps", "1024", "--set", "n_steps=128",
                   "--set", "n_epochs=2", "--probe", "gradcov", "--probe-every", "300", "--checkpoint-every", "256"],
    "mujoco-sac": ["sac", "--env", "Hopper-v4", "--act", "fta", "--hidden", "16,16", "--steps", "600", "--set",
                   "learning_starts=100", "--probe", "gradcov", "--probe-every", "200", "--checkpoint-every", "150"],
}
_seeded = random.Random(13)
#: scenario -> how the first attempt dies: a kill point (NAME:N), a seeded SIGKILL delay, or SIGTERM after a delay
SCENARIOS = {
    "dqn": {"mid-checkpoint": "checkpoint.mid_write:2", "after-rename": "checkpoint.after_rename:2", "mid-record": "runlog.mid_record:60",
            "killed-resume": "resume.after_truncate", f"sigkill-{(d := round(_seeded.uniform(3, 5), 2))}s": d,
            "sigterm": "SIGTERM"},
    "ppo": {"mid-checkpoint": "checkpoint.mid_write:1", "after-rename": "checkpoint.after_rename:2",
            "mid-record": "runlog.mid_record:25", f"sigkill-{(d := round(_seeded.uniform(3, 5), 2))}s": d,
            "sigterm": "SIGTERM"},
    "rainbow": {"after-rename": "checkpoint.after_rename:2"},
    "atari-dqn": {"mid-checkpoint": "checkpoint.mid_write:2", "after-rename": "checkpoint.after_rename:2"},
    "atari-rainbow": {"after-rename": "checkpoint.after_rename:3"},
    "atari-vector-dqn": {"mid-checkpoint": "checkpoint.mid_write:2", "after-rename": "checkpoint.after_rename:3"},
    "mujoco-ppo": {"after-rename": "checkpoint.after_rename:2"},
    "mujoco-sac": {"after-rename": "checkpoint.after_rename:2"},
}


def _cmd(algo: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "agents.train", *ALGOS[algo], "--no-progress", "--out", str(out), *extra]


def _run(args: list[str], kill_at: str | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**ENV, KILL_AT: kill_at} if kill_at else ENV
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _signal_after(args: list[str], delay: float, sig: int, out: Path | None = None) -> subprocess.CompletedProcess:
    """Send ``sig`` ``delay`` seconds after the start (with ``out``: after training started, i.e. its log exists)."""
    proc = subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while out is not None and not list(out.rglob("run.h5")) and proc.poll() is None:
        time.sleep(0.05)
    deadline = time.time() + delay
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _run_dir(out: Path) -> Path:
    (found,) = [p.parent for p in out.rglob("config.yaml")]
    return found


def _scenario(algo: str, how: str | float, out: Path) -> dict:
    """Kill the first attempt as ``how`` says, then resume until the run finishes; what happened."""
    if how == "SIGTERM":
        first = _signal_after(_cmd(algo, out), 0.0, signal.SIGTERM, out)
    elif isinstance(how, float):
        first = _signal_after(_cmd(algo, out), how, signal.SIGKILL)
    elif how == "resume.after_truncate":  # die once, then die again inside the resume, right after the truncation
        first = _run(_cmd(algo, out), "checkpoint.after_rename:2")
        assert first.returncode == -signal.SIGKILL, first.stderr
        first = _run(_cmd(algo, out, "--resume"), how)
    else:
        first = _run(_cmd(algo, out), how)
    attempts = [first]
    while attempts[-1].returncode != 0 and len(attempts) < 4:
        attempts.append(_run(_cmd(algo, out, "--resume")))
    return {"codes": [a.returncode for a in attempts], "stderr": [a.stderr for a in attempts],
            "run_dir": _run_dir(out)}


def _tensors(zip_path: Path) -> dict[str, object]:
    """Every tensor and number in the ``.pth`` files of an SB3 ``model.zip`` (weights, optimiser states)."""
    out = {}

    def walk(prefix: str, obj: object) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}/{k}", v)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(f"{prefix}/{i}", v)
        else:
            out[prefix] = obj

    with zipfile.ZipFile(zip_path) as z:
        for name in z.namelist():
            if name.endswith(".pth"):
                walk(name, torch.load(io.BytesIO(z.read(name)), weights_only=False))
    return out


def differences(a: Path, b: Path) -> list[str]:
    """What differs between two run folders' logs (datasets) and models (tensors); empty if nothing."""
    ra, rb = read_run(a / "run.h5"), read_run(b / "run.h5")
    diff = []
    for kind, xa, xb in (("probes", ra.probes, rb.probes), ("scalars", ra.scalars, rb.scalars)):
        if set(xa) != set(xb):
            diff.append(f"{kind}: {sorted(xa)} vs {sorted(xb)}")
        for name in set(xa) & set(xb):
            ca = xa[name] if kind == "probes" else dict(zip(("step", "value"), xa[name]))
            cb = xb[name] if kind == "probes" else dict(zip(("step", "value"), xb[name]))
            for col in ca:
                if ca[col].shape != cb[col].shape or not np.array_equal(ca[col], cb[col], equal_nan=True):
                    diff.append(f"{kind}/{name}/{col}: shapes {ca[col].shape} vs {cb[col].shape}")
    if ra.config != rb.config:
        diff.append("config attribute")
    ta, tb = _tensors(a / "model.zip"), _tensors(b / "model.zip")
    for key in sorted(set(ta) | set(tb)):
        x, y = ta.get(key), tb.get(key)
        same = torch.equal(x, y) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else x == y
        if not same:
            diff.append(f"model.zip {key}")
    return diff


def _batch(algo: str, root: Path) -> tuple[Path, dict[str, dict]]:
    """The reference run and every scenario of ``algo``, run in parallel processes."""
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        ref = pool.submit(_run, _cmd(algo, root / "reference"))
        runs = {name: pool.submit(_scenario, algo, how, root / name) for name, how in SCENARIOS[algo].items()}
        reference = ref.result()
        assert reference.returncode == 0, reference.stderr
        return _run_dir(root / "reference"), {name: r.result() for name, r in runs.items()}


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    """``batches(algo)``: :func:`_batch`, run once per algorithm."""
    done: dict[str, tuple[Path, dict[str, dict]]] = {}

    def get(algo: str) -> tuple[Path, dict[str, dict]]:
        if algo not in done:
            done[algo] = _batch(algo, tmp_path_factory.mktemp(algo))
        return done[algo]

    return get


#: the PPO, Rainbow, Atari and MuJoCo scenarios (rollouts, sum tree and noise, ALE state, frame buffer chunks) run in
#: .ci/run's step of long tests (pytest -m long), apart from the default run's 10 minutes, as do the grid's and
#: VecNormalize's scenarios below; the default run keeps DQN's six
LONG = {"ppo", "rainbow", "atari-dqn", "atari-rainbow", "atari-vector-dqn", "mujoco-ppo", "mujoco-sac"}


@pytest.mark.parametrize("algo, scenario", [pytest.param(a, s, marks=[pytest.mark.long] if a in LONG else [])
                                            for a, v in SCENARIOS.items() for s in v])
def test_a_killed_run_resumes_to_the_uninterrupted_result(batches, algo, scenario):
    reference, results = batches(algo)
    result = results[scenario]
    how = SCENARIOS[algo][scenario]
    assert result["codes"][-1] == 0, result["stderr"]
    if how == "SIGTERM":  # a clean stop: checkpoint at the next rollout start, exit 143, nothing else to repair
        assert result["codes"][0] == 128 + signal.SIGTERM, result["stderr"][0]
        assert "continue it with --resume (checkpoint at step" in result["stderr"][0]
    elif not isinstance(how, float):  # a kill point always fires (a seeded delay may come after the end)
        assert -signal.SIGKILL in result["codes"], result["codes"]
    assert all("Traceback" not in err for err in result["stderr"]), result["stderr"]
    if len(result["codes"]) > 1:
        said = result["stderr"][-1]  # (a seeded SIGKILL may land after the summary: the run finished)
        assert any(words in said for words in ("resuming at step", "starting at step 0", "the run finished already"))
    run_dir = result["run_dir"]
    assert differences(reference, run_dir) == []
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished" and not (run_dir / "checkpoint.pkl").exists()
    assert not (run_dir / "replay").exists()  # the frame chunks go with the checkpoint
    assert not list(run_dir.glob("*.tmp"))  # a torn checkpoint write leaves nothing behind after the resume


def test_resume_refuses_a_checkpoint_of_another_config_and_a_corrupt_one(tmp_path):
    killed = _run(_cmd("dqn", tmp_path), "checkpoint.after_rename:1")
    assert killed.returncode == -signal.SIGKILL
    run_dir = _run_dir(tmp_path)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    with open(run_dir / "checkpoint.pkl", "rb") as f:  # a checkpoint taken with another discount
        state = pickle.load(f)
    state["config"] = {**state["config"], "gamma": 0.5}
    with open(run_dir / "checkpoint.pkl", "wb") as f:
        pickle.dump(state, f)
    refused = _run(_cmd("dqn", tmp_path, "--resume"))
    assert refused.returncode == 2 and "taken with another config (differs in gamma)" in refused.stderr
    assert "Traceback" not in refused.stderr
    (run_dir / "checkpoint.pkl").write_bytes(b"\x80\x05garbage")
    corrupt = _run(_cmd("dqn", tmp_path, "--resume"))
    assert corrupt.returncode == 2 and "corrupt or truncated checkpoint" in corrupt.stderr
    assert config == yaml.safe_load((run_dir / "config.yaml").read_text())  # a refused resume changes nothing


def test_resume_leaves_a_finished_run_alone_and_starts_a_run_without_checkpoint(tmp_path):
    killed = _run(_cmd("dqn", tmp_path, "--checkpoint-every", "0"), "runlog.mid_record:5")
    assert killed.returncode == -signal.SIGKILL
    fresh = _run(_cmd("dqn", tmp_path, "--resume"))
    assert fresh.returncode == 0 and "no checkpoint to resume from; starting at step 0" in fresh.stderr
    again = _run(_cmd("dqn", tmp_path, "--resume"))
    assert again.returncode == 0 and "the run finished already" in again.stderr
    assert json.loads(again.stdout)["status"] == "finished"


def test_resume_keeps_a_finished_run_only_if_it_was_made_with_this_config(tmp_path):
    """A finished summary counts only beside a config.yaml of the same config (output settings aside): a folder
    finished with another one (a stale run stopped before its files were replaced) is redone, not kept."""
    from agents.lifecycle import RunFolder
    from agents.rl.run import _start

    config = {"algo": "dqn", "n_timesteps": 100, "probe_every": 50, "progress": False}
    (tmp_path / "summary.json").write_text(json.dumps({"status": "finished", "steps": 100}))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**config, "progress": True}))
    assert _start(RunFolder(tmp_path, config, resume=True)) == (None, {"status": "finished", "steps": 100})
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**config, "probe_every": 100}))
    assert _start(RunFolder(tmp_path, config, resume=True)) == (None, None)
    assert not (tmp_path / "summary.json").exists() and yaml.safe_load((tmp_path / "config.yaml").read_text()) == config


def test_an_env_checkpoints_cannot_hold_is_refused_with_the_way_out():
    from agents.rl.checkpoint import CheckpointError, check_picklable

    class Emulator:  # an env holding something that does not pickle
        def __reduce__(self):
            raise TypeError("cannot pickle '_abc._abc_data' object")

    with pytest.raises(CheckpointError, match="--checkpoint-every 0"):
        check_picklable(Emulator(), "MyEnv-v0")


def test_an_env_that_would_pickle_as_a_fresh_one_is_refused_and_mujoco_carries_its_simulation():
    """Gymnasium's EzPickle envs (MuJoCo, ALE, Box2D) unpickle as new envs; without a wrapper carrying their state
    a checkpoint would restart them silently. MuJoCo's, as make_env builds it, continues exactly."""
    import pickle

    from stable_baselines3.common.env_util import make_vec_env

    from agents.rl.checkpoint import CheckpointError, check_picklable
    from agents.rl.envs import make_env

    with pytest.raises(CheckpointError, match="EzPickle.*--checkpoint-every 0"):
        check_picklable(make_vec_env("Hopper-v4", n_envs=1, seed=0), "Hopper-v4")
    from agents.rl.checkpoint import _restore_env

    written_before = pickle.loads(pickle.dumps({"wrappers": [], "base": make_vec_env("Hopper-v4", n_envs=1, seed=0)}))
    with pytest.raises(CheckpointError, match="did not keep its environment's state"):  # (an older checkpoint's env)
        _restore_env(written_before)
    env = make_env("Hopper-v4", seed=0)
    check_picklable(env, "Hopper-v4")
    env.reset()
    rng = np.random.default_rng(0)
    for _ in range(30):
        env.step(rng.uniform(-1, 1, (1, 3)))
    copy = pickle.loads(pickle.dumps(env.envs[0]))
    for _ in range(400):  # past episode ends: the reset noise comes from the env's np_random
        action = rng.uniform(-1, 1, 3)
        a, b = env.envs[0].step(action), copy.step(action)
        assert np.array_equal(a[0], b[0]) and a[1:4] == b[1:4]
        if a[2] or a[3]:
            assert np.array_equal(env.envs[0].reset()[0], copy.reset()[0])


@pytest.mark.long
def test_the_grid_resumes_killed_runs(tmp_path):
    """Both workers of a grid killed after their second checkpoint; ``--resume`` finishes both, and seed 0 equals
    the DQN reference run of the CLI (same config, same run folder name)."""
    grid = tmp_path / "grid.yml"
    fixed = {"env": "CartPole-v1", "net_arch": [16], "n_timesteps": 1000, "learning_starts": 100,
             "probe": ["gradcov", "weights", "sparsity"], "probe_every": 200, "checkpoint_every": 250}
    grid.write_text(yaml.safe_dump({"command": "dqn", "fixed": fixed, "grids": [{"seed": [0, 1]}]}))
    args = [sys.executable, "-m", "agents.grid", str(grid), "--out", str(tmp_path / "runs"), "--workers", "2"]
    killed = _run(args, "checkpoint.after_rename:2")
    assert killed.returncode != 0
    assert _run([*args, "--dry-run"]).stdout.count("todo") == 2
    resumed = _run([*args, "--resume"])
    assert resumed.returncode == 0 and "2 finished" in resumed.stderr, resumed.stderr
    assert _run(_cmd("dqn", tmp_path / "reference")).returncode == 0
    reference = _run_dir(tmp_path / "reference")
    grid_run = tmp_path / "runs" / reference.relative_to(reference.parents[4])
    assert grid_run.name == "seed0" and differences(reference, grid_run) == []


@pytest.mark.long
def test_normalisation_statistics_resume_exactly(tmp_path):
    """SAC with observations normalised by running statistics (VecNormalize, the authors' MuJoCo set-up): the
    statistics travel in the checkpoint (with the env), so a killed and resumed run equals an uninterrupted one;
    the fixed probe inputs are normalised as the network sees them."""
    args = ["sac", "--env", "Pendulum-v1", "--hidden", "16", "--steps", "600", "--set", "learning_starts=100",
            "--set", "normalize_obs=true", "--probe", "gradcov,ntk", "--probe-every", "150", "--checkpoint-every",
            "200", "--no-progress"]
    ref = _run([sys.executable, "-m", "agents.train", *args, "--out", str(tmp_path / "ref")])
    assert ref.returncode == 0, ref.stderr
    killed = _run([sys.executable, "-m", "agents.train", *args, "--out", str(tmp_path / "run")],
                  "checkpoint.after_rename:2")
    assert killed.returncode == -signal.SIGKILL
    resumed = _run([sys.executable, "-m", "agents.train", *args, "--out", str(tmp_path / "run"), "--resume"])
    assert resumed.returncode == 0 and "resuming at step 400" in resumed.stderr, resumed.stderr
    assert differences(_run_dir(tmp_path / "ref"), _run_dir(tmp_path / "run")) == []
    inputs = read_run(_run_dir(tmp_path / "ref") / "run.h5").probes["inputs"]["x"][0]
    assert np.abs(inputs.mean(axis=0)).max() < 1.5  # normalised, not Pendulum's raw angular velocity (up to 8)
