"""reports.mujoco's grouping and normalisation on synthetic run logs (no training): runs of one cell in two configs
are refused with the settings that differ; the across-task aggregates normalise a task over all its buffer sizes,
checked against the scores normalised by hand."""

from __future__ import annotations

import numpy as np
import pytest

from reports import mujoco
from reports.data import NO_SE
from reports.cli import StudyInputError
from runlog import Run


def _run(act: str, buffer: int, seed: int, returns: list[float], env: str = "Swimmer-v4", **extra) -> Run:
    config = {"algo": "sac", "env": env, "act": act, "buffer_size": buffer, "seed": seed, "n_timesteps": 100,
              "learning_rate": 1e-3, **extra}
    steps = np.linspace(100 / len(returns), 100, len(returns)).astype(np.int64)  # a finished run
    return Run(path=f"{env}/{act}/{buffer}/{config['learning_rate']}/{seed}", config=config, seed=seed, attrs={},
               probes={}, scalars={"episode_return": (steps, np.asarray(returns, dtype=float))})


def test_one_cell_in_two_configs_is_refused_with_the_settings_that_differ():
    runs = [_run("elephant", 1000, s, [1.0]) for s in (0, 1)] + \
        [_run("elephant", 1000, 0, [2.0], learning_rate=3e-4)]
    refused = (r"SAC elephant on Swimmer-v4 with a buffer of 1,000 in 2 configs "
               r"\(learning_rate=0\.0003; learning_rate=0\.001\): report them separately")
    with pytest.raises(StudyInputError, match=refused):
        mujoco.groups(runs)


def test_the_cli_refuses_mixed_configs_in_one_line(tmp_path, capsys, monkeypatch):
    runs = [_run("relu", 1000, 0, [1.0]), _run("relu", 1000, 0, [1.0], batch_size=64)]
    monkeypatch.setattr("reports.cli.load_runs", lambda paths: runs)
    assert mujoco.main([str(tmp_path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: SAC relu on Swimmer-v4") and "batch_size" in err and "\n" not in err


def test_tasks_are_normalised_over_all_their_buffer_sizes():
    # one task, two buffer sizes, two seeds: Elephant 10 everywhere, ReLU 0 with the small buffer and 5 with the big
    scores = {("elephant", 100): [10.0, 10.0], ("relu", 100): [0.0, 0.0],
              ("elephant", 1000): [10.0, 10.0], ("relu", 1000): [5.0, 5.0]}
    runs = [_run(act, buffer, seed, [v]) for (act, buffer), vs in scores.items() for seed, v in enumerate(vs)]
    found, warnings = mujoco.groups(runs)
    assert not warnings and len(found) == 4
    rows = {(r[1], r[2]): r for r in mujoco.normalised_aggregates(found, reps=50)}
    lo, hi = 0.0, 10.0  # the task's lowest and highest run over both buffer sizes
    for (act, buffer), vs in scores.items():
        expected = (np.mean(vs) - lo) / (hi - lo)
        assert rows[(f"{buffer:,}", act)][6].startswith(f"{expected:.3f}"), (act, buffer)


def test_elephant_against_gives_a_verdict_only_where_both_sides_have_an_se():
    """Apart intervals name the higher side, touching ones overlap, and a single-seed side (no SE) gets no verdict:
    one run each must not read as "Elephant higher"."""
    runs = [_run("elephant", 1000, s, [r]) for s, r in ((0, 10.0), (1, 12.0))] + \
        [_run("relu", 1000, s, [r]) for s, r in ((0, 4.0), (1, 6.0))] + \
        [_run("lwta", 1000, s, [r]) for s, r in ((0, 9.0), (1, 11.0))] + \
        [_run("elephant", 100, 0, [3.0]), _run("relu", 100, 0, [1.0])] + \
        [_run("relu", 10, s, [r]) for s, r in ((0, 1.0), (1, 3.0))] + [_run("elephant", 10, 0, [0.0])]
    found, _ = mujoco.groups(runs)
    rows = {(r[2], r[3]): (r[4], r[5], r[7]) for r in mujoco.elephant_against(found)}
    assert rows == {("1,000", "relu"): ("+6.0", "Elephant higher", "Elephant higher"),  # 11 ± 1 vs 5 ± 1
                    ("1,000", "lwta"): ("+1.0", "overlap", "overlap"),                  # 11 ± 1 vs 10 ± 1
                    ("100", "relu"): ("+2.0", NO_SE, NO_SE),
                    ("10", "relu"): ("-2.0", NO_SE, NO_SE)}
