import math

import numpy as np
import pytest

from probes import RunLog, read_run
from probes.runlog import RUN_END
from reports.classic import classic_table, main


def write_run(path, act, buffer, lr, seed, returns, n_timesteps=None, last_step=None, end=None, **extra):
    """A DQN run log with `returns` as episodes evenly spaced up to `last_step` (default `n_timesteps`, else
    100 steps per episode) and, if `end` is given, a `run_end` record; `n_timesteps` and `extra` go into the
    config."""
    config = {"algo": "dqn", "env": "MountainCar-v0", "act": act, "buffer_size": buffer, "learning_rate": lr,
              "seed": seed, **extra}
    if n_timesteps is not None:
        config["n_timesteps"] = n_timesteps
    last = last_step or n_timesteps or 100 * len(returns)
    steps = np.linspace(last / len(returns), last, len(returns)).astype(int)
    with RunLog(path, config=config, seed=seed, probes={}, scalars=["episode_return", "run_end"]) as log:
        for step, r in zip(steps, returns):
            log.scalar("episode_return", int(step), r)
        if end is not None:
            log.scalar("run_end", int(last), RUN_END.index(end))


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
    assert main([str(tmp_path), "-o", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "buffer_sizes.png").stat().st_size > 0
    assert "buffer_sizes.png" in (tmp_path / "out" / "index.html").read_text()
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

    assert main([str(tmp_path), "-o", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert "3 seeds" not in captured.out and captured.out.count("(1 seeds)") == 2
    assert "n_timesteps=2000" in (tmp_path / "out" / "index.html").read_text()
    (line,) = captured.err.strip().splitlines()
    assert line.startswith(f"warning: {tmp_path / 'killed.h5'}: unfinished run") and line.endswith("left out")


def test_unfinished_run_is_left_out(tmp_path):
    for seed, tail in [(0, -110), (1, -130)]:
        write_run(tmp_path / f"s{seed}.h5", "relu", 32, 1e-3, seed, returns(tail), n_timesteps=5000)
    write_run(tmp_path / "s2.h5", "relu", 32, 1e-3, 2, returns(-1000), n_timesteps=5000, last_step=3218)
    write_run(tmp_path / "s3.h5", "relu", 32, 1e-3, 3, returns(-125), n_timesteps=5000, last_step=4950)  # 99%
    ((row,), warnings) = classic_table([read_run(p) for p in sorted(tmp_path.glob("*.h5"))])
    assert row.n_seeds == 3 and row.mean == pytest.approx(np.mean([-110, -130, -125]))
    assert warnings == [f"{tmp_path / 's2.h5'}: unfinished run (last record at step 3218 of n_timesteps 5000); "
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
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert "-120.0 ± 20.0  (2 seeds)" in captured.out  # seeds 0 (the first file, a/) and 1
    assert captured.err == (f"warning: {tmp_path / 'b' / 'seed0.h5'}: same config and seed 0 as "
                            f"{tmp_path / 'a' / 'seed0.h5'}; counted once\n")


def test_no_runs_is_an_error(tmp_path, capsys):
    assert main([str(tmp_path), "-o", str(tmp_path / "out")]) == 2
    assert "error:" in capsys.readouterr().err


def test_only_unfinished_runs_is_an_error(tmp_path, capsys):
    write_run(tmp_path / "killed.h5", "relu", 32, 1e-3, 0, returns(-100), n_timesteps=5000, last_step=1000)
    assert main([str(tmp_path), "-o", str(tmp_path / "out")]) == 2
    warning, error = capsys.readouterr().err.strip().splitlines()
    assert "killed.h5: unfinished run" in warning and error.startswith("error: no finished DQN runs")


def test_output_path_that_is_a_file_exits_2(tmp_path, capsys):
    write_run(tmp_path / "run.h5", "relu", 32, 1e-3, 0, returns(-100))
    (tmp_path / "out").write_text("a file")
    assert main([str(tmp_path / "run.h5"), "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'out'}: output path exists and is not a directory\n"
