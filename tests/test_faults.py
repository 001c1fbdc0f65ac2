"""Fault injection on whole runs: concurrent writers on one run folder, dead lock holders, corrupt logs,
and full or failing disks reaching HDF5's own writes (RLIMIT_FSIZE, an LD_PRELOAD write shim)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.errors import EXIT_BUSY
from runlog import read_run
from runlog import RunLogError

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_run_outlives_its_test():
    """Kill the runs a test started (a failed assertion must not leave a 10^7-step run training)."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)


def _train(out: Path, steps: int, **popen) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "agents.train", "dqn", "--env", "CartPole-v1", "--act", "relu",
                             "--hidden", "16", "--set", "learning_starts=50", "--steps", str(steps), "--seed", "0",
                             "--no-progress", "--out", str(out)],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    _STARTED.append(proc)
    return proc


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


def test_a_format_1_log_stays_readable():
    """tests/data/runlog_v1.h5 was written by the code of commit 55b829d (format_version 1, no checksums)."""
    run = read_run(ROOT / "tests" / "data" / "runlog_v1.h5")
    assert run.attrs["format_version"] == 1 and run.config == {"algo": "dqn", "lr": 0.001}
    assert list(run.probes["sparsity"]["step"]) == [0, 10, 20, 30, 40]
    assert list(run.scalars["episode_return"][1]) == [-100.0, -99.0, -98.0, -97.0, -96.0]


def test_a_format_2_log_stays_readable_and_resumable(tmp_path):
    """tests/data/runlog_v2.h5 was written by the code of commit b0c1e2c (format_version 2, no attribute digest):
    read as it is, and resumed (which adds the digest; the version stays 2)."""
    import shutil

    import numpy as np

    from runlog import Field, RunLog

    run = read_run(ROOT / "tests" / "data" / "runlog_v2.h5")
    assert run.attrs["format_version"] == 2 and run.config == {"algo": "dqn", "lr": 0.001}
    assert list(run.probes["sparsity"]["step"]) == [0, 10, 20, 30, 40]
    path = tmp_path / "run.h5"
    shutil.copy(ROOT / "tests" / "data" / "runlog_v2.h5", path)
    with RunLog(path, config={"algo": "dqn", "lr": 0.001}, seed=0, probes={"sparsity": {"dormant": Field((3,))}},
                scalars=("episode_return",)) as log:
        log.append("sparsity", 50, dormant=np.ones(3))
    resumed = read_run(path)
    assert resumed.attrs["format_version"] == 2 and len(resumed.attrs["resumes"]) == 1
    assert list(resumed.probes["sparsity"]["step"]) == [0, 10, 20, 30, 40, 50]


@pytest.mark.parametrize("change", [(b'"lr": 0.001', b'"lr": 0.009'), (b'"algo": "dqn"', b'"algo": "dqm"'),
                                    (b'"act": "elephant"', b'"act": "elephanu"')])
def test_a_changed_byte_in_the_attributes_is_refused(tmp_path, capsys, change):
    """One changed character of the stored config (the chunks' Fletcher-32 sums do not cover attributes) is refused
    by the attributes' digest: by read_run, by the reports' check, and by a resume."""
    from reports.cli import load_runs
    from runlog import RunLog, RunLogError, check_logs

    path = tmp_path / "run.h5"
    _small_log(path)
    data = path.read_bytes()
    old, new = change
    assert data.count(old) == 1
    path.write_bytes(data.replace(old, new))
    with pytest.raises(RunLogError, match="do not match their digest"):
        read_run(path)
    assert "digest" in check_logs([path])[str(path)]
    with pytest.raises(RunLogError, match="digest"):
        load_runs([path])
    with pytest.raises(RunLogError, match="digest"):
        RunLog(path, config={}, seed=0, probes={})


