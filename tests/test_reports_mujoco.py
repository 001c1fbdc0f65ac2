"""The policy-gradient study's report (reports.mujoco) over tiny real runs: PPO and SAC on Hopper with the paper's
MuJoCo settings and every activation of the study (PPO: Tanh, ReLU, Elephant, FTA, Maxout, LWTA; SAC: Elephant and
ReLU at two buffer sizes, FTA, Maxout and LWTA at one), two seeds, the gradient covariance of actor and critic
probed; the report's tables, buffer figure and aggregates. (About 60 s: with the long tests.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agents.commands import get_command
from reports import mujoco
from runlog import read_run

pytestmark = pytest.mark.long

VERDICTS = {"Elephant higher", "Elephant lower", "overlap"}
SHORT = ["max_episode_steps=40", "probe_inputs=8"]
#: (algorithm, activation, flags): the paper's settings, shortened
PPO_ACTS = ("elephant", "relu", "tanh", "fta", "maxout", "lwta")
RUNS = [*(("ppo", act, {"steps": 256, "set": [*SHORT, "n_steps=64", "batch_size=32", "n_epochs=1"]})
          for act in PPO_ACTS),
        *(("sac", act, {"steps": 240, "buffer_size": b, "set": [*SHORT, "learning_starts=120"]})
          for act in ("elephant", "relu") for b in (100, 1000)),
        *(("sac", act, {"steps": 240, "buffer_size": 1000, "set": [*SHORT, "learning_starts=120"]})
          for act in ("fta", "maxout", "lwta"))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    from agents.rl.run import train

    root = tmp_path_factory.mktemp("runs")
    for algo, act, flags in RUNS:
        cmd = get_command(algo)
        for seed in (0, 1):
            config = cmd.make_config({**flags, "env": "Hopper-v4", "act": act, "seed": seed, "probe": "gradcov",
                                      "probe_every": 120, "checkpoint_every": 0, "progress": False})
            train(config, cmd.run_dir(config, root))
    return root


def test_runs_probe_the_gradient_covariance_of_actor_and_critic(runs):
    for path in sorted(runs.rglob("run.h5")):
        run = read_run(path)
        gradcov = run.probes["gradcov"]
        assert {"actor", "critic"} <= set(gradcov) and len(gradcov["step"]) >= 1, path
        assert all(np.isfinite(np.asarray(m)).all() for m in gradcov["actor"]), path
        assert len(run.scalars["episode_return"][0]) >= 2


def test_the_report_tables_buffers_and_aggregates(runs, tmp_path, capsys):
    assert mujoco.main([str(runs), "-o", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    page = (out / "index.html").read_text()
    for image in ("ppo_Hopper-v4_returns.png", "sac_Hopper-v4_buffer100_returns.png",
                  "sac_Hopper-v4_buffer1000_returns.png", "sac_buffers.png"):
        assert (out / image).exists() and image in page, image
    printed = capsys.readouterr().out
    assert printed.count("PPO  Hopper-v4") == 6 and printed.count("SAC  Hopper-v4") == 7
    found, warnings = mujoco.groups([read_run(p) for p in runs.rglob("run.h5")])
    assert not warnings and len(found) == 13 and all(len(g.runs) == 2 for g in found)
    rows = mujoco.normalised_aggregates(found, reps=200)
    assert {(r[0], r[1], r[2]) for r in rows} == {("PPO", "", a) for a in PPO_ACTS} | \
        {("SAC", b, a) for b in ("100", "1,000") for a in ("elephant", "relu")} | \
        {("SAC", "1,000", a) for a in ("fta", "maxout", "lwta")}
    against = mujoco.elephant_against(found)
    assert {(r[0], r[2], r[3]) for r in against} == {("PPO", "", a) for a in PPO_ACTS[1:]} | \
        {("SAC", "100", "relu")} | {("SAC", "1,000", a) for a in ("relu", "fta", "maxout", "lwta")}
    assert all(len(r) == 8 and r[5] in VERDICTS and r[7] in VERDICTS for r in against)


def test_scores_are_the_mean_of_the_last_tenth_or_all_of_the_training_episodes(runs):
    found, _ = mujoco.groups([read_run(p) for p in runs.rglob("run.h5")])
    g = next(g for g in found if g.algo == "ppo" and g.act == "relu")
    run = min(g.runs, key=lambda r: r.seed)
    _, returns = run.scalars["episode_return"]
    k = int(np.ceil(0.1 * len(returns)))
    assert g.scores()[0] == pytest.approx(float(np.mean(returns[-k:])))
    assert g.scores(1.0)[0] == pytest.approx(float(np.mean(returns)))
