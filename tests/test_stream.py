import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from agents.lifecycle import execute
from agents.stream.commands import COMMANDS
from agents.stream.edit import EditConfig, edit
from agents.stream.learner import StreamConfig, train_stream
from agents.stream.srnn import set_kl_penalty
from runlog import read_run

ROOT = Path(__file__).resolve().parents[1]
TINY = {"n": 20, "n_test": 50, "width": 64}


def run_cli(*args, timeout=120):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_seeds_side_by_side_equal_lone_runs():
    both = train_stream(StreamConfig(act="elephant", lr=1e-3, seeds=(0, 1), **TINY))
    alone = train_stream(StreamConfig(act="elephant", lr=1e-3, seeds=(1,), **TINY))
    assert both.test_mse.shape == (2, 20)
    np.testing.assert_allclose(both.test_mse[1], alone.test_mse[0], rtol=1e-5)
    assert not np.allclose(both.test_mse[0], both.test_mse[1])


def test_tiny_stream_learns_the_newest_sample():
    cfg = StreamConfig(act="relu", lr=1e-2, seeds=(0,), **TINY)
    seen = []
    train_stream(cfg, lambda t, ens, xt, yt, mse: seen.append((t, float((ens.forward(xt)[0] - yt).abs().max().detach()))))
    assert [t for t, _ in seen] == list(range(1, 21))
    assert max(err for _, err in seen[5:]) < 0.2  # ten Adam steps fit each arriving sample


def test_set_kl_penalty():
    beta = 0.1
    h = torch.full((1, 4), beta)  # mean activation equals the target: zero penalty
    assert set_kl_penalty(h, beta).item() == pytest.approx(0.0, abs=1e-6)
    b = 0.3
    kl = beta * math.log(beta / b) + (1 - beta) * math.log((1 - beta) / (1 - b))
    assert set_kl_penalty(torch.full((2, 1, 5), b), beta).tolist() == pytest.approx([5 * kl] * 2, rel=1e-5)
    with pytest.raises(ValueError, match="beta must be in"):
        set_kl_penalty(h, 0.0)


def test_stream_command_writes_run_logs(tmp_path):
    cmd = COMMANDS["stream-sin"]
    cfg = cmd.make_config({"act": "elephant", "lr": 1e-3, "seeds": "0,1", "probe": "ntk,outputs,sparsity,gradcov",
                           "probe_at": "1,10,20", **TINY})
    summary = execute(cmd.train, cfg, cmd.run_dir(cfg, tmp_path))
    run = read_run(tmp_path / "stream-sin" / "elephant" / "lr0.001" / "seed1" / "run.h5")
    assert run.seed == 1 and run.config["act"] == "elephant" and run.config["algo"] == "stream-sin"
    steps, mse = run.scalars["test_mse"]
    assert steps.tolist() == list(range(1, 21))
    assert mse[-1] == pytest.approx(summary["final_mse"]["1"])
    assert run.probes["ntk"]["step"].tolist() == [1, 10, 20]
    kernel = run.probes["ntk"]["kernel"]
    assert kernel.shape == (3, 201) and np.abs(kernel).max(axis=1) == pytest.approx([1, 1, 1])
    assert run.probes["outputs"]["y"].shape == (3, 201, 1)
    assert run.probes["gradcov"]["mse"].shape == (0, 32, 32)  # 20 samples never hold the 32 distinct ones it draws
    assert "git_commit" in run.attrs["provenance"] and "versions" in run.attrs["provenance"]


def test_probes_do_not_change_the_stream(tmp_path):
    cmd = COMMANDS["stream-sin"]
    base = {"act": "elephant", "lr": 1e-3, "seeds": "0", **TINY}
    with_probes = execute(cmd.train, cmd.make_config({**base, "probe": "ntk,outputs,sparsity,gradcov,weights",
                                           "probe_at": "1,5,10,15,20"}), tmp_path / "a")
    without = execute(cmd.train, cmd.make_config({**base, "probe": ""}), tmp_path / "b")
    assert with_probes["final_mse"] == without["final_mse"]


def test_edit_reaches_target_and_measures_far_change():
    res = edit(EditConfig(act="elephant", seeds=(0, 1), width=200, pretrain_steps=2000))
    i = np.argmin(np.abs(res.x - 1.5))
    assert np.all(np.abs(res.after[:, i] + 1.5) < 0.02)
    assert np.all(res.steps > 0) and np.all(res.far_change >= 0) and np.all(res.pretrain_mse < 1e-3)