def test_every_public_read_is_bounded_in_time(tmp_path, monkeypatch):
    """A file whose reading never ends (HDF5 can loop on corrupt metadata; here the checking child is made to hang
    once it is ready) is refused after the timeout by read_run and read_log_id, naming it."""
    from runlog import RunLogError, bounded, read_log_id

    path = tmp_path / "run.h5"
    _small_log(path)
    monkeypatch.setattr(bounded, "_CHILD", "import json, time; print(json.dumps({'ready': True}), flush=True); "
                                           "time.sleep(600)")
    for read in (read_run, read_log_id):
        start = time.monotonic()
        with pytest.raises(RunLogError, match=r"run.h5: reading it did not finish within 1 s"):
            read(path, timeout_s=1.0)
        assert time.monotonic() - start < 20


def _small_log(path: Path) -> None:
    import numpy as np

    from runlog import Field, RunLog

    with RunLog(path, config={"algo": "dqn", "lr": 0.001, "act": "elephant"}, seed=0,
                probes={"gradcov": {"td": Field((8, 8))}, "sparsity": {"dormant": Field((3,))}},
                scalars=("episode_return",)) as log:
        rng = np.random.default_rng(0)
        for t in range(20):
            log.append("gradcov", t * 10, td=rng.uniform(-1, 1, (8, 8)))
            log.append("sparsity", t * 10, dormant=rng.uniform(0, 1, 3))
            log.scalar("episode_return", t * 10, float(t))


def _same(a, b) -> bool:
    import numpy as np

    if a.config != b.config or a.seed != b.seed or a.probes.keys() != b.probes.keys() or a.scalars.keys() != b.scalars.keys():
        return False
    for probe, cols in a.probes.items():
        if cols.keys() != b.probes[probe].keys() or not all(np.array_equal(v, b.probes[probe][k]) for k, v in cols.items()):
            return False
    return all(np.array_equal(a.scalars[k][i], b.scalars[k][i]) for k in a.scalars for i in (0, 1))


def test_corrupt_logs_are_rejected_or_read_correctly_within_seconds(tmp_path):
    """A corpus of corrupted copies of one log (random bytes at offsets spread over the file, truncations): each is
    either refused with a reason or reads exactly like the original, and the check takes at most 5 s per file (a
    child process; HDF5 can loop on corrupt metadata). Reading never returns garbage."""
    import numpy as np

    from runlog import check_logs

    good = tmp_path / "good.h5"
    _small_log(good)
    original = read_run(good)
    data = good.read_bytes()
    rng = np.random.default_rng(1)
    corpus = []
    offsets = sorted({100, *rng.integers(0, len(data), 40).tolist(), *range(0, 2048, 128)})
    for i, offset in enumerate(offsets):
        bad = bytearray(data)
        bad[offset: offset + 16] = rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
        corpus.append(tmp_path / f"bytes_{i}_{offset}.h5")
        corpus[-1].write_bytes(bytes(bad))
    for cut in (10, 1000, len(data) // 2, len(data) - 1):
        corpus.append(tmp_path / f"cut_{cut}.h5")
        corpus[-1].write_bytes(data[:cut])
    for path in corpus:  # finished logs (files modified in the last minute may be live and get slower SWMR retries)
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    start = time.monotonic()
    verdicts = check_logs(corpus)
    assert time.monotonic() - start < 30, "the check is meant to take well under a second per file"
    garbage = []
    for path in corpus:
        if verdicts[str(path)] is None:
            if not _same(read_run(path, timeout_s=None), original):  # (checked just above)
                garbage.append(path.name)
    assert not garbage, f"read as valid but different from the original: {garbage}"
    assert sum(v is not None for v in verdicts.values()) >= len(corpus) // 4  # most damage is detected, not absent


def test_reports_skip_a_corrupt_log_instead_of_hanging(tmp_path, capsys):
    """Random bytes at offset 100 of a valid log used to hang `python -m reports` inside h5py for ever."""
    import numpy as np

    from reports.cli import load_runs

    folder = tmp_path / "runs"
    folder.mkdir()
    _small_log(folder / "good.h5")
    data = bytearray((folder / "good.h5").read_bytes())
    data[100:116] = np.random.default_rng(0).integers(0, 256, 16, dtype=np.uint8).tobytes()
    (folder / "bad.h5").write_bytes(bytes(data))
    start = time.monotonic()
    runs = load_runs([folder])
    assert time.monotonic() - start < 30
    assert [Path(r.path).name for r in runs] == ["good.h5"]
    assert "skipping" in capsys.readouterr().err


def _dqn_with_file_limit(out: Path, limit_bytes: int, *flags: str) -> subprocess.CompletedProcess:
    """A small DQN run in a child whose files may not grow past ``limit_bytes`` (RLIMIT_FSIZE, SIGXFSZ ignored: the
    kernel refuses the write with EFBIG, inside HDF5's or pickle's own C code)."""
    import resource

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run([sys.executable, "-m", "agents.train", "dqn", "--env", "CartPole-v1", "--act", "relu",
                           "--hidden", "16", "--set", "learning_starts=50", "--no-progress", "--out", str(out), *flags],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, preexec_fn=limit, timeout=300)


def test_a_write_error_in_hdf5_stops_the_run_visibly(tmp_path):
    """RLIMIT_FSIZE in the child makes the kernel refuse HDF5's own C writes past 300 kB (EFBIG, with SIGXFSZ
    ignored): the run stops with exit status 4 and a message, and the log reads back only complete records."""
    import numpy as np

    from agents.errors import EXIT_IO

    proc = _dqn_with_file_limit(tmp_path, 300_000, "--steps", "20000", "--probe", "gradcov,weights", "--probe-every",
                                "20")
    assert proc.returncode == EXIT_IO, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]  # (h5py prints its own reports of freed objects before it)
    assert "cannot write the run log" in last and "File too large" in last
    log = _run_dir(tmp_path) / "run.h5"
    try:
        run = read_run(log)
    except Exception as err:  # refused as a whole is fine too, as long as it says so
        assert "run log" in str(err) or str(log) in str(err)
        return
    steps = run.probes["gradcov"]["step"]
    assert len(steps) > 0 and np.all(np.diff(steps) > 0) and np.all(steps >= 0)
    assert not np.any(np.all(run.probes["gradcov"]["td"] == 0, axis=(1, 2)))  # no zero-filled records


