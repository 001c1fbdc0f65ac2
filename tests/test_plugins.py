"""The plugin path end to end: ``tests/plugin_example.py`` registers a test-only activation, probe and toy
algorithm; CLIs (subprocesses) and grid workers (spawned processes) import it with ``--import`` / ``import:``, and
reports render its probe from the schema stored in the run logs, without importing it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from runlog import read_run
from reports.build import build_report

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}


def _run(*args: str, status: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert proc.returncode == status, proc.stderr[-3000:]
    return proc


def test_the_plugin_activation_is_offered_by_the_dqn_and_stream_cli():
    dqn = _run("agents.train", "--import", "plugin_example", "dqn", "--help").stdout
    assert "test_crelu" in dqn and "--scale X" in dqn and "CReLU output scale" in dqn
    stream = _run("agents.train", "stream-sin", "--help", "--import=plugin_example").stdout
    assert "test_crelu" in stream
    assert "toy" in _run("agents.train", "--import", "plugin_example", "--help").stdout
    missing = _run("agents.train", "dqn", "--act", "test_crelu", "--out", "unused", status=2).stderr
    assert "unknown activation 'test_crelu'" in missing


def test_a_bad_plugin_module_is_named():
    err = _run("agents.train", "--import", "no_such_plugin", "dqn", status=2).stderr
    assert "cannot import plugin module 'no_such_plugin'" in err and "Traceback" not in err


def test_plugin_activation_in_sb3_dqn_width_matched_and_probed(tmp_path):
    _run("agents.train", "--import", "plugin_example", "dqn", "--env", "CartPole-v1", "--act", "test_crelu",
         "--scale", "0.5", "--set", "gamma=0.9", "--no-ln", "--hidden", "64", "--match-width", "--steps", "300", "--set", "learning_starts=50",
         "--probe", "sparsity,weights,mean_abs_output", "--probe-every", "100", "--no-progress", "--out", str(tmp_path))
    (run_dir,) = [p.parent for p in tmp_path.rglob("config.yaml")]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    # Elephant 64 on CartPole has 4*64+64 + 2*64 (LN) + 2*64 (h, a) + 2*64+2 = 706 parameters; the CReLU net
    # without LayerNorm has 5w + 2*2w+2 (twice the outputs into the head): w = 78
    assert config["act"] == "test_crelu" and config["layer_norm"] is False and config["sigma_bias"] == 0.1
    assert config["act_kwargs"] == {"scale": 0.5} and config["derived"]["hidden"]["q"] == [78]
    assert config["gamma"] == 0.9  # the RL setting, not the activation's argument of the same name
    run = read_run(run_dir / "run.h5")
    assert run.attrs["provenance"]["plugins"].keys() == {"plugin_example"}
    assert run.attrs["probe_settings"]["sparsity"]["layers"] == ["q_net.1"]  # Linear, CReLU, head
    assert run.probes["sparsity"]["dormant"].shape == (3, 1)
    assert run.probes["mean_abs_output"]["per_output"].shape == (3, 2)  # two actions


def test_plugin_activation_and_probe_through_a_grid_worker_and_a_report(tmp_path):
    grid = tmp_path / "grid.yml"
    grid.write_text("command: stream-sin\nimport: [plugin_example]\n"
                    "fixed: {n: 20, n_test: 50, width: 32, seeds: [0], probe: [sparsity, mean_abs_output], "
                    "probe_at: [10, 20]}\n"
                    "grids: [{act: [test_crelu, relu]}]\n")
    _run("agents.grid", str(grid), "--out", str(tmp_path / "runs"), "--workers", "2")
    logs = sorted((tmp_path / "runs").rglob("run.h5"))
    assert len(logs) == 2 and all((p.parent.parent / "DONE.json").exists() for p in logs)
    runs = [read_run(p) for p in logs]
    crelu = next(r for r in runs if r.config["act"] == "test_crelu")
    assert crelu.probes["sparsity"]["activation_sparsity"].shape == (2, 1)
    # the stream net is Linear(1, 32) -> CReLU (64 outputs) -> Linear(64, 1): about half the outputs are zero
    assert 0.3 < float(crelu.probes["sparsity"]["activation_sparsity"][-1, 0]) < 0.7
    index = build_report(runs, tmp_path / "report")
    html = index.read_text()
    assert "Output magnitude" in html and "mean_abs_output.overall" in html and "mean_abs_output.per_output" in html
    assert (tmp_path / "report" / "probe_mean_abs_output_overall.png").stat().st_size > 0
    assert "act=test_crelu" in html  # the sparsity section's group label
    again = _run("agents.grid", str(grid), "--out", str(tmp_path / "runs")).stderr
    assert "2 already finished" in again


def test_toy_algorithm_through_the_cli_the_grid_runner_and_a_report(tmp_path):
    out = _run("agents.train", "--import", "plugin_example", "toy", "--steps", "30", "--lr", "0.1", "--out",
               str(tmp_path / "cli")).stdout
    assert json.loads(out)["final_loss"] < 1.0
    assert (tmp_path / "cli" / "toy" / "act=tanh" / "seed0" / "run.h5").exists()
    several = _run("agents.train", "--import", "plugin_example", "toy", "--steps", "10", "--seeds", "1-2", "--out",
                   str(tmp_path / "cli")).stdout
    assert len(json.loads(several)) == 2 and (tmp_path / "cli" / "toy" / "act=tanh" / "seed2" / "DONE.json").exists()
    bad = _run("agents.train", "--import", "plugin_example", "toy", "--lr", "-1", "--out", str(tmp_path),
               status=2).stderr
    assert "lr must be > 0" in bad
    grid = tmp_path / "grid.yml"
    grid.write_text("command: toy\nimport: plugin_example\nfixed: {steps: 20}\n"
                    "grids: [{act: [tanh, relu], seed: [0, 1]}]\n")
    _run("agents.grid", str(grid), "--out", str(tmp_path / "grid"), "--workers", "2")
    runs = [read_run(p) for p in sorted((tmp_path / "grid").rglob("run.h5"))]
    assert len(runs) == 4 and {r.config["act"] for r in runs} == {"tanh", "relu"}
    assert all(np.all(np.isfinite(r.scalars["loss"][1])) for r in runs)
    html = build_report(runs, tmp_path / "report").read_text()
    assert "curve_loss.png" in html and "mean_abs_output.overall" in html


def test_report_reads_the_schema_from_the_log_not_the_registry(tmp_path):
    """A run log's stored schema is what the report shows, in a process that never imported the plugin."""
    _run("agents.train", "--import", "plugin_example", "toy", "--steps", "20", "--out", str(tmp_path / "runs"))
    code = ("import sys; from runlog import read_run, find_runs; from reports.data import probe_schema; "
            "r = read_run(find_runs(sys.argv[1])[0]); print(probe_schema(r, 'mean_abs_output').title); "
            "print('plugin_example' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "runs")], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.split() == ["Output", "magnitude", "False"], proc.stderr


def test_registration_errors_are_clear():
    import pytest

    from agents.algorithm import Algorithm
    from agents.commands import get_command, register_command
    from probes import GradCovProbe, Probe, register_probe

    with pytest.raises(ValueError, match="registered already"):
        register_probe(type("Other", (Probe,), {"name": "gradcov"}))
    assert register_probe(GradCovProbe) is GradCovProbe  # the same class again is fine
    with pytest.raises(ValueError, match="its own name"):
        register_probe(type("Nameless", (Probe,), {}))
    with pytest.raises(ValueError, match="exists already"):
        register_command(get_command("stream-sin"))
    with pytest.raises(TypeError, match="must be a dataclass"):
        Algorithm("x", "", dict, lambda cfg, d: {})
