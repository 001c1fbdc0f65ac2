import csv
import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import yaml

from runlog import RUN_END, RunLog, read_run
from reports.classic import (aggregates, authors_comparison, classic_table, main, normalise, performance_profiles,
                             reference_data, score_matrices)
from reports.classic.page import _search_notes


def write_run(path, act, buffer, lr, seed, returns, n_timesteps=None, last_step=None, end=None, **extra):
    """A DQN run log with `returns` as episodes evenly spaced up to `last_step` (default `n_timesteps`, else
    100 steps per episode) and, if `end` is given, a `run_end` record (True: the series declared, no record, as in a
    log still being written; None: no series, as another tool's log); `n_timesteps` and `extra` go into the
    config."""
    config = {"algo": "dqn", "env": "MountainCar-v0", "act": act, "buffer_size": buffer, "learning_rate": lr,
              "seed": seed, **extra}
    if n_timesteps is not None:
        config["n_timesteps"] = n_timesteps
    last = last_step or n_timesteps or 100 * len(returns)
    steps = np.linspace(last / len(returns), last, len(returns)).astype(int)
    scalars = ["episode_return", *(["run_end"] if end is not None else [])]
    with RunLog(path, config=config, seed=seed, probes={}, scalars=scalars) as log:
        for step, r in zip(steps, returns):
            log.scalar("episode_return", int(step), r)
        if isinstance(end, str):
            log.scalar("run_end", int(last), RUN_END.index(end))


#: bootstrap resamples of the report in tests (its default is for real studies)
FEW_REPS = ("--reps", "20")


def returns(tail):
    """20 episodes, the last 10% (2) of them at `tail`."""
    return [-1000.0] * 18 + [tail] * 2


def test_best_lr_per_buffer_and_statistics(tmp_path, capsys):
    # 20 episodes per run: the last 10% are the last 2.
    for act, buffer, lr, seed, tail in [("elephant", 32, 1e-3, 0, -110), ("elephant", 32, 1e-3, 1, -120),
                                        ("elephant", 32, 1e-4, 0, -200), ("elephant", 32, 1e-4, 1, -190),
                                        ("relu", 32, 1e-3, 0, -300), ("relu", 32, 1e-3, 1, -250),
                                        ("relu", 10000, 1e-3, 0, -130), ("relu", 10000, 1e-3, 1, -140)]:
        write_run(tmp_path / f"{act}-{buffer}-{lr}-{seed}.h5", act, buffer, lr, seed, returns(tail))
    runs = [read_run(p) for p in sorted(tmp_path.glob("*.h5"))]
    table, warnings = classic_table(runs)
    rows = {(r.act, r.buffer_size): r for r in table}
    assert warnings == [] and len(rows) == len(table) == 3
    e = rows[("elephant", 32)]
    assert e.best_lr == 1e-3 and e.mean == pytest.approx(-115) and e.n_seeds == 2 and e.setting == ""
    assert e.sem == pytest.approx(np.std([-110, -120], ddof=1) / math.sqrt(2))
    assert rows[("relu", 32)].mean == pytest.approx(-275) and rows[("relu", 10000)].mean == pytest.approx(-135)
    assert e.lrs == (1e-4, 1e-3) and rows[("relu", 32)].lrs == (1e-3,)
    assert main([str(tmp_path), "-o", str(tmp_path / "out"), *FEW_REPS]) == 0
    assert (tmp_path / "out" / "buffer_sizes.png").stat().st_size > 0
    page = (tmp_path / "out" / "index.html").read_text()
    assert "buffer_sizes.png" in page and "lrs tried" in page
    # Elephant was searched over two learning rates, ReLU over one: the page says so, naming both sets.
    assert "The learning rates searched differ between points" in page
    assert "{0.0001, 0.001} for MountainCar-v0 elephant; {0.001} for MountainCar-v0 relu" in page
    # the numbers as CSV: each point (its seeds' finals, the lrs searched) and every run at every lr
    with (tmp_path / "out" / "points.csv").open() as f:
        points = {(p["activation"], p["buffer_size"]): p for p in csv.DictReader(f)}
    assert len(points) == 3 and points[("elephant", "32")]["lrs_tried"] == "0.0001 0.001"
    assert points[("elephant", "32")]["best_lr"] == "0.001" and float(points[("elephant", "32")]["mean"]) == -115
    assert [float(v) for v in points[("elephant", "32")]["finals"].split()] == [-110, -120]
    with (tmp_path / "out" / "runs.csv").open() as f:
        rows_csv = list(csv.DictReader(f))
    assert len(rows_csv) == 8 and {r["learning_rate"] for r in rows_csv} == {"0.001", "0.0001"}
    assert {(r["activation"], r["buffer_size"], r["learning_rate"], r["seed"], float(r["final_return"]))
            for r in rows_csv if r["learning_rate"] == "0.0001"} == {("elephant", "32", "0.0001", "0", -200),
                                                                    ("elephant", "32", "0.0001", "1", -190)}
    captured = capsys.readouterr()
    assert "-115.0" in captured.out and captured.err == ""


