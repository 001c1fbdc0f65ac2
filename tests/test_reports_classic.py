import math

import numpy as np
import pytest

from probes import RunLog, read_run
from reports.classic import classic_table, main


def write_run(path, act, buffer, lr, seed, returns):
    config = {"algo": "dqn", "env": "MountainCar-v0", "act": act, "buffer_size": buffer, "learning_rate": lr,
              "seed": seed}
    with RunLog(path, config=config, seed=seed, probes={}, scalars=["episode_return"]) as log:
        for i, r in enumerate(returns):
            log.scalar("episode_return", 100 * (i + 1), r)


def test_best_lr_per_buffer_and_statistics(tmp_path, capsys):
    # 20 episodes per run: the last 10% are the last 2.
    for act, buffer, lr, seed, tail in [("elephant", 32, 1e-3, 0, -110), ("elephant", 32, 1e-3, 1, -120),
                                        ("elephant", 32, 1e-4, 0, -200), ("elephant", 32, 1e-4, 1, -190),
                                        ("relu", 32, 1e-3, 0, -300), ("relu", 32, 1e-3, 1, -250),
                                        ("relu", 10000, 1e-3, 0, -130), ("relu", 10000, 1e-3, 1, -140)]:
        write_run(tmp_path / f"{act}-{buffer}-{lr}-{seed}.h5", act, buffer, lr, seed, [-1000.0] * 18 + [tail] * 2)
    runs = [read_run(p) for p in sorted(tmp_path.glob("*.h5"))]
    rows = {(r.act, r.buffer_size): r for r in classic_table(runs)}
    e = rows[("elephant", 32)]
    assert e.best_lr == 1e-3 and e.mean == pytest.approx(-115) and e.n_seeds == 2
    assert e.sem == pytest.approx(np.std([-110, -120], ddof=1) / math.sqrt(2))
    assert rows[("relu", 32)].mean == pytest.approx(-275) and rows[("relu", 10000)].mean == pytest.approx(-135)
    assert main([str(tmp_path), "-o", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "buffer_sizes.png").stat().st_size > 0
    assert "buffer_sizes.png" in (tmp_path / "out" / "index.html").read_text()
    assert "-115.0" in capsys.readouterr().out


def test_no_runs_is_an_error(tmp_path, capsys):
    assert main([str(tmp_path), "-o", str(tmp_path / "out")]) == 2
    assert "error:" in capsys.readouterr().err
