"""The run folder's life (agents.lifecycle), the same for every learner: which files, in which order, and what a
folder holding an earlier run's files counts as."""

from __future__ import annotations

import json
import os
import signal

import pytest
import yaml

from agents.errors import ConfigError, RunFolderBusy, RunWriteError
from agents.lifecycle import DONE, RunFolder, execute, open_runs, read_done, report_errors

CONFIG = {"algo": "toy", "seed": 0, "lr": 0.1, "steps": (1, 2), "progress": False}


def test_a_fresh_start_clears_an_earlier_run_and_writes_the_config_first(tmp_path, capsys):
    for name in ("run.h5", "summary.json", DONE, "checkpoint.pkl", "keep.txt"):
        (tmp_path / name).write_text("old")
    RunFolder(tmp_path, CONFIG).start(["run.h5"], checkpoint=["checkpoint.pkl"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "keep.txt"]
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == {**CONFIG, "steps": [1, 2]}
    err = capsys.readouterr().err
    assert "replacing the files of an earlier run (run.h5, summary.json, checkpoint.pkl)" in err
    assert "--resume continues it from its checkpoint" in err


def test_finish_writes_the_summary_then_drops_the_checkpoint_then_marks_the_folder_done(tmp_path, monkeypatch):
    run = RunFolder(tmp_path, CONFIG)
    run.start()
    (tmp_path / "checkpoint.pkl").write_text("state")
    order = []
    write = run.write
    monkeypatch.setattr(run, "write", lambda name, content: (order.append((name, (tmp_path / "checkpoint.pkl")
                                                                           .exists())), write(name, content)))
    assert run.finish({"status": "finished", "steps": 3}, checkpoint=["checkpoint.pkl"])["steps"] == 3
    assert order == [("summary.json", True), (DONE, False)]
    assert read_done(tmp_path) == {"config": run.config, "summary": {"status": "finished", "steps": 3}}


@pytest.mark.parametrize("status, done", [("finished", True), ("nan", True), ("interrupted", False)])
def test_only_a_run_that_ended_is_done_and_drops_its_checkpoint(tmp_path, status, done):
    run = RunFolder(tmp_path, CONFIG)
    (tmp_path / "checkpoint.pkl").write_text("state")
    run.finish({"status": status}, checkpoint=["checkpoint.pkl"])
    assert (tmp_path / DONE).exists() == done and (tmp_path / "checkpoint.pkl").exists() != done
    assert json.loads((tmp_path / "summary.json").read_text()) == {"status": status}


def test_a_stop_signal_does_not_cut_the_end_of_a_finished_run_short(tmp_path, monkeypatch):
    run = RunFolder(tmp_path, CONFIG)
    write = run.write

    def signalled(name, content):
        write(name, content)
        if name == "summary.json":
            os.kill(os.getpid(), signal.SIGTERM)  # (between the summary and DONE.json)

    monkeypatch.setattr(run, "write", signalled)
    run.finish({"status": "finished"})
    assert (tmp_path / DONE).exists()


def test_finished_needs_this_config_and_prefers_done_json(tmp_path):
    run = RunFolder(tmp_path, CONFIG, resume=True)
    (tmp_path / "summary.json").write_text(json.dumps({"status": "finished", "steps": 2}))
    assert run.finished() is None  # no config.yaml: not this config's
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**CONFIG, "progress": True}))  # an output key differs
    assert run.finished() == {"status": "finished", "steps": 2}  # (a folder written before DONE.json) ...
    assert read_done(tmp_path)["summary"] == {"status": "finished", "steps": 2}  # ... is marked done as it is
    (tmp_path / DONE).write_text(json.dumps({"config": CONFIG, "summary": {"status": "nan", "steps": 1}}))
    assert run.finished() is None and run.finished(("finished", "nan")) == {"status": "nan", "steps": 1}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**CONFIG, "lr": 0.2}))
    assert run.finished(("finished", "nan")) is None


def test_continuing_removes_the_end_of_the_earlier_attempt_and_keeps_its_config(tmp_path):
    run = RunFolder(tmp_path, CONFIG, resume=True)
    run.start()
    for name in ("model.zip", "summary.json", DONE, "run.h5"):
        (tmp_path / name).write_text("x")
    run.continue_run(final=["model.zip"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "run.h5"]


def test_a_failed_write_names_the_file_and_keeps_what_was_there(tmp_path, monkeypatch):
    run = RunFolder(tmp_path, CONFIG)
    (tmp_path / "summary.json").write_text("old")

    def full(f):
        raise OSError(28, "No space left on device")

    with pytest.raises(RunWriteError, match="summary.json: cannot write it"):
        run.write("summary.json", full)
    assert (tmp_path / "summary.json").read_text() == "old" and not list(tmp_path.glob(".*.tmp"))


def test_open_runs_refuses_a_folder_it_cannot_create_or_another_process_holds(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="cannot create the run directory"):
        with open_runs([tmp_path / "file" / "run"], [CONFIG]):
            pass
    with open_runs([tmp_path / "a"], [CONFIG]) as [run]:
        assert run.path == tmp_path / "a" and (tmp_path / "a").is_dir()
        import subprocess
        import sys

        code = ("import sys; from agents.runlock import run_lock\n"
                f"with run_lock({str(tmp_path / 'a')!r}): pass")
        other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert other.returncode != 0 and "RunFolderBusy" in other.stderr


@pytest.mark.parametrize("before", [b"", b'{"pid": 7, "host": "h", "heartbeat": 0, "released": true}'])
def test_a_refusal_names_a_holder_that_has_locked_but_not_yet_written_its_record(tmp_path, monkeypatch, before):
    import fcntl
    import threading

    from agents import runlock

    fd = os.open(tmp_path / runlock.LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, before)
        fcntl.flock(fd, fcntl.LOCK_EX)  # the holder's lock, taken the moment before it writes who it is
        threading.Timer(0.3, runlock._write, (fd, {"pid": 4242, "host": "h", "heartbeat": 0})).start()
        with pytest.raises(RunFolderBusy, match="in use by pid 4242 on h"):
            with runlock.run_lock(tmp_path):
                pass
        os.ftruncate(fd, 0)
        monkeypatch.setattr(runlock, "HOLDER_WAIT_S", 0.1)
        with pytest.raises(RunFolderBusy, match="in use by another process"):
            with runlock.run_lock(tmp_path):
                pass
    finally:
        os.close(fd)


def test_execute_gives_the_learner_its_locked_run_and_reports_errors_in_one_line(tmp_path, capsys):
    seen = []

    def train(run):
        seen.append((run.path, run.config, run.resume))
        run.start()
        return run.finish({"status": "finished"})

    assert execute(train, CONFIG, tmp_path / "r", resume=True) == {"status": "finished"}
    assert seen == [(tmp_path / "r", {**CONFIG, "steps": [1, 2]}, True)]

    def busy(run):
        raise RunFolderBusy(f"{run.path}: another process writes here")

    status, summary = report_errors("prog", lambda: execute(busy, CONFIG, tmp_path / "r"))
    assert (status, summary) == (3, None)
    assert capsys.readouterr().err == f"prog: error: {tmp_path / 'r'}: another process writes here\n"
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        report_errors("prog", lambda: 1 / 0)