def test_runs_differing_in_any_setting_are_separate_rows(tmp_path, capsys):
    # The user's case: seed 0 of a 2000-step and a 50k-step run, plus a 50k-step run interrupted at step 3218.
    write_run(tmp_path / "short.h5", "elephant", 10000, 1e-3, 0, returns(-900), n_timesteps=2000)
    write_run(tmp_path / "long.h5", "elephant", 10000, 1e-3, 0, returns(-120), n_timesteps=50_000)
    write_run(tmp_path / "killed.h5", "elephant", 10000, 1e-3, 0, returns(-470), n_timesteps=50_000,
              last_step=3218)
    for seed, tail in [(0, -130), (1, -150)]:  # Elephant with other act_kwargs, 2 seeds
        write_run(tmp_path / f"d8-{seed}.h5", "elephant", 10000, 1e-3, seed, returns(tail), n_timesteps=50_000,
                  act_kwargs={"d": 8, "h": 1}, derived={"hidden": [1000]})
    table, warnings = classic_table([read_run(p) for p in sorted(tmp_path.glob("*.h5"))])
    assert [(r.setting, r.n_seeds) for r in table] == [("act_kwargs.d=8 act_kwargs.h=1 n_timesteps=50000", 2),
                                                       ("n_timesteps=2000", 1), ("n_timesteps=50000", 1)]
    assert [r.mean for r in table] == pytest.approx([-140, -900, -120])
    assert len(warnings) == 1 and "killed.h5" in warnings[0] and "step 3218 of n_timesteps 50000" in warnings[0]

    assert main([str(tmp_path), "-o", str(tmp_path / "out"), *FEW_REPS]) == 0
    captured = capsys.readouterr()
    assert "3 seeds" not in captured.out and captured.out.count("(1 seeds)") == 2
    assert "n_timesteps=2000" in (tmp_path / "out" / "index.html").read_text()
    killed, ambiguous = captured.err.strip().splitlines()
    assert killed.startswith(f"warning: {tmp_path / 'killed.h5'}: unfinished run") and killed.endswith("left out")
    assert ambiguous.startswith("warning: elephant at buffer 10000: several settings on MountainCar-v0 (")
    assert ambiguous.endswith("left out of the aggregates")


def test_unfinished_run_is_left_out(tmp_path):
    for seed, tail in [(0, -110), (1, -130)]:
        write_run(tmp_path / f"s{seed}.h5", "relu", 32, 1e-3, seed, returns(tail), n_timesteps=5000)
    write_run(tmp_path / "s2.h5", "relu", 32, 1e-3, 2, returns(-1000), n_timesteps=5000, last_step=3218)
    write_run(tmp_path / "s3.h5", "relu", 32, 1e-3, 3, returns(-125), n_timesteps=5000, last_step=4950)  # 99%
    ((row,), warnings) = classic_table([read_run(p) for p in sorted(tmp_path.glob("*.h5"))])
    assert row.n_seeds == 3 and row.mean == pytest.approx(np.mean([-110, -130, -125]))
    assert warnings == [f"{tmp_path / 's2.h5'}: unfinished run (last record at step 3218 of n_timesteps 5000); "
                        "left out"]


