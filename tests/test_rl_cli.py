"""``python -m agents.train {dqn,ppo,sac}``: config resolution, errors, run directories, tiny training runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from agents.commands import get_command
from agents.errors import ConfigError
from agents.grid import load_grid, plan
from agents.rl.config import hyperparams, resolve
from agents.train import main
from runlog import read_run

ROOT = Path(__file__).resolve().parents[1]


def _train(args: list[str], status: int = 0) -> dict:
    """Run the CLI in this process; returns the printed summary."""
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(args) == status
    return json.loads(buf.getvalue())


def _error(capsys, args: list[str]) -> str:
    """stderr of a command line refused with exit status 2 (argparse's exit, or main's status)."""
    try:
        status = main(args)
    except SystemExit as exc:
        status = exc.code
    assert status == 2
    return capsys.readouterr().err


# --- configuration ------------------------------------------------------------------------------------------


def test_yaml_defaults_are_the_papers_classic_dqn():
    c = resolve("dqn", {"env": "MountainCar-v0"})
    assert c["act"] == "elephant" and c["act_kwargs"] == {"d": 4, "h": 1, "a": 0.2}
    assert c["sigma_bias"] == 0.4 and c["layer_norm"] is True and c["net_arch"] == [1000]
    assert (c["td_loss"], c["max_grad_norm"], c["optimizer"], c["optimizer_kwargs"]["alpha"]) == ("mse", None, "rmsprop", 0.999)
    assert (c["batch_size"], c["train_freq"], c["gradient_steps"], c["gamma"]) == (32, 1, 1, 0.99)
    assert (c["learning_starts"], c["exploration_steps"], c["exploration_final_eps"]) == (1000, 1000, 0.01)
    assert (c["target_update_interval"], c["buffer_size"]) == (100, 10000)
    assert (c["n_timesteps"], c["max_episode_steps"]) == (50000, 1000)
    per_env = {env: resolve("dqn", {"env": env}) for env in ("Acrobot-v1", "Catcher-PLE-v0", "Pixelcopter-PLE-v0")}
    assert per_env["Acrobot-v1"]["n_timesteps"] == 30000
    assert (per_env["Catcher-PLE-v0"]["n_timesteps"], per_env["Catcher-PLE-v0"]["max_episode_steps"],
            per_env["Catcher-PLE-v0"]["target_update_interval"]) == (500000, 2000, 200)
    assert per_env["Catcher-PLE-v0"]["learning_rate"] == 3e-5  # the study's choice (agents/grids/ple_study.yml)
    assert (per_env["Pixelcopter-PLE-v0"]["n_timesteps"], per_env["Pixelcopter-PLE-v0"]["max_episode_steps"],
            per_env["Pixelcopter-PLE-v0"]["target_update_interval"]) == (1000000, 500, 200)
    assert set(hyperparams("dqn")) >= {"default", "atari", "MountainCar-v0", "Acrobot-v1", "Catcher-PLE-v0",
                                       "Pixelcopter-PLE-v0"}


def test_atari_defaults():
    c = resolve("dqn", {"env": "ALE/Amidar-v5", "act": "elephant"})
    assert c["act_kwargs"] == {"d": 4, "h": 1, "a": 0.1} and c["sigma_bias"] == 2.0
    assert (c["optimizer"], c["learning_rate"], c["optimizer_kwargs"]) == ("adam", 1e-4, {})
    assert c["derived"]["cnn"] and c["derived"]["observation_shape"] == [4, 84, 84]
    assert c["derived"]["features"] == 512 and c["derived"]["hidden"] == {"q": []}
    assert c["env_kwargs"]["repeat_action_probability"] == 0.0


def test_flags_override_yaml_and_config_file(tmp_path):
    cmd = get_command("dqn")
    c = cmd.make_config({"env": "Acrobot-v1", "lr": 3e-4, "buffer_size": 300, "steps": 1234, "act": "relu"})
    assert (c["learning_rate"], c["buffer_size"], c["n_timesteps"], c["act"]) == (3e-4, 300, 1234, "relu")
    assert c["target_update_interval"] == 100  # untouched YAML value
    cfg = tmp_path / "my.yml"
    cfg.write_text("learning_rate: 1e-4\ntarget_update_interval: 250\nact_kwargs: {a: 0.3}\nbuffer_size: 32\n")
    c = cmd.make_config({"config": str(cfg)})
    assert (c["learning_rate"], c["target_update_interval"], c["buffer_size"]) == (1e-4, 250, 32)
    assert c["act_kwargs"] == {"d": 4, "h": 1, "a": 0.3}
    c = cmd.make_config({"config": str(cfg), "lr": 1e-2, "a": 0.5, "set": ["target_update_interval=7", "d=8"]})
    assert (c["learning_rate"], c["target_update_interval"]) == (1e-2, 7)
    assert c["act_kwargs"] == {"d": 8, "h": 1, "a": 0.5}
    # a run's config.yaml works as --config and resolves to the same config
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(c))
    assert cmd.make_config({"config": str(saved)}) == c


def test_run_directories():
    cmd = get_command("dqn")
    out = Path("OUT")
    c = cmd.make_config({"env": "MountainCar-v0", "act": "elephant", "seed": 3})
    assert cmd.run_dir(c, out) == out / "dqn" / "MountainCar-v0" / "elephant" / "seed3"
    c = cmd.make_config({"env": "MountainCar-v0", "act": "relu", "lr": 1e-3, "buffer_size": 32, "probe": "gradcov"})
    assert cmd.run_dir(c, out) == out / "dqn" / "MountainCar-v0" / "relu" / "buffer_size=32,learning_rate=0.001" / "seed0"
    assert c["learning_rate"] == 1e-3 and cmd.make_config({"env": "MountainCar-v0"})["learning_rate"] == 3e-4
    c = cmd.make_config({"env": "ALE/Amidar-v5", "act": "elephant", "a": 0.2})
    assert cmd.run_dir(c, out) == out / "dqn" / "ALE-Amidar-v5" / "elephant" / "a=0.2" / "seed0"


def test_classic_grid_plans_unique_runs(tmp_path):
    runs = plan(load_grid(ROOT / "agents" / "grids" / "classic.yml"), tmp_path)
    assert len(runs) == 2 * 2 * 3 * 3 * 3
    assert len({r.run_dir for r in runs}) == len(runs)
    envs = {r.config["env"] for r in runs}
    assert envs == {"MountainCar-v0", "Acrobot-v1"}
    assert {r.config["buffer_size"] for r in runs} == {32, 1000, 10000}
    assert {r.config["act"] for r in runs} == {"elephant", "relu"}


@pytest.mark.parametrize("args, message", [
    (["dqn", "--env", "NoSuchEnv-v0"], "unknown environment 'NoSuchEnv-v0'"),
    (["dqn", "--act", "swish"], "unknown activation 'swish'; choose one of"),
    (["dqn", "--act", "relu", "--d", "4"], "activation 'relu' does not take d; it takes no arguments"),
    (["dqn", "--act", "maxout", "--a", "0.1"], "activation 'maxout' does not take a; it takes k"),
    (["dqn", "--lr", "-0.001"], "learning_rate must be a number > 0, got -0.001"),
    (["dqn", "--steps", "-5"], "n_timesteps must be an integer from 1 to 10,000,000,000,000, got -5"),
    (["dqn", "--buffer-size", "0"], "buffer_size must be an integer >= 1"),
    (["dqn", "--env", "Pendulum-v1"], "dqn needs discrete actions"),
    (["sac", "--env", "CartPole-v1"], "sac needs continuous (Box) actions"),
    (["ppo", "--lr", "0"], "learning_rate must be a number > 0"),
    (["dqn", "--probe", "gradcov,bogus"], "unknown probe bogus"),
    (["dqn", "--set", "no_such_key=1"], "unknown dqn settings ['no_such_key']"),
    (["dqn", "--config", "/nonexistent/c.yml"], "config file /nonexistent/c.yml: no such file"),
    (["dqn", "--act", "elephant", "--a", "-1"], "a must be a positive finite number"),
    (["dqn", "--set", "policy_kwargs={foo: 1}"], "policy_kwargs: the dqn policy does not take ['foo']"),
    (["ppo", "--set", "policy_kwargs={net_arch: [8]}"], "policy_kwargs ['net_arch'] come from the config; set net_arch"),
    (["dqn", "--set", "exploration_fraction=0.5", "--set", "exploration_steps=100"],
     "set exploration_steps (absolute) or exploration_fraction (of the run), not both"),
])
def test_config_errors_exit_2_with_a_message(capsys, tmp_path, args, message):
    err = _error(capsys, [*args, "--out", str(tmp_path)])
    assert message in err
    assert "Traceback" not in err
    assert not any(tmp_path.iterdir())  # nothing was run


def test_cli_error_exit_code_in_a_subprocess(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "agents.train", "dqn", "--act", "relu", "--k", "5", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "activation 'relu' does not take k" in proc.stderr and "Traceback" not in proc.stderr


# --- training runs ------------------------------------------------------------------------------------------


def _check_run(run_dir: Path, steps: int) -> dict:
    for name in ("run.h5", "config.yaml", "model.zip", "summary.json"):
        assert (run_dir / name).is_file(), name
    run = read_run(run_dir / "run.h5")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert run.config["algo"] == config["algo"] and run.config["act"] == config["act"]
    assert run.seed == config["seed"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps and summary["status"] == "finished"
    assert run.scalars["run_end"][0].tolist() == [steps] and run.scalars["run_end"][1].tolist() == [0]  # finished
    return {"run": run, "config": config, "summary": summary}


@pytest.mark.parametrize("act", ["elephant", "relu"])
def test_tiny_dqn_run_with_probes(tmp_path, act):
    summary = _train(["dqn", "--env", "CartPole-v1", "--act", act, "--hidden", "64", "--steps", "400",
                      "--set", "learning_starts=100", "--set", "exploration_steps=100",
                      "--probe", "gradcov,sparsity,weights", "--probe-every", "200", "--out", str(tmp_path)])
    tag = "exploration_steps=100,learning_starts=100,n_timesteps=400,net_arch=64"
    run_dir = tmp_path / "dqn" / "CartPole-v1" / act / tag / "seed0"
    assert summary["run_dir"] == str(run_dir)
    r = _check_run(run_dir, 400)
    run = r["run"]
    assert len(run.scalars["episode_return"][1]) == summary["episodes"] > 0
    assert len(run.scalars["loss"][1]) > 0 and np.all(np.isfinite(run.scalars["loss"][1]))
    assert list(run.probes["gradcov"]["step"]) == [200, 400]
    td = run.probes["gradcov"]["td"]
    assert td.shape == (2, 32, 32)
    np.testing.assert_allclose(np.diagonal(td, axis1=1, axis2=2), 1.0, atol=1e-4)
    assert summary["final_return"] == pytest.approx(np.mean(run.scalars["episode_return"][1][-max(1, int(np.ceil(0.1 * summary["episodes"]))):]))


def test_run_without_probes_still_logs_episode_returns(tmp_path, monkeypatch):
    temp = tmp_path / "temp"  # SB3's default logger would leave an empty SB3-<date> folder here per run
    temp.mkdir()
    monkeypatch.delenv("SB3_LOGDIR", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(temp))
    summary = _train(["dqn", "--env", "CartPole-v1", "--act", "elephant", "--hidden", "32", "--steps", "300",
                      "--set", "learning_starts=50", "--out", str(tmp_path / "runs")])
    r = _check_run(Path(summary["run_dir"]), 300)
    assert len(r["run"].scalars["episode_return"][1]) == summary["episodes"] > 0
    assert r["run"].probes.keys() <= {"inputs"}
    assert [p.name for p in temp.iterdir() if p.name.startswith("SB3-")] == []


@pytest.mark.parametrize("act", ["elephant", "relu"])
def test_tiny_ppo_run(tmp_path, act):
    summary = _train(["ppo", "--env", "CartPole-v1", "--act", act, "--hidden", "32", "--steps", "512",
                      "--set", "n_envs=1", "--set", "n_steps=256", "--set", "n_epochs=2", "--batch-size", "64",
                      "--probe", "gradcov", "--probe-every", "256", "--out", str(tmp_path)])
    r = _check_run(Path(summary["run_dir"]), 512)
    assert set(r["run"].probes["gradcov"]) >= {"actor", "critic"}
    assert len(r["run"].scalars["episode_return"][1]) > 0


@pytest.mark.parametrize("act", ["elephant", "relu"])
def test_tiny_sac_run(tmp_path, act):
    summary = _train(["sac", "--env", "Pendulum-v1", "--act", act, "--hidden", "32,32", "--steps", "400",
                      "--set", "learning_starts=100", "--batch-size", "64", "--out", str(tmp_path)])
    r = _check_run(Path(summary["run_dir"]), 400)
    assert len(r["run"].scalars["episode_return"][1]) == 2  # Pendulum episodes last 200 steps
    assert np.all(np.isfinite(r["run"].scalars["critic_loss"][1]))


@pytest.mark.filterwarnings("ignore:`n_steps=3` is ignored")  # SB3 warns on load; the buffer keeps n_steps
def test_atari_dqn_elephant_with_gradcov_probe(tmp_path):
    """The user's command: python -m agents.train dqn --env ALE/Amidar-v5 --act elephant --probe gradcov, with a
    cadence (the Atari default probes only at the paper's points, beyond 300 steps)."""
    summary = _train(["dqn", "--env", "ALE/Amidar-v5", "--act", "elephant", "--probe", "gradcov", "--steps", "300",
                      "--probe-every", "30", "--set", "buffer_size=1000", "--out", str(tmp_path)])
    run_dir = tmp_path / "dqn" / "ALE-Amidar-v5" / "elephant" / "buffer_size=1000,n_timesteps=300" / "seed0"
    assert summary["run_dir"] == str(run_dir)
    r = _check_run(run_dir, 300)
    gradcov = r["run"].probes["gradcov"]
    assert len(gradcov["step"]) == 10 and gradcov["td"].shape[1:] == (32, 32)  # every 30 steps (a tenth)
    assert r["config"]["derived"]["cnn"]
    saved = json.loads((run_dir / "summary.json").read_text(), parse_constant=pytest.fail)  # strict JSON: no NaN
    assert saved["episodes"] == 0 and saved["final_return"] is None
    from agents.rl.dqn import PaperDQN
    from interference.activations import Elephant

    model = PaperDQN.load(run_dir / "model.zip", device="cpu")
    ext = model.q_net.features_extractor
    assert sum(isinstance(m, Elephant) for m in ext.modules()) == 1
    assert model.learning_rate == 1e-4 and model.replay_buffer_kwargs["n_steps"] == 3  # (the frame buffer's)


def test_nan_loss_stops_the_run_with_a_message(tmp_path, capsys):
    summary = _train(["dqn", "--env", "CartPole-v1", "--act", "relu", "--hidden", "32", "--steps", "3000",
                      "--lr", "1e30", "--set", "learning_starts=50", "--checkpoint-every", "20", "--out",
                      str(tmp_path)], status=1)
    assert summary["status"] == "nan" and summary["steps"] < 3000
    from reports.data import run_end

    assert run_end(read_run(Path(summary["run_dir"]) / "run.h5")) == "nan"
    err = capsys.readouterr().err
    assert "the training loss became" in err and "stopping the run" in err
    run = read_run(Path(summary["run_dir"]) / "run.h5")
    assert run.config["learning_rate"] == 1e30
    assert (Path(summary["run_dir"]) / "model.zip").is_file()
    assert not (Path(summary["run_dir"]) / "checkpoint.pkl").exists()  # the run ended: nothing to resume


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_cleanly_with_model_and_log_saved(tmp_path, sig):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "agents.train", "dqn", "--env", "CartPole-v1", "--act",
                             "elephant", "--hidden", "32", "--steps", "1000000", "--out", str(tmp_path)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    run_dir = tmp_path / "dqn" / "CartPole-v1" / "elephant" / "n_timesteps=1000000,net_arch=32" / "seed0"
    deadline = time.time() + 90
    while not (run_dir / "run.h5").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(1.5)  # some training steps
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert "interrupted at step" in err and "model and log saved" in err and "Traceback" not in err
    run = read_run(run_dir / "run.h5")
    assert len(run.scalars["episode_return"][1]) > 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 0 < summary["steps"] < 1000000
    assert run.scalars["run_end"][0].tolist() == [summary["steps"]] and run.scalars["run_end"][1].tolist() == [1]
    from agents.rl.dqn import PaperDQN

    assert PaperDQN.load(run_dir / "model.zip").num_timesteps == summary["steps"]


def test_misspelled_flag_names_the_command_and_the_nearest_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["dqn", "--setps", "5"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "usage: python -m agents.train dqn" in err
    assert "unrecognized arguments: --setps 5 (did you mean --steps?)" in err


def test_unwritable_out_exits_2_with_a_message(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    err = _error(capsys, ["dqn", "--env", "CartPole-v1", "--steps", "10", "--out", str(blocker)])
    assert "cannot create the run directory" in err and "Traceback" not in err


def test_exploration_fraction_replaces_the_absolute_schedule():
    assert resolve("dqn", {})["exploration_steps"] == 1000
    c = resolve("dqn", {"set": ["exploration_fraction=0.5"]})
    assert c["exploration_steps"] is None and c["exploration_fraction"] == 0.5


def test_saved_config_reused_with_another_activation(tmp_path):
    """A run's config.yaml with --act X: the file's activation settings (arguments, LayerNorm, bias spread) belong
    to its own activation and give way to X's defaults; everything else is kept."""
    for source, other in (("elephant", "relu"), ("relu", "elephant")):
        extra = {"d": 8} if source == "elephant" else {}
        saved = resolve("dqn", {"env": "CartPole-v1", "act": source, "lr": 3e-4, **extra})
        path = tmp_path / f"{source}.yaml"
        path.write_text(yaml.safe_dump(saved))
        reused = resolve("dqn", {"config": str(path), "act": other})
        fresh = resolve("dqn", {"env": "CartPole-v1", "act": other, "lr": 3e-4})
        assert reused == fresh
    assert resolve("dqn", {"config": str(tmp_path / "elephant.yaml")})["act_kwargs"]["d"] == 8


def test_config_error_class_is_the_commands_one():
    with pytest.raises(ConfigError):
        resolve("dqn", {"act": "nope"})


def test_each_algorithm_is_declared_once_with_a_complete_schema():
    """Every SB3 constructor key an algorithm passes is a setting of its schema; every setting has a check and a
    help line; every key of its hyper-parameter file is a setting (resolve refuses unknown keys too)."""
    import dataclasses

    from agents.rl.algos import ALGOS
    from agents.rl.settings import checks

    for name, spec in ALGOS.items():
        keys = checks(spec.settings)
        assert set(spec.sb3_keys) <= set(keys), name
        assert all(f.metadata["help"] for f in dataclasses.fields(spec.settings))
        for entry, layer in hyperparams(name).items():
            assert set(layer or {}) <= set(keys), (name, entry)


@pytest.mark.parametrize("args", [
    ["ppo", "--env", "CartPole-v1", "--hidden", "32", "--set", "n_steps=64", "--batch-size", "32"],
    ["sac", "--env", "Pendulum-v1", "--hidden", "32,32", "--set", "learning_starts=50", "--batch-size", "32"],
    # MuJoCo with the paper's settings (PPO: normalised observations and rewards; SAC: FTA on the last layer only)
    ["ppo", "--env", "Hopper-v4", "--hidden", "32", "--set", "n_steps=64", "--batch-size", "32"],
    ["sac", "--env", "Hopper-v4", "--act", "fta", "--hidden", "32,32", "--set", "learning_starts=50", "--batch-size",
     "32"],
])
def test_ppo_and_sac_divergence_ends_the_run_like_dqn(tmp_path, capsys, args):
    """A huge learning rate: SB3 raises inside a torch distribution (NaN or overflowing outputs); the run ends as
    diverged with a one-line message, exit status 1, a run_end record, the model and the summary."""
    from reports.data import run_end

    summary = _train([*args, "--lr", "1e6", "--steps", "2000", "--no-progress", "--out", str(tmp_path)], status=1)
    assert summary["status"] == "nan" and summary["steps"] < 2000
    err = capsys.readouterr().err
    assert "became non-finite" in err and "try a smaller learning rate" in err and "tensor(" not in err
    run_dir = Path(summary["run_dir"])
    assert run_end(read_run(run_dir / "run.h5")) == "nan"
    assert (run_dir / "model.zip").exists() and (run_dir / "summary.json").exists()


def test_an_unwritable_run_directory_is_an_exit_2_message(tmp_path, capsys, monkeypatch):
    """An existing run folder where files cannot be created (read-only file system, permissions: root bypasses
    chmod, so the failure is injected where the CLI probes the folder) stops before training with exit status 2."""
    import tempfile

    real = tempfile.TemporaryFile

    def refuse(*args, dir=None, **kwargs):
        if dir is not None and str(dir).startswith(str(tmp_path)):
            raise OSError(30, "Read-only file system")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    err = _error(capsys, ["dqn", "--env", "CartPole-v1", "--steps", "100", "--out", str(tmp_path)])
    assert "cannot write in the run directory" in err and "Read-only file system" in err


def test_sb3_logger_outputs_on_request(tmp_path):
    """--sb3-log csv: SB3's own progress.csv beside the run log, with its standard keys; unknown formats and a
    missing TensorBoard are clear errors."""
    import csv
    import importlib.util

    from agents.commands import get_command
    from agents.errors import ConfigError
    from agents.rl.run import train

    cmd = get_command("ppo")
    config = cmd.make_config({"env": "CartPole-v1", "steps": 512, "hidden": "16", "sb3_log": "csv", "progress": False,
                              "checkpoint_every": 0})
    run_dir = cmd.run_dir(config, tmp_path)
    train(config, run_dir)
    rows = list(csv.DictReader((run_dir / "sb3" / "progress.csv").open()))
    assert len(rows) == 2 and {"rollout/ep_rew_mean", "time/total_timesteps"} <= set(rows[0])
    with pytest.raises(ConfigError, match="unknown: tensorbored"):
        cmd.make_config({"sb3_log": "csv,tensorbored"})
    if importlib.util.find_spec("tensorboard") is None:
        with pytest.raises(ConfigError, match=r"pip install -e '\.\[tensorboard\]'"):
            cmd.make_config({"sb3_log": "tensorboard"})
