"""Atari at the paper's scale: the authors' settings, the frame buffer inside SB3's DQN and ours, memory
refusal, scaled gradient-covariance points, evaluation apart from training, and smoke runs of DQN and Rainbow with
their gradient-covariance figure."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from stable_baselines3 import DQN
from stable_baselines3.common.buffers import NStepReplayBuffer

from agents.errors import ConfigError
from agents.rl.budget import check_memory, replay_bytes
from agents.rl.config import probe_arguments, resolve
from agents.rl.envs import make_env
from agents.rl.frame_buffer import FrameReplayBuffer
from agents.rl.run import build_env, build_eval_env
from runlog import read_run

ROOT = Path(__file__).resolve().parents[1]

#: the authors' configs/atari_dqn.json and atari_rainbow.json (qlan3/Elephant), in agent steps
AUTHORS = {
    "dqn": {"n_timesteps": 12_500_000, "buffer_size": 1_000_000, "n_steps": 3, "batch_size": 32, "train_freq": 10,
            "gradient_steps": 1, "target_update_interval": 5000, "exploration_initial_eps": 1.0,
            "exploration_final_eps": 0.05, "exploration_steps": 1_000_000, "learning_rate": 1e-4, "gamma": 0.99,
            "optimizer": "adam", "td_loss": "mse", "max_grad_norm": None, "n_envs": 1, "frame_stack": 4,
            "eval_every": 100_000, "eval_episodes": 5},
    "rainbow": {"learning_rate": 6.25e-5, "n_atoms": 51, "v_min": -10.0, "v_max": 10.0, "noisy_std": 0.1,
                "per_alpha": 0.5, "per_beta0": 0.4, "per_beta_steps": 5_000_000, "buffer_size": 1_000_000,
                "n_steps": 3, "train_freq": 10, "target_update_interval": 5000, "exploration_final_eps": 0.05,
                "exploration_steps": 1_000_000, "eval_every": 100_000, "eval_episodes": 5},
}


@pytest.mark.parametrize("algo", ["dqn", "rainbow"])
def test_the_authors_atari_settings(algo):
    c = resolve(algo, {"env": "ALE/Amidar-v5", "act": "elephant"})
    assert {k: c[k] for k in AUTHORS[algo]} == AUTHORS[algo]
    assert c["replay"] == "frames" and c["env_kwargs"]["repeat_action_probability"] == 0.0
    assert c["policy_kwargs"] == {"normalize_images": False}  # unscaled 0..255 observations, as theirs
    assert c["act_kwargs"] == {"d": 4, "h": 1, "a": 0.1} and c["derived"]["features"] == 512
    assert probe_arguments(c, "gradcov") == {"at": [200_000, 6_200_000, 12_200_000], "k": 32, "every": None}
    if algo == "dqn":
        assert c["sigma_bias"] == 2.0 and not c.get("double_q", False)
    else:
        assert c["double_q"] and c["noisy"] and c["prioritized"] and c["distributional"] and c["dueling"]


def test_scaled_gradcov_points_and_explicit_cadence():
    c = resolve("dqn", {"env": "ALE/Amidar-v5", "n_timesteps": 1000, "scale_probe_at": True})
    assert c["scale_probe_at"] == 12_500_000
    assert probe_arguments(c, "gradcov")["at"] == [16, 496, 976]  # 0.8M, 24.8M, 48.8M frames of 50M, scaled
    again = resolve("dqn", {"env": "ALE/Amidar-v5", "n_timesteps": 1000, "scale_probe_at": c["scale_probe_at"]})
    assert probe_arguments(again, "gradcov")["at"] == [16, 496, 976]  # a saved config is not scaled twice
    flag = resolve("dqn", {"env": "ALE/Amidar-v5", "probe_every": 300})
    assert probe_arguments(flag, "gradcov")["every"] == 300  # --probe-every beats the YAML's 0


def test_memory_is_checked_before_the_buffer_is_allocated():
    env = build_env(resolve("dqn", {"env": "ALE/Breakout-v5"}))
    try:
        frames = replay_bytes(resolve("dqn", {"env": "ALE/Breakout-v5"}), env.observation_space, env.action_space)
        full = replay_bytes(resolve("dqn", {"env": "ALE/Breakout-v5", "replay": "full"}), env.observation_space,
                            env.action_space)
        assert frames < 8e9 < 50e9 < full  # 1e6 transitions: ~7.5 GB of frames vs ~56 GB of whole stacks
        with pytest.raises(ConfigError, match=r"needs 746 GB .* lower buffer_size"):
            check_memory(resolve("dqn", {"env": "ALE/Breakout-v5", "buffer_size": 10 ** 8}), env)
    finally:
        env.close()


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with zipfile.ZipFile(path) as z:
        state = torch.load(io.BytesIO(z.read("policy.pth")), weights_only=False)
    return state


def test_sb3_dqn_trains_identically_with_the_frame_buffer(tmp_path):
    """SB3's own DQN, given FrameReplayBuffer through replay_buffer_class, takes exactly the steps and updates it
    takes with its NStepReplayBuffer (same draws, same samples)."""
    weights = []
    for cls in (NStepReplayBuffer, FrameReplayBuffer):
        env = make_env("ALE/Breakout-v5", seed=3, max_episode_steps=400)
        model = DQN("CnnPolicy", env, buffer_size=500, learning_starts=50, train_freq=8, batch_size=8, seed=3,
                    replay_buffer_class=cls, replay_buffer_kwargs={"n_steps": 3, "gamma": 0.99},
                    policy_kwargs={"net_arch": [16], "features_extractor_kwargs": {"features_dim": 32}},
                    device="cpu")
        model.learn(400)
        assert isinstance(model.replay_buffer, cls)
        model.save(tmp_path / cls.__name__)
        weights.append(_tensors(tmp_path / f"{cls.__name__}.zip"))
        env.close()
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_the_eval_env_plays_whole_games_with_real_scores():
    c = resolve("dqn", {"env": "ALE/Breakout-v5"})
    env = build_eval_env(c, seed=0)
    try:
        wrapper = env.venv.envs[0].env  # PicklableEmulator -> AtariWrapper
        names = []
        while hasattr(wrapper, "env"):
            names.append(type(wrapper).__name__)
            wrapper = wrapper.env
        assert "EpisodicLifeEnv" not in names and "ClipRewardEnv" not in names
    finally:
        env.close()
    train = build_env(c)
    try:
        wrapper, names = train.venv.envs[0].env, []
        while hasattr(wrapper, "env"):
            names.append(type(wrapper).__name__)
            wrapper = wrapper.env
        assert "EpisodicLifeEnv" in names and "ClipRewardEnv" in names
    finally:
        train.close()


def _train(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agents.train", *args, "--no-progress"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_evaluation_does_not_change_training(tmp_path):
    base = ["dqn", "--env", "CartPole-v1", "--hidden", "16", "--steps", "1500", "--set", "learning_starts=100"]
    with ThreadPoolExecutor(2) as pool:
        plain, evaluated = pool.map(_train, [[*base, "--out", str(tmp_path / "a")],
                                             [*base, "--set", "eval_every=500", "--set", "eval_episodes=2", "--out",
                                              str(tmp_path / "b")]])
    assert plain.returncode == 0 and evaluated.returncode == 0, evaluated.stderr
    a, b = (Path(json.loads(p.stdout)["run_dir"]) for p in (plain, evaluated))
    wa, wb = _tensors(a / "model.zip"), _tensors(b / "model.zip")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    steps, returns = read_run(b / "run.h5").scalars["eval_return"]
    assert steps.tolist() == [500, 500, 1000, 1000, 1500, 1500] and np.all(returns > 0)
    assert json.loads(evaluated.stdout)["last_eval"]["step"] == 1500
    assert len(read_run(a / "run.h5").scalars["eval_return"][0]) == 0


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> Path:
    """DQN with Elephant and Rainbow with ReLU, 1250 steps of Breakout each with the paper's gradient-covariance
    points scaled to the run, evaluations every 625 steps (games cut at 2000 frames), a 1000-transition frame
    buffer."""
    out = tmp_path_factory.mktemp("atari")
    common = ["--env", "ALE/Breakout-v5", "--steps", "1250", "--buffer-size", "1000", "--scale-probe-at", "--set",
              "eval_every=625", "--set", "eval_episodes=1", "--set", "max_episode_steps=2000", "--threads", "1", "--out", str(out)]
    cmds = [[algo, "--act", act, *common] for algo, act in (("dqn", "elephant"), ("rainbow", "relu"))]
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(_train, cmds))
    for cmd, proc in zip(cmds, done):
        assert proc.returncode == 0, (cmd, proc.stderr[-2000:])
        assert "replay buffer of 1,000 transitions" in proc.stderr and "peak memory about" in proc.stderr
    return out


@pytest.mark.long  # (.ci/run's step of long tests)
def test_atari_smoke_runs_log_gradcov_at_the_scaled_points_and_evaluations(smoke):
    logs = sorted(smoke.rglob("run.h5"))
    assert len(logs) == 2
    for path in logs:
        run = read_run(path)
        first, *rest = run.probes["gradcov"]["step"].tolist()  # (the first waits for 32 stored transitions)
        assert 20 <= first <= 40 and rest == [620, 1220]
        assert run.probes["gradcov"]["td"].shape == (3, 32, 32)  # (Rainbow's "td" loss: the cross-entropy)
        assert run.scalars["eval_return"][0].tolist() == [625, 1250]
        summary = json.loads((path.parent / "summary.json").read_text())
        assert summary["status"] == "finished" and summary["steps_per_second"] > 0


@pytest.mark.long  # (.ci/run's step of long tests)
def test_atari_report_draws_the_papers_gradcov_figure(smoke, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "reports.atari", str(smoke), "-o", str(tmp_path / "report")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for algo in ("dqn", "rainbow"):
        assert (tmp_path / "report" / f"{algo}_ALE-Breakout-v5_gradcov.png").is_file()
        assert (tmp_path / "report" / f"{algo}_ALE-Breakout-v5_returns.png").is_file()
    assert "elephant" in proc.stdout and "relu" in proc.stdout


def test_the_c_plus_plus_vector_env_is_a_setting_for_atari_only():
    c = resolve("dqn", {"env": "ALE/Breakout-v5", "atari_env": "ale-vector"})
    assert c["atari_env"] == "ale-vector" and c["derived"]["observation_shape"] == [4, 84, 84]
    with pytest.raises(ConfigError, match="atari_env: ale-vector is for Atari ids .*, not CartPole-v1"):
        resolve("dqn", {"env": "CartPole-v1", "atari_env": "ale-vector"})
    with pytest.raises(ConfigError, match=r"leave env_kwargs, atari_wrapper_kwargs and frame_stack as they are \(got "
                                          r"env_kwargs \{'full_action_space': True\}"):
        resolve("dqn", {"env": "ALE/Breakout-v5", "atari_env": "ale-vector", "env_kwargs": {"full_action_space": True}})
    train, test = (env := build_env(c)), build_eval_env(c, seed=5)
    try:  # training: a lost life ends the learner's episode and rewards are clipped; testing: whole games
        assert train.games.train and not test.games.train
        assert train.reset().shape == (1, 4, 84, 84) and train.observation_space.shape == (4, 84, 84)
    finally:
        env.close()
        test.close()


def test_the_env_paths_comparison_runs(capsys):
    from agents.rl.bench_atari_envs import frame_differences, main

    same = frame_differences("breakout", 50, seed=0)
    assert same == {"differ": 0.0, "mean_abs": 0.0, "max_abs": 0}  # Breakout's palette grey is OpenCV's grey
    assert main(["--games", "Breakout", "--episodes", "2", "--frames", "20", "--json"]) == 0
    row, = json.loads(capsys.readouterr().out)
    assert row["game"] == "Breakout" and set(row) >= {"sb3", "ale-vector", "differ"}