def test_a_learning_rate_whose_runs_were_left_out_in_part_is_tried_but_not_selectable(tmp_path):
    """lr 1e-3: 3 of 3 seeds at -100; 3e-3: 1 survivor at -90, 2 diverged; 1e-2: all diverged; 3e-4: one run's
    final return is not finite. The point is 1e-3's (not the lone survivor's), every lr counts as tried, and the page
    names those that were not selectable and counts the runs left out."""
    for seed in range(3):
        write_run(tmp_path / f"a{seed}.h5", "relu", 32, 1e-3, seed, returns(-100), n_timesteps=2000, end="finished")
        write_run(tmp_path / f"b{seed}.h5", "relu", 32, 3e-3, seed, returns(-90), n_timesteps=2000,
                  end="finished" if seed == 0 else "nan")
        write_run(tmp_path / f"c{seed}.h5", "relu", 32, 1e-2, seed, returns(-80), n_timesteps=2000, end="nan")
        write_run(tmp_path / f"d{seed}.h5", "relu", 32, 3e-4, seed, returns(float("nan") if seed else -95),
                  n_timesteps=2000, end="finished")
    ((row,), warnings) = classic_table([read_run(p) for p in sorted(tmp_path.glob("*.h5"))])
    assert (row.best_lr, row.mean, row.n_seeds) == (1e-3, -100, 3)
    assert row.lrs == (3e-4, 1e-3, 3e-3, 1e-2) and row.lr_seeds == (1, 3, 1, 0) and row.selectable_lrs == (1e-3,)
    assert sum("non-finite final return; left out" in w for w in warnings) == 2 and len(warnings) == 7
    assert main([str(tmp_path), "-o", str(tmp_path / "out"), *FEW_REPS]) == 0
    page = (tmp_path / "out" / "index.html").read_text()
    assert "MountainCar-v0 relu at buffer 32: 0.0003 (1 of 3), 0.003 (1 of 3), 0.01 (0 of 3)." in page
    assert "7 DQN run(s) left out" in page
    with (tmp_path / "out" / "points.csv").open() as f:
        assert next(csv.DictReader(f))["usable_seeds_per_lr"] == "1 3 1 0"


def test_a_run_still_being_written_is_left_out_near_its_end(tmp_path):
    """Our logs declare run_end when they are created: one without its record is running or was killed, whatever
    its last step (the 99% rule is for other tools' logs, which have no run_end series)."""
    write_run(tmp_path / "s0.h5", "relu", 32, 1e-3, 0, returns(-110), n_timesteps=5000, end="finished")
    write_run(tmp_path / "s1.h5", "relu", 32, 1e-3, 1, returns(-130), n_timesteps=5000, last_step=4990, end=True)
    ((row,), warnings) = classic_table([read_run(p) for p in sorted(tmp_path.glob("*.h5"))])
    assert row.n_seeds == 1 and row.mean == -110
    assert warnings == [f"{tmp_path / 's1.h5'}: unfinished run (last record at step 4990 of n_timesteps 5000); "
                        "left out"]


def test_run_end_record_decides_over_the_last_step(tmp_path):
    """A log that says how its run ended is believed: a diverged run that got near n_timesteps is left out, a
    finished run whose last episode ended early is kept."""
    write_run(tmp_path / "s0.h5", "relu", 32, 1e-3, 0, returns(-110), n_timesteps=5000, end="finished")
    write_run(tmp_path / "s1.h5", "relu", 32, 1e-3, 1, returns(-130), n_timesteps=5000, last_step=3000,
              end="finished")
    write_run(tmp_path / "s2.h5", "relu", 32, 1e-3, 2, returns(-90), n_timesteps=5000, last_step=4990, end="nan")
    ((row,), warnings) = classic_table([read_run(p) for p in sorted(tmp_path.glob("*.h5"))])
    assert row.n_seeds == 2 and row.mean == pytest.approx(-120.0)
    assert warnings == [f"{tmp_path / 's2.h5'}: diverged (non-finite loss) run (last record at step 4990 of "
                        "n_timesteps 5000); left out"]


def test_interrupted_run_without_n_timesteps_is_left_out(tmp_path):
    write_run(tmp_path / "s0.h5", "relu", 32, 1e-3, 0, returns(-110), end="finished")
    write_run(tmp_path / "s1.h5", "relu", 32, 1e-3, 1, returns(-300), end="interrupted")
    ((row,), warnings) = classic_table([read_run(p) for p in sorted(tmp_path.glob("*.h5"))])
    assert row.n_seeds == 1
    assert warnings == [f"{tmp_path / 's1.h5'}: interrupted run (last record at step 2000); left out"]


def test_duplicate_seed_is_counted_once(tmp_path, capsys):
    write_run(tmp_path / "a" / "seed0.h5", "relu", 32, 1e-3, 0, returns(-100), n_timesteps=2000)
    write_run(tmp_path / "b" / "seed0.h5", "relu", 32, 1e-3, 0, returns(-200), n_timesteps=2000)
    write_run(tmp_path / "a" / "seed1.h5", "relu", 32, 1e-3, 1, returns(-140), n_timesteps=2000)
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "out"), *FEW_REPS]) == 0
    captured = capsys.readouterr()
    assert "-120.0 ± 20.0  (2 seeds)" in captured.out  # seeds 0 (the first file, a/) and 1
    assert captured.err == (f"warning: {tmp_path / 'b' / 'seed0.h5'}: same config and seed 0 as "
                            f"{tmp_path / 'a' / 'seed0.h5'}; counted once\n")