def test_the_log_of_a_killed_run_passes_the_check_and_reaches_reports(tmp_path):
    """A SIGKILLed writer leaves its SWMR flag set: a plain read refuses the file, the check retries in SWMR mode."""
    from runlog import check_logs
    from reports.cli import load_runs

    proc = _train(tmp_path, 10**7)
    log = _wait_for(lambda: _run_dir(tmp_path) / "run.h5", proc)

    def episodes() -> int:
        try:
            return len(read_run(log).scalars.get("episode_return", ((),))[0])
        except RunLogError:  # still being created (locked until its writer enters SWMR mode)
            return 0

    while episodes() < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert check_logs([log]) == {str(log): None}
    assert len(load_runs([tmp_path])) == 1


def test_the_check_never_blames_a_file_for_the_next_ones_time():
    """Two results arriving in one pipe read, then a slow file: both results count (a buffered line is not lost)."""
    from runlog.bounded import _collect

    code = ("import json, time; print(json.dumps({'ready': True}) + '\\n' + json.dumps({'path': 'a', 'error': None})"
            " + '\\n' + json.dumps({'path': 'b', 'error': None}), flush=True); time.sleep(10)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert _collect(child, ["a", "b", "c"], 1.0) == {"a": None, "b": None}
    finally:
        child.kill()
        child.wait()


def test_a_crashed_run_leaves_no_run_end(tmp_path, monkeypatch):
    """A genuine error (not a divergence) inside training: the log is closed readable, without a run_end record, so
    reports do not count the run as finished."""
    import pytest

    from agents.train import main
    from probes.builtin import WeightsProbe
    from reports.data import finished, run_end

    calls = []
    real = WeightsProbe.compute

    def flaky(self, ctx):
        calls.append(ctx.step)
        if len(calls) == 3:
            raise KeyError("injected")
        return real(self, ctx)

    monkeypatch.setattr(WeightsProbe, "compute", flaky)
    with pytest.raises(KeyError, match="injected"):
        main(["dqn", "--env", "CartPole-v1", "--act", "relu", "--hidden", "16", "--set", "learning_starts=50",
              "--steps", "2000", "--probe", "weights", "--probe-every", "100", "--no-progress", "--out", str(tmp_path)])
    run = read_run(_run_dir(tmp_path) / "run.h5")
    assert run_end(run) is None and not finished(run)
    assert len(run.probes["weights"]["step"]) == 2


def test_a_checkpoint_that_cannot_be_written_stops_the_run_visibly(tmp_path):
    """A file size limit the log fits under but a checkpoint (the replay buffer) does not: exit status 4 with a
    message naming the checkpoint; no torn temporary file is left and the log stays readable."""
    from agents.errors import EXIT_IO

    proc = _dqn_with_file_limit(tmp_path, 400_000, "--steps", "3000", "--set", "buffer_size=50000",
                                "--checkpoint-every", "500")
    assert proc.returncode == EXIT_IO, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "cannot write the checkpoint" in last and "File too large" in last
    run_dir = _run_dir(tmp_path)
    assert not (run_dir / "checkpoint.pkl.tmp").exists() and not (run_dir / "checkpoint.pkl").exists()
    assert len(read_run(run_dir / "run.h5").scalars["episode_return"][0]) > 0


@pytest.fixture(scope="module")
def failwrite(tmp_path_factory) -> Path:
    """The LD_PRELOAD write shim (tests/faultshim/failwrite.c), built with the system C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the write shim")
    lib = tmp_path_factory.mktemp("shim") / "failwrite.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(lib), str(ROOT / "tests/faultshim/failwrite.c"), "-ldl"],
                   check=True, capture_output=True)
    return lib


def _dqn_with_failing_disk(out: Path, lib: Path, path: str, errno: int, mode: str, after: int,
                           *extra: str) -> subprocess.CompletedProcess:
    env = {**ENV, "LD_PRELOAD": str(lib), "FAILWRITE_PATH": path, "FAILWRITE_ERRNO": str(errno),
           "FAILWRITE_MODE": mode, "FAILWRITE_AFTER": str(after)}
    return subprocess.run([sys.executable, "-m", "agents.train", "dqn", "--env", "CartPole-v1", "--act", "relu",
                           "--hidden", "16", "--set", "learning_starts=50", "--steps", "20000", "--probe",
                           "gradcov,weights", "--probe-every", "20", "--no-progress", "--out", str(out), *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _complete_records(log: Path) -> dict:
    """The log's records, checked to be real ones (steps ascending and >= 0, no zero-filled gradient records)."""
    import numpy as np

    run = read_run(log)
    steps = run.probes["gradcov"]["step"]
    assert len(steps) > 0 and np.all(np.diff(steps) > 0) and np.all(steps >= 0)
    assert not np.any(np.all(run.probes["gradcov"]["td"] == 0, axis=(1, 2)))
    return run.scalars


@pytest.mark.parametrize("errno, mode, words, end", [
    # a full disk: the pre-allocated run_end fits, but HDF5 must also flush what it could not write before, so the
    # record may be missing (a reader then treats the run as unfinished; never a wrong status)
    (28, "full", "No space left on device", ("write_error", None)),
    (5, "fail", "Input/output error", (None,)),  # a failing disk takes nothing more: no run_end, records before kept
])
def test_enospc_and_eio_in_hdf5s_own_writes_stop_the_run_visibly(tmp_path, failwrite, errno, mode, words, end):
    from agents.errors import EXIT_IO
    from runlog import RUN_END

    proc = _dqn_with_failing_disk(tmp_path, failwrite, "run.h5", errno, mode, 400_000)
    assert proc.returncode == EXIT_IO, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "cannot write the run log" in last and words in last, last
    scalars = _complete_records(_run_dir(tmp_path) / "run.h5")
    ends = [RUN_END[int(v)] for v in scalars["run_end"][1]]
    assert (ends[0] if ends else None) in end and len(ends) <= 1


def test_a_full_disk_while_checkpointing_stops_the_run_and_the_log_says_why(tmp_path, failwrite):
    from agents.errors import EXIT_IO
    from runlog import RUN_END

    proc = _dqn_with_failing_disk(tmp_path, failwrite, "checkpoint.pkl", 28, "full", 0, "--checkpoint-every", "500")
    assert proc.returncode == EXIT_IO, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "cannot write the checkpoint (No space left on device)" in last, last
    run_dir = _run_dir(tmp_path)
    assert not list(run_dir.glob("checkpoint.pkl*"))  # no torn temporary file
    steps, values = _complete_records(run_dir / "run.h5")["run_end"]
    assert [RUN_END[int(v)] for v in values] == ["write_error"] and steps[0] >= 500


def test_a_grid_running_its_runs_in_process_survives_a_full_disk(tmp_path, failwrite):
    """``--workers 1`` runs in the grid process: a failed write is a failed run with a one-line reason (the OS's
    words); no further run starts in a process whose HDF5 saw the failure, and the grid exits 1 instead of crashing
    on the failed file's HDF5 objects."""
    import yaml

    grid = tmp_path / "grid.yml"
    grid.write_text(yaml.safe_dump({"command": "dqn", "grids": [{"seed": [0, 1]}], "fixed": {
        "env": "CartPole-v1", "act": "relu", "net_arch": [16], "learning_starts": 50, "n_timesteps": 20000,
        "probe": ["gradcov", "weights"], "probe_every": 20}}))
    env = {**ENV, "LD_PRELOAD": str(failwrite), "FAILWRITE_PATH": "run.h5", "FAILWRITE_ERRNO": "28",
           "FAILWRITE_MODE": "full", "FAILWRITE_AFTER": "150000"}
    proc = subprocess.run([sys.executable, "-m", "agents.grid", str(grid), "--out", str(tmp_path / "runs"),
                           "--workers", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "0 finished, 1 failed, 0 interrupted, 1 not started" in proc.stderr
    assert "no further runs start" in proc.stderr
    reasons = proc.stderr.split("failed runs:")[1].strip().splitlines()
    assert len(reasons) == 1 and "(No space left on device)" in reasons[0], reasons


def test_a_full_disk_before_the_run_starts_is_a_message_not_a_traceback(tmp_path, failwrite):
    from agents.errors import EXIT_IO

    env = {**ENV, "LD_PRELOAD": str(failwrite), "FAILWRITE_PATH": ".lock", "FAILWRITE_ERRNO": "28",
           "FAILWRITE_MODE": "fail", "FAILWRITE_AFTER": "0"}
    proc = subprocess.run([sys.executable, "-m", "agents.train", "dqn", "--env", "CartPole-v1", "--steps", "500",
                           "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == EXIT_IO and "Traceback" not in proc.stderr, proc.stderr
    assert "cannot write the run lock (No space left on device)" in proc.stderr


_POPULATION = ["-m", "agents.train", "dqn", "--env", "Acrobot-v1", "--act", "relu", "--seeds", "0-2", "--steps",
               "600", "--set", "max_episode_steps=150", "--set", "learning_starts=200", "--set", "hidden=[64]",
               "--checkpoint-every", "200", "--lr", "1e-3", "--buffer-size", "10000", "--no-progress"]


def test_a_population_refuses_a_run_folder_another_process_writes(tmp_path):
    """As ``agents.train``: a member folder whose run lock another process holds stops the population before it
    writes anything (exit status 3, naming the holder)."""
    from agents.population.engine import Member
    from agents.population.run import member_configs, member_dirs
    from agents.runlock import run_lock

    configs = member_configs({"env": "Acrobot-v1", "act": "relu", "n_timesteps": 600,
                              "set": ["max_episode_steps=150", "learning_starts=200", "hidden=[64]"]},
                             [Member(s, 1e-3, 10_000) for s in range(3)])
    busy = member_dirs(configs, tmp_path)[1]
    busy.mkdir(parents=True)
    with run_lock(busy):
        proc = subprocess.run([sys.executable, *_POPULATION, "--out", str(tmp_path)], cwd=ROOT, env=ENV,
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == EXIT_BUSY, proc.stderr
    assert f"run folder {busy} is in use by pid {os.getpid()}" in proc.stderr
    assert not list(tmp_path.rglob("run.h5"))


@pytest.mark.parametrize("engine", ["exact", "device"])
def test_a_full_disk_while_a_population_checkpoints_stops_it_and_the_last_checkpoint_resumes(tmp_path, failwrite,
                                                                                              engine):
    """The disk fills during the second checkpoint: exit status 4 with the OS's words, no torn temporary file, the
    first checkpoint intact, every member's log readable with run_end "write_error"; ``--resume`` (space freed)
    continues from the first checkpoint to the end. The exact engine and the device step alike."""
    import cloudpickle

    from agents.population.device import DevicePopulation
    from agents.population.engine import Member, Population
    from agents.population.run import member_configs
    from agents.errors import EXIT_IO
    from runlog import RUN_END
    from reports.data import finished

    members = [Member(s, 1e-3, 10_000) for s in range(3)]
    configs = member_configs({"env": "Acrobot-v1", "act": "relu", "n_timesteps": 600,
                              "set": ["max_episode_steps=150", "learning_starts=200", "hidden=[64]"]}, members)
    pop = Population(configs[0], members) if engine == "exact" else DevicePopulation(configs[0], members)
    size = len(cloudpickle.dumps(pop))  # a checkpoint's size, to within its logs' state
    env = {**ENV, "LD_PRELOAD": str(failwrite), "FAILWRITE_PATH": ".pkl", "FAILWRITE_ERRNO": "28",
           "FAILWRITE_MODE": "full", "FAILWRITE_AFTER": str(int(1.5 * size))}
    chosen = [] if engine == "exact" else ["--set", "population_engine=device"]
    args = [sys.executable, *_POPULATION, *chosen, "--out", str(tmp_path)]
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == EXIT_IO, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "cannot write the checkpoint (No space left on device)" in last and "Traceback" not in proc.stderr, last
    names = sorted(p.name for p in (tmp_path / "populations").iterdir())  # the first checkpoint and its members'
    assert len(names) == 2 and names[0].endswith(".members.json") and names[1].endswith(".pkl")  # list; no .tmp
    logs = sorted(tmp_path.rglob("run.h5"))
    assert len(logs) == 3
    for log in logs:
        steps, values = read_run(log).scalars["run_end"]
        assert [RUN_END[int(v)] for v in values] == ["write_error"] and steps[0] == 400
    resumed = subprocess.run([*args, "--resume"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0 and "resuming the population of 3 at step 200" in resumed.stderr, resumed.stderr
    assert all(finished(read_run(log)) for log in logs)


@pytest.mark.long
@pytest.mark.parametrize("seeds", ["0", "0-1"])
def test_a_full_disk_while_atari_replay_frames_are_written_stops_the_run_and_the_last_checkpoint_resumes(
        tmp_path, failwrite, seeds):
    """Atari DQN on the frame replay, a single run (``--seeds 0``) and a population of two (``0-1``): the disk fills
    while the second checkpoint writes its replay chunk files. Exit status 4 with the OS's words in one line, no torn
    chunk or checkpoint file, the first checkpoint and the chunks it names intact; ``--resume`` (space freed)
    continues from the first checkpoint to the end."""
    from agents.errors import EXIT_IO
    from reports.data import finished

    members = 2 if "-" in seeds else 1
    args = [sys.executable, "-m", "agents.train", "dqn", "--env", "ALE/Breakout-v5", "--act", "relu", "--seeds",
            seeds, "--steps", "1200", "--set", "atari_env=ale-vector", "--set", "max_episode_steps=300", "--set",
            "buffer_size=2000", "--checkpoint-every", "400", "--no-progress", "--out", str(tmp_path)]
    frames = 400 * 84 * 84 * members  # (about what each checkpoint's chunks hold: a frame per step, a few more)
    env = {**ENV, "LD_PRELOAD": str(failwrite), "FAILWRITE_PATH": "replay/frames-", "FAILWRITE_ERRNO": "28",
           "FAILWRITE_MODE": "full", "FAILWRITE_AFTER": str(int(1.5 * frames))}
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == EXIT_IO, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "(No space left on device); the disk may be full" in last and "Traceback" not in proc.stderr, last
    assert not list(tmp_path.rglob("*.tmp"))
    chunks = sorted(tmp_path.rglob("replay/frames-*.npy"))
    assert len(chunks) >= members and all(c.name.startswith("frames-000000000000-") for c in chunks[:members])
    resumed = subprocess.run([*args, "--resume"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at step 400" in resumed.stderr, resumed.stderr[-3000:]
    logs = sorted(tmp_path.rglob("run.h5"))
    assert len(logs) == members and all(finished(read_run(log)) for log in logs)


def _killed_dqn_run(out: Path) -> Path:
    """The folder of a DQN run killed right after its second checkpoint (a checkpoint and a log to resume)."""
    from runlog.failpoints import ENV as KILL_AT

    cmd = [sys.executable, "-m", "agents.train", "dqn", "--env", "CartPole-v1", "--act", "relu", "--hidden", "16",
           "--set", "learning_starts=50", "--steps", "2000", "--checkpoint-every", "400", "--probe", "weights",
           "--probe-every", "200", "--no-progress", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env={**ENV, KILL_AT: "checkpoint.after_rename:2"}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    return _run_dir(out)


def _resume(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agents.train", "dqn", "--env", "CartPole-v1", "--act", "relu",
                           "--hidden", "16", "--set", "learning_starts=50", "--steps", "2000", "--checkpoint-every",
                           "400", "--probe", "weights", "--probe-every", "200", "--no-progress", "--out", str(out),
                           "--resume"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "missing", "attribute"])
def test_resume_with_a_damaged_log_is_bad_input_in_one_line(tmp_path, damage):
    """--resume of a run whose run.h5 is truncated, corrupt, missing or has a changed attribute: exit status 2, one
    line naming the log, no traceback."""
    run_dir = _killed_dqn_run(tmp_path)
    log = run_dir / "run.h5"
    data = log.read_bytes()
    if damage == "truncated":
        log.write_bytes(data[: len(data) // 2])
    elif damage == "corrupt":
        log.write_bytes(data[:100] + bytes(64) + data[164:])
    elif damage == "missing":
        log.unlink()
    else:
        log.write_bytes(data.replace(b'"learning_starts": 50', b'"learning_starts": 90'))
    proc = _resume(tmp_path)
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and len(errors) == 1 and "run.h5" in errors[0], proc.stderr[-3000:]


def test_resume_while_a_reader_holds_the_log_names_it_with_status_3(tmp_path):
    """--resume while another process reads the run's log (an HDF5 reader holds it open): exit status 3, one line
    saying the log is in use; after the reader closes it, the resume finishes."""
    run_dir = _killed_dqn_run(tmp_path)
    reader = subprocess.Popen([sys.executable, "-c", "import sys, time, h5py; f = h5py.File(sys.argv[1], 'r', "
                               "swmr=True); print('open', flush=True); time.sleep(600)", str(run_dir / "run.h5")],
                              stdout=subprocess.PIPE, text=True)
    _STARTED.append(reader)
    assert reader.stdout.readline().strip() == "open"
    proc = _resume(tmp_path)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "in use by another process" in proc.stderr, proc.stderr[-3000:]
    reader.kill()
    reader.wait()
    done = _resume(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_run(run_dir / "run.h5").scalars["run_end"][1].tolist() == [0.0]  # finished


@pytest.mark.parametrize("name", ["model.zip", "summary.json", "config.yaml"])
def test_a_final_file_that_cannot_be_written_stops_the_run_with_status_4(tmp_path, failwrite, name):
    """A full disk while a run writes model.zip, summary.json or config.yaml: exit status 4 with one line naming the
    file, no torn file left (each is written whole or not at all), and a log that does not say "finished" while
    model.zip is missing."""
    from agents.errors import EXIT_IO
    from runlog import RUN_END

    proc = _dqn_with_failing_disk(tmp_path, failwrite, name, 28, "full", 1000 if name == "model.zip" else 0,
                                  "--steps", "600")
    assert proc.returncode == EXIT_IO, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert f"{name}: cannot write it (No space left on device)" in last and "Traceback" not in proc.stderr, last
    run_dir = next(p.parent for p in tmp_path.rglob("run.h5")) if name != "config.yaml" else None
    if run_dir is not None:
        assert not list(run_dir.glob(f".{name}.tmp")) and not (run_dir / name).exists()
        ends = [RUN_END[int(v)] for v in read_run(run_dir / "run.h5").scalars["run_end"][1]]
        assert ends == (["write_error"] if name == "model.zip" else ["finished"])
