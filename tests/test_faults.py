"""Fault injection on whole runs (issue 13): concurrent writers on one run folder, dead lock holders."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agents.train import EXIT_BUSY
from probes import read_run

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def _train(out: Path, steps: int, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agents.train", "dqn", "--env", "CartPole-v1", "--act", "relu",
                             "--hidden", "16", "--set", "learning_starts=50", "--steps", str(steps), "--seed", "0",
                             "--no-progress", "--out", str(out)],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _run_dir(out: Path) -> Path:
    (found,) = [p.parent for p in out.rglob("config.yaml")]
    return found


def _wait_for(path_fn, proc: subprocess.Popen, timeout: float = 60) -> Path:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            path = path_fn()
            if path.exists():
                return path
        except ValueError:
            pass
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.1)
    raise AssertionError("the run did not start")


def test_a_second_writer_on_a_run_folder_is_refused_and_a_dead_holder_is_not(tmp_path):
    first = _train(tmp_path, 10**7)
    log = _wait_for(lambda: _run_dir(tmp_path) / "run.h5", first)
    second = _train(tmp_path, 10**7)
    _, err = second.communicate(timeout=60)
    assert second.returncode == EXIT_BUSY, err
    assert f"is in use by pid {first.pid}" in err and "Traceback" not in err
    assert log.exists() and first.poll() is None  # the first run goes on, its log untouched
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=30)
    third = _train(tmp_path, 300)  # the kernel released the dead holder's lock
    out, err = third.communicate(timeout=120)
    assert third.returncode == 0, err
    assert json.loads(out)["status"] == "finished"
    assert len(read_run(log).scalars["episode_return"][0]) > 0


def test_two_writers_started_together_one_runs_one_is_refused(tmp_path):
    procs = [_train(tmp_path, 10**7) for _ in range(2)]
    deadline = time.time() + 90
    while all(p.poll() is None for p in procs) and time.time() < deadline:
        time.sleep(0.1)
    loser = next(p for p in procs if p.poll() is not None)
    winner = next(p for p in procs if p is not loser)
    _, err = loser.communicate()
    assert loser.returncode == EXIT_BUSY and f"in use by pid {winner.pid}" in err, err
    _wait_for(lambda: _run_dir(tmp_path) / "run.h5", winner)
    time.sleep(1.0)
    winner.send_signal(signal.SIGTERM)  # stops cleanly, saving model and log
    _, err = winner.communicate(timeout=60)
    assert winner.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
    run = read_run(_run_dir(tmp_path) / "run.h5")
    assert run.scalars["run_end"][1][-1] == 1  # interrupted