def test_no_runs_is_an_error(tmp_path, capsys):
    assert main([str(tmp_path), "-o", str(tmp_path / "out"), *FEW_REPS]) == 2
    assert "error:" in capsys.readouterr().err


def test_only_unfinished_runs_is_an_error(tmp_path, capsys):
    write_run(tmp_path / "killed.h5", "relu", 32, 1e-3, 0, returns(-100), n_timesteps=5000, last_step=1000)
    assert main([str(tmp_path), "-o", str(tmp_path / "out"), *FEW_REPS]) == 2
    warning, error = capsys.readouterr().err.strip().splitlines()
    assert "killed.h5: unfinished run" in warning and error.startswith("error: no finished DQN runs")


def test_output_path_that_is_a_file_exits_2(tmp_path, capsys):
    write_run(tmp_path / "run.h5", "relu", 32, 1e-3, 0, returns(-100))
    (tmp_path / "out").write_text("a file")
    assert main([str(tmp_path / "run.h5"), "-o", str(tmp_path / "out"), *FEW_REPS]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'out'}: output path exists and is not a directory\n"


# --- aggregates across tasks and the authors' results ------------------------------------------------------------

STUDY = {"MountainCar-v0": {"random": -1000.0, "reference": -100.0}, "Acrobot-v1": {"random": -500.0,
                                                                                   "reference": -100.0}}


def study_rows(tmp_path, seeds=(0, 1, 2)):
    """Runs on two tasks x two activations at two buffer sizes (2000 steps, 20 episodes), two learning rates each
    where the second is worse by 50; their table."""
    for env, base in [("MountainCar-v0", -400.0), ("Acrobot-v1", -300.0)]:
        for act, shift in [("elephant", 100.0), ("relu", 0.0)]:
            for buffer in (32, 10000):
                for lr, worse in [(1e-3, 0.0), (1e-4, 50.0)]:
                    for seed in seeds:
                        tail = base + shift + (50.0 if buffer == 10000 else 0.0) - worse + 10.0 * seed
                        write_run(tmp_path / f"{env}-{act}-{buffer}-{lr}-{seed}.h5", act, buffer, lr, seed,
                                  returns(tail), n_timesteps=2000, env=env)
    table, warnings = classic_table([read_run(p) for p in sorted(tmp_path.glob("*.h5"))])
    assert warnings == []
    return table


def test_best_lr_keeps_each_seeds_final_in_seed_order(tmp_path):
    table = study_rows(tmp_path)
    row = next(r for r in table if (r.env, r.act, r.buffer_size) == ("Acrobot-v1", "relu", 32))
    assert row.best_lr == 1e-3 and row.seeds == (0, 1, 2)
    assert row.finals == pytest.approx([-300.0, -290.0, -280.0]) and row.mean == pytest.approx(-290.0)
    assert [r.seed for r in row.runs] == [0, 1, 2]
    # every point searched over the same two learning rates: no note about unequal searches
    assert {r.lrs for r in table} == {(1e-4, 1e-3)} and _search_notes(table) == []


def test_normalise_against_hand_computed_scores():
    assert normalise("MountainCar-v0", [-1000.0, -550.0, -100.0, -10.0], STUDY) == pytest.approx([0.0, 0.5, 1.0, 1.1])
    assert normalise("Acrobot-v1", -300.0, STUDY) == pytest.approx(0.5)
    data = reference_data()["normalisation"]["tasks"]["Catcher-PLE-v0"]
    assert normalise("Catcher-PLE-v0", data["reference"]) == pytest.approx(1.0)
    assert normalise("Catcher-PLE-v0", data["random"]) == pytest.approx(0.0)


def test_task_without_normalisation_constants_is_named():
    with pytest.raises(ValueError, match="no normalisation constants for task 'CartPole-v1'"):
        normalise("CartPole-v1", [1.0], STUDY)