def test_cli_bad_input_exits_2(tmp_path, capsys):
    """Each refusal is exit status 2 with a message naming the problem (in process; one subprocess for the status)."""
    from agents import grid, train

    def main(module, *args: str) -> str:
        with pytest.raises(SystemExit) as exit_:
            sys.exit(module.main(list(args)))
        assert exit_.value.code == 2
        return capsys.readouterr().err

    r = run_cli("-m", "agents.train", "stream-sin", "--act", "swish", "--out", str(tmp_path))
    assert r.returncode == 2 and "invalid choice: 'swish'" in r.stderr
    assert "learning rate must be a positive number" in main(train, "stream-sin", "--lr", "-0.1", "--out",
                                                                str(tmp_path))
    assert "seeds must be integers" in main(train, "stream-sin", "--seeds", "0,x", "--out", str(tmp_path))
    bad = tmp_path / "bad.yml"
    bad.write_text("command: stream-sin\ngrids: [{act: [elephant], lr: [0.001, -1]}]\n")
    err = main(grid, str(bad), "--out", str(tmp_path))
    assert "grid entry 1" in err and "learning rate must be a positive" in err
    bad.write_text("command: stream-sin\ngrids: {act: [elephant]\n")
    assert "is not valid YAML" in main(grid, str(bad), "--out", str(tmp_path))
    bad.write_text("command: stream-sin\nsweep: {act: [elephant]}\n")
    assert "unknown grid keys ['sweep']" in main(grid, str(bad), "--out", str(tmp_path))


def test_grid_resumes_after_being_killed(tmp_path):
    grid = tmp_path / "grid.yml"
    grid.write_text(
        "command: stream-sin\n"
        "fixed: {seeds: [0], probe: '', n: 150, n_test: 50, width: 64}\n"
        "grids: [{act: [relu, tanh, elu], lr: [0.001]}]\n"
    )
    out = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "agents.grid", str(grid), "--out", str(out)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 90
    while time.time() < deadline and not list(out.glob("**/DONE.json")):
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = list(out.glob("**/DONE.json"))
    assert 1 <= len(done) < 3, "kill the grid after its first run and before its last"
    first = {p: p.stat().st_mtime_ns for p in done}
    dry = run_cli("-m", "agents.grid", str(grid), "--out", str(out), "--dry-run")
    assert dry.stdout.count("done") == len(done) and dry.stdout.count("todo") == 3 - len(done)
    r = run_cli("-m", "agents.grid", str(grid), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert f"3 runs, {len(done)} already finished" in r.stderr
    assert len(list(out.glob("**/DONE.json"))) == 3
    assert all(p.stat().st_mtime_ns == t for p, t in first.items())  # finished runs were skipped
    summary = json.loads(next(iter(first)).read_text())["summary"]
    assert set(summary) == {"final_mse", "mean_final_mse"}


def test_training_killed_with_sigkill_keeps_its_log(tmp_path):
    """A stream with probes at every step is SIGKILLed; its log opens and holds every record but the last."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    steps = ",".join(str(s) for s in range(1, 201))
    proc = subprocess.Popen([sys.executable, "-m", "agents.train", "stream-sin", "--act", "elephant", "--n", "200",
                             "--n-test", "50", "--width", "64", "--probe", "ntk,outputs", "--probe-at", steps,
                             "--out", str(tmp_path)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    path = tmp_path / "stream-sin" / "elephant" / "lr0.0003" / "seed0" / "run.h5"
    deadline, seen = time.time() + 90, 0
    while time.time() < deadline and seen < 10:
        time.sleep(0.05)
        if path.exists():
            try:
                seen = len(read_run(path).probes["ntk"]["step"])
            except Exception:  # the writer is still setting the file up
                pass
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert seen >= 10, "the run should have logged records before it was killed"
    run = read_run(path)
    ntk_steps = run.probes["ntk"]["step"]
    assert len(ntk_steps) >= seen and ntk_steps.tolist() == list(range(1, len(ntk_steps) + 1))
    assert len(run.scalars["test_mse"][0]) >= len(ntk_steps) - 1