def test_score_matrices_are_seeds_by_tasks(tmp_path):
    matrices, tasks, warnings = score_matrices(study_rows(tmp_path), STUDY)
    assert tasks == ["Acrobot-v1", "MountainCar-v0"] and warnings == [] and set(matrices) == {32, 10000}
    # elephant at buffer 32: Acrobot finals -200, -190, -180 -> (R + 500) / 400; MountainCar -300.. -> (R + 1000) / 900
    expected = np.array([[0.75, 700 / 900], [0.775, 710 / 900], [0.8, 720 / 900]])
    assert matrices[32]["elephant"] == pytest.approx(expected)


def test_score_matrices_leave_out_incomplete_cells_with_a_warning(tmp_path):
    table = [r for r in study_rows(tmp_path) if not (r.act == "relu" and r.buffer_size == 32
                                                     and r.env == "MountainCar-v0")]
    table = [dataclasses.replace(r, finals=r.finals[:2]) if (r.act, r.env) == ("elephant", "Acrobot-v1") else r
             for r in table]
    matrices, _, warnings = score_matrices(table, STUDY)
    assert "relu" not in matrices[32] and matrices[32]["elephant"].shape == (2, 2)
    cut = "only 2 seeds on Acrobot-v1; the first 2 seeds of MountainCar-v0 (3) used"
    assert warnings == [f"elephant at buffer 32: {cut}",
                        "relu at buffer 32: no runs on MountainCar-v0; left out of the aggregates",
                        f"elephant at buffer 10000: {cut}"]
    with pytest.raises(ValueError, match="'Acrobot-v1'"):
        score_matrices(table, {"MountainCar-v0": STUDY["MountainCar-v0"]})


def test_iqm_and_ci_are_rliables(tmp_path):
    from rliable import library as rly
    from rliable import metrics

    matrices, _, _ = score_matrices(study_rows(tmp_path), STUDY)
    aggs = {(a.act, a.buffer_size): a for a in aggregates(matrices, reps=200, seed=3)}
    scores = matrices[10000]["relu"]
    np.random.seed(3)  # rliable 1.2 draws from numpy's global generator
    points, cis = rly.get_interval_estimates(
        matrices[10000], lambda x: np.array([metrics.aggregate_iqm(x), metrics.aggregate_mean(x)]), reps=200)
    a = aggs[("relu", 10000)]
    assert a.iqm == pytest.approx(scipy.stats.trim_mean(scores.ravel(), 0.25)) == pytest.approx(points["relu"][0])
    assert a.mean == pytest.approx(scores.mean())
    assert a.iqm_ci == pytest.approx(cis["relu"][:, 0]) and a.mean_ci == pytest.approx(cis["relu"][:, 1])
    assert a.iqm_ci[0] <= a.iqm <= a.iqm_ci[1] and a.n_seeds == 3
    again = {(b.act, b.buffer_size): b for b in aggregates(matrices, reps=200, seed=3)}
    assert again == aggs  # the seed makes the report reproducible


def test_performance_profiles_fall_from_one_to_zero(tmp_path):
    matrices, _, _ = score_matrices(study_rows(tmp_path), STUDY)
    profiles = performance_profiles(matrices, reps=50, points=41)
    assert [p.buffer_size for p in profiles] == [32, 10000]
    for p in profiles:
        assert p.taus[0] <= 0.0 and p.taus[-1] >= 1.0 and len(p.taus) == 41
        for act, profile in p.profiles.items():
            assert np.all((profile >= 0) & (profile <= 1)) and np.all(np.diff(profile) <= 0)
            scores = matrices[p.buffer_size][act].ravel()
            assert profile == pytest.approx([np.mean(scores > t) for t in p.taus])
            assert p.cis[act].shape == (2, 41)


AUTHORS = {"buffer_size": 10000, "fraction": 0.1, "train_steps": {"MountainCar-v0": 2000, "Pixelcopter-PLE-v0": 10**6},
           "finals": {"MountainCar-v0": {"elephant": {"0": -100.0, "1": -120.0}, "fta": {"0": -150.0}},
                      "Pixelcopter-PLE-v0": {"relu": {"0": 10.0, "1": 20.0, "2": 30.0}}}}


def test_authors_comparison_rows(tmp_path):
    for seed, tail in [(0, -110.0), (1, -130.0)]:
        write_run(tmp_path / f"e{seed}.h5", "elephant", 10000, 1e-3, seed, returns(tail), n_timesteps=2000)
        write_run(tmp_path / f"small{seed}.h5", "elephant", 32, 1e-3, seed, returns(-500.0), n_timesteps=2000)
        write_run(tmp_path / f"cp{seed}.h5", "relu", 10000, 1e-3, seed, returns(50.0), n_timesteps=2000,
                  env="CartPole-v1")
    table, _ = classic_table([read_run(p) for p in sorted(tmp_path.glob("*.h5"))])
    comps = {(c.env, c.act): c for c in authors_comparison(table, AUTHORS)}
    assert sorted(comps) == [("CartPole-v1", "relu"), ("MountainCar-v0", "elephant"), ("MountainCar-v0", "fta"),
                             ("Pixelcopter-PLE-v0", "relu")]
    mc = comps[("MountainCar-v0", "elephant")]
    # late return: the episodes ending after the first 1800 of 2000 steps, the tail twice (ours at steps 1900 and
    # 2000); the one ending at our step 1800 is the authors' Step 1799 (0-based), before the last 10%
    late = [-110.0, -130.0]
    assert mc.ours == pytest.approx((np.mean(late), np.std(late, ddof=1) / math.sqrt(2), 2))
    assert mc.theirs == pytest.approx((-110.0, np.std([-100.0, -120.0], ddof=1) / math.sqrt(2), 2))
    assert mc.difference == pytest.approx(np.mean(late) + 110.0) and (mc.our_steps, mc.their_steps) == (2000, 2000)
    assert mc.our_lrs == (1e-3,) and comps[("MountainCar-v0", "fta")].our_lrs == ()
    fta, copter, cartpole = (comps[k] for k in [("MountainCar-v0", "fta"), ("Pixelcopter-PLE-v0", "relu"),
                                                ("CartPole-v1", "relu")])
    assert fta.ours is None and math.isnan(fta.theirs[1]) and fta.theirs[2] == 1 and math.isnan(fta.difference)
    assert copter.ours is None and copter.theirs == pytest.approx((20.0, 10 / math.sqrt(3), 3))
    assert cartpole.theirs is None and cartpole.their_steps is None and cartpole.ours[0] == pytest.approx(50.0)


def test_reference_file_is_consistent():
    data = reference_data()
    authors, tasks = data["authors"], data["normalisation"]["tasks"]
    config = yaml.safe_load(Path("agents/hyperparams/dqn.yml").read_text())
    assert authors["buffer_size"] == config["default"]["buffer_size"]
    assert set(tasks) == set(authors["finals"]) == set(authors["train_steps"])
    for env, constants in tasks.items():
        assert authors["train_steps"][env] == config[env]["n_timesteps"]
        best = max(np.mean(list(seeds.values())) for seeds in authors["finals"][env].values() if seeds)
        assert constants["reference"] == pytest.approx(best, abs=1e-3) and constants["random"] < best


def test_report_page_has_aggregates_and_comparison(tmp_path, capsys):
    study_rows(tmp_path / "runs")
    write_run(tmp_path / "runs" / "cartpole.h5", "relu", 10000, 1e-3, 0, returns(50.0), env="CartPole-v1")
    assert main([str(tmp_path / "runs"), "-o", str(tmp_path / "out"), *FEW_REPS]) == 0
    page = (tmp_path / "out" / "index.html").read_text()
    for name in ("buffer_sizes.png", "aggregate_iqm.png", "performance_profiles.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0 and name in page
    assert "IQM" in page and "(R - R_random) / (R_ref - R_random)" in page and "20 resamples" in page
    assert "Ours against the authors" in page and "not in reference data" in page and "a97a845" in page
    with (tmp_path / "out" / "aggregates.csv").open() as f:
        aggs = list(csv.DictReader(f))
    assert {(a["activation"], a["buffer_size"]) for a in aggs} == {(act, b) for act in ("elephant", "relu")
                                                                   for b in ("32", "10000")}
    assert all(float(a["iqm_low"]) <= float(a["iqm"]) <= float(a["iqm_high"]) and a["seeds_per_task"] == "3"
               and a["tasks"] == "Acrobot-v1 MountainCar-v0" for a in aggs)
    err = capsys.readouterr().err
    assert "no normalisation constants for CartPole-v1" in err and "left out of the aggregates" in err
    assert "In the aggregates: no normalisation constants for CartPole-v1 in classic_dqn.json; left out" in page


def test_bad_reps_exits_2(tmp_path, capsys):
    write_run(tmp_path / "run.h5", "relu", 32, 1e-3, 0, returns(-100))
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path), "-o", str(tmp_path / "out"), "--reps", "0"])
    assert exit_info.value.code == 2 and "--reps must be >= 1" in capsys.readouterr().err
