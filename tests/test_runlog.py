"""Tests of the runlog package (HDF5 run log), its provenance and its bounded reads."""

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from runlog import Field, RunLog, RunLogError, find_runs, read_log_id, read_run
from runlog.provenance import provenance

ROOT = Path(__file__).resolve().parents[1]
WRITER = Path(__file__).with_name("_runlog_writer.py")
PROBES = {"weights": {"matrix": Field((32, 32)), "loss": Field(())}}


def make_log(path, steps, **kwargs):
    """Write records of PROBES and scalar 'reward' at `steps`; values are functions of step."""
    kwargs = {"config": {"lr": 0.001, "layers": [64, 64]}, "seed": 3, "probes": PROBES,
              "scalars": ["reward"], **kwargs}
    with RunLog(path, **kwargs) as log:
        for step in steps:
            log.append("weights", step, matrix=np.full((32, 32), step, dtype=np.float64),
                       loss=step / 2)
            log.scalar("reward", step, step * 10.0)


def assert_records(run, steps):
    steps = np.asarray(steps)
    weights = run.probes["weights"]
    np.testing.assert_array_equal(weights["step"], steps)
    assert weights["matrix"].shape == (len(steps), 32, 32)
    assert weights["matrix"].dtype == np.float32
    np.testing.assert_array_equal(weights["matrix"][:, 5, 7], steps)
    np.testing.assert_array_equal(weights["loss"], steps / 2)
    reward_steps, rewards = run.scalars["reward"]
    np.testing.assert_array_equal(reward_steps, steps)
    np.testing.assert_array_equal(rewards, steps * 10.0)


def start_writer(path, n_records, sleep_s):
    return subprocess.Popen([sys.executable, str(WRITER), str(path), str(n_records), str(sleep_s)],
                            stdout=subprocess.PIPE, text=True)


def wait_for_records(proc, n):
    """Steps reported by the writer subprocess, once it has reported `n` records."""
    return [int(proc.stdout.readline()) for _ in range(n)]


def test_round_trip_schema_and_attrs(tmp_path):
    path = tmp_path / "run.h5"
    make_log(path, range(5), device="cuda:0", probe_settings={"every": 100},
             extra_attrs={"agent": "dqn", "tags": ["a", "b"]})
    run = read_run(path)
    assert run.path == str(path)
    assert run.config == {"lr": 0.001, "layers": [64, 64]}
    assert run.seed == 3
    assert run.attrs["format"] == "interference-runlog"
    assert run.attrs["format_version"] == 3
    assert run.attrs["device"] == "cuda:0"
    assert run.attrs["probe_settings"] == {"every": 100}
    assert run.attrs["agent"] == "dqn" and run.attrs["tags"] == ["a", "b"]
    assert {"versions", "git_commit", "git_dirty", "hostname", "platform", "time_utc",
            "argv"} <= set(run.attrs["provenance"])
    assert_records(run, range(5))
    with h5py.File(path, "r") as f:  # the documented layout, readable without this module
        assert json.loads(f.attrs["config"])["lr"] == 0.001
        assert f["probes/weights/matrix"].maxshape == (None, 32, 32)
        assert f["scalars/reward/value"].dtype == np.float64
        assert f["probes/weights/step"].dtype == np.int64


def test_provenance_keys():
    prov = provenance()
    assert prov["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert prov["versions"]["h5py"] == h5py.__version__
    assert isinstance(prov["git_commit"], str) and prov["git_dirty"] in (True, False, None)
    assert prov["argv"] == sys.argv
    json.dumps(prov)


def test_append_validation_errors(tmp_path):
    with RunLog(tmp_path / "run.h5", config={}, seed=0, probes=PROBES, scalars=["reward"]) as log:
        with pytest.raises(ValueError, match=r"probe 'weights' field 'matrix': expected shape "
                                             r"\(32, 32\), got \(32, 31\)"):
            log.append("weights", 0, matrix=np.zeros((32, 31)), loss=0.0)
        with pytest.raises(ValueError, match=r"probe 'weights': missing fields \['loss'\]"):
            log.append("weights", 0, matrix=np.zeros((32, 32)))
        with pytest.raises(ValueError, match=r"unexpected fields \['acc'\]"):
            log.append("weights", 0, matrix=np.zeros((32, 32)), loss=0.0, acc=1.0)
        with pytest.raises(ValueError, match="expected dtype float32, got complex128"):
            log.append("weights", 0, matrix=np.zeros((32, 32), complex), loss=0.0)
        with pytest.raises(ValueError, match="unknown probe 'grads'"):
            log.append("grads", 0, x=1.0)
        with pytest.raises(ValueError, match=r"unknown scalar 'return'; declared scalars: \['reward'\]"):
            log.scalar("return", 0, 1.0)
    assert_records(read_run(tmp_path / "run.h5"), [])


def test_resume_appends_and_adds_probes(tmp_path):
    path = tmp_path / "run.h5"
    make_log(path, range(3))
    make_log(path, range(3, 6), config={"lr": 0.01}, seed=3,
             probes={**PROBES, "new": {"x": Field((2,), "int64")}})
    run = read_run(path)
    assert_records(run, range(6))
    assert run.config == {"lr": 0.001, "layers": [64, 64]}  # original config kept
    (resume,) = run.attrs["resumes"]
    assert resume["changed"] == {"config": {"lr": 0.01}}
    assert "git_commit" in resume["provenance"]
    assert run.probes["new"]["x"].shape == (0, 2)


def test_a_log_keeps_its_id_when_resumed_and_a_fresh_log_gets_a_new_one(tmp_path):
    """A resume keeps a log's id, a fresh run in its place gets a new one, a log from before ids gets one when
    resumed."""
    path = tmp_path / "run.h5"
    make_log(path, range(2))
    first = read_log_id(path)
    assert re.fullmatch(r"[0-9a-f]{32}", first) and read_run(path).attrs["log_id"] == first
    make_log(path, range(2, 4))  # resumed
    assert read_log_id(path) == first
    make_log(path, range(2), overwrite=True)  # a fresh run in the same place, same config and second
    assert read_log_id(path) not in (None, first)
    with pytest.raises(ValueError, match=r"reserved attribute names \['log_id'\]"):
        RunLog(tmp_path / "other.h5", config={}, seed=0, probes=PROBES, extra_attrs={"log_id": "mine"})
    with h5py.File(path, "a") as f:  # a log written before ids (and digests, version 2): none, not an error
        del f.attrs["log_id"], f.attrs["attrs_sha256"]
        f.attrs["format_version"] = 2
    assert read_log_id(path) is None
    make_log(path, range(2, 4))  # its first resume gives it one, which later resumes keep
    given = read_log_id(path)
    assert re.fullmatch(r"[0-9a-f]{32}", given) and given != first
    make_log(path, range(4, 6))
    assert read_log_id(path) == given
    assert_records(read_run(path), range(6))


def test_an_hdf5_runtime_error_on_open_is_a_run_log_error(tmp_path, monkeypatch):
    # (h5py raises RuntimeError, not OSError, for some corrupt superblocks)
    path = tmp_path / "run.h5"
    make_log(path, range(1))

    def corrupt(*args, **kwargs):
        raise RuntimeError("Unable to open file (bad superblock)")

    monkeypatch.setattr(h5py, "File", corrupt)
    with pytest.raises(RunLogError, match=r"corrupt or truncated HDF5 file, cannot open it: .*bad superblock"):
        read_log_id(path)


@pytest.mark.parametrize("call", ["RunLog(sys.argv[1], config={}, seed=0, probes={})", "read_run(sys.argv[1])",
                                  "read_log_id(sys.argv[1])"])
def test_a_log_with_a_corrupt_superblock_is_refused_at_once(tmp_path, call):
    """Appending to or reading a log with a bad metadata checksum is refused with a RunLogError, not retried for
    minutes as HDF5's SWMR reader does (in a child process, so that a hang fails the test instead of stalling it)."""
    path = tmp_path / "run.h5"
    make_log(path, range(2))
    data = bytearray(path.read_bytes())
    data[12] ^= 0xFF  # (inside the superblock, which its checksum covers)
    path.write_bytes(bytes(data))
    code = ("import sys; from runlog import RunLog, RunLogError, read_log_id, read_run\n"
            f"try:\n    {call}\nexcept RunLogError as err:\n    print(err)")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert "corrupt or truncated HDF5 file, cannot open it" in proc.stdout and "checksum" in proc.stdout, \
        proc.stdout + proc.stderr[-2000:]


def test_appending_to_a_log_left_open_with_a_bad_header_is_refused_in_seconds(tmp_path):
    """A log a killed writer left open opens only in SWMR mode, whose reader retries a bad checksum for minutes:
    appending (a resume) checks it in a child process with a time limit first and refuses it, naming why."""
    from _runlog_writer import left_open_with_a_bad_header

    path = tmp_path / "run.h5"
    left_open_with_a_bad_header(path)
    code = ("import sys; from runlog import RunLog, RunLogError\n"
            "try:\n    RunLog(sys.argv[1], config={}, seed=0, probes={})\nexcept RunLogError as err:\n    print(err)")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert "left open by its writer and unreadable: reading it did not finish within" in proc.stdout, \
        proc.stdout + proc.stderr[-2000:]


def test_appending_to_a_log_another_process_holds_outside_swmr_mode_says_so(tmp_path):
    """Refused at once, naming the lock (not checked in a child as a killed writer's log is: the holder is alive)."""
    path = tmp_path / "run.h5"
    make_log(path, range(2))
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time, h5py; f = h5py.File(sys.argv[1], 'a'); "
                               "print('open', flush=True); time.sleep(60)", str(path)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(RunLogError, match=r"^\S*run\.h5: locked by another process writing it outside SWMR mode"):
            RunLog(path, config={}, seed=0, probes=PROBES)
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_resume_with_conflicting_field_fails(tmp_path):
    path = tmp_path / "run.h5"
    make_log(path, range(2))
    with pytest.raises(RunLogError, match=r"probe 'weights' is declared with fields .*"
                                          r"matrix: shape \(16, 16\) float32.* but the file has"):
        RunLog(path, config={}, seed=0,
               probes={"weights": {"matrix": Field((16, 16)), "loss": Field(())}})
    assert_records(read_run(path), range(2))


def test_overwrite(tmp_path):
    path = tmp_path / "run.h5"
    make_log(path, range(4))
    make_log(path, [10, 11], overwrite=True)
    run = read_run(path)
    assert_records(run, [10, 11])
    assert "resumes" not in run.attrs


def test_sigkill_keeps_all_but_last_record_and_resume_repairs(tmp_path):
    path = tmp_path / "run.h5"
    proc = start_writer(path, 100_000, 0.001)
    wait_for_records(proc, 20)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reported = [int(line) for line in proc.stdout.read().split()]
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    n_reported = 20 + len(reported)

    run = read_run(path)
    n = len(run.probes["weights"]["step"])
    assert n >= n_reported - 1
    weights = run.probes["weights"]
    np.testing.assert_array_equal(weights["step"], np.arange(n))
    np.testing.assert_array_equal(weights["matrix"][:, 31, 31], np.arange(n))
    np.testing.assert_array_equal(weights["loss"], np.arange(n) / 2)

    # Resuming repairs the file left by the killed writer and appends after its records.
    with RunLog(path, config={}, seed=7, probes=PROBES, scalars=["reward"]) as log:
        log.append("weights", n, matrix=np.full((32, 32), n), loss=n / 2)
    run = read_run(path)
    assert run.config == {"writer": "subprocess"} and len(run.attrs["resumes"]) == 1
    weights = run.probes["weights"]
    np.testing.assert_array_equal(weights["step"], np.arange(n + 1))
    np.testing.assert_array_equal(weights["matrix"][:, 0, 0], np.arange(n + 1))


def test_reader_follows_live_writer(tmp_path):
    path = tmp_path / "run.h5"
    proc = start_writer(path, 100_000, 0.002)
    try:
        wait_for_records(proc, 3)
        first = read_run(path)
        with h5py.File(path, "r", libver="latest", swmr=True) as f:  # long-lived SWMR reader
            step = f["probes/weights/step"]
            seen = len(step)
            while int(proc.stdout.readline()) < seen + 10:  # (lines may be queued from before the reader opened)
                pass
            step.refresh()
            assert len(step) > seen
        second = read_run(path)
        with pytest.raises(RunLogError, match="in use by another process"):
            RunLog(path, config={}, seed=7, probes=PROBES)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    n1, n2 = len(first.probes["weights"]["step"]), len(second.probes["weights"]["step"])
    assert 3 <= n1 < n2
    for run in (first, second):
        n = len(run.probes["weights"]["step"])
        assert run.probes["weights"]["matrix"].shape == (n, 32, 32)
        assert len(run.scalars["reward"][0]) >= n - 1


def test_not_hdf5_file(tmp_path):
    path = tmp_path / "noise.h5"
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(RunLogError, match=rf"{re.escape(str(path))}: not an HDF5 file"):
        read_run(path)
    with pytest.raises(RunLogError, match="not an HDF5 file"):
        RunLog(path, config={}, seed=0, probes=PROBES)


@pytest.mark.parametrize("keep", [0.5, 0.05])
def test_truncated_file(tmp_path, keep):
    path = tmp_path / "run.h5"
    make_log(path, range(50))
    truncated = tmp_path / "truncated.h5"
    shutil.copy(path, truncated)
    with open(truncated, "r+b") as f:
        f.truncate(int(path.stat().st_size * keep))
    with pytest.raises(RunLogError, match=rf"{re.escape(str(truncated))}: corrupt or truncated HDF5 file"):
        read_run(truncated)


def test_foreign_hdf5_file(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.arange(3)
    with pytest.raises(RunLogError, match=rf"{re.escape(str(path))}: not an interference run log "
                                          r"\(root attribute 'format' is missing"):
        read_run(path)
    with pytest.raises(RunLogError, match="not an interference run log"):
        RunLog(path, config={}, seed=0, probes=PROBES)
    with h5py.File(path, "r") as f:  # left untouched
        assert list(f) == ["x"]


def test_find_runs(tmp_path):
    make_log(tmp_path / "b" / "run.h5", [0])
    make_log(tmp_path / "a.h5", [0])
    (tmp_path / "notes.txt").write_text("x")
    assert find_runs(tmp_path) == [str(tmp_path / "a.h5"), str(tmp_path / "b" / "run.h5")]
    assert find_runs(tmp_path / "a.h5") == [str(tmp_path / "a.h5")]
    with pytest.raises(FileNotFoundError):
        find_runs(tmp_path / "missing")


def test_negative_steps_are_refused(tmp_path):
    from runlog import Field as F, RunLog as Log

    with Log(tmp_path / "r.h5", config={}, seed=0, probes={"p": {"x": F(())}}, scalars=("s",)) as log:
        with pytest.raises(ValueError, match="step must be >= 0"):
            log.scalar("s", -1, 1.0)


# --- resume at a checkpoint and the run's end record ----------------------------------------------------------


def test_keep_cuts_a_log_back_to_a_checkpoints_records_and_the_same_records_follow(tmp_path):
    path = tmp_path / "run.h5"
    make_log(path, [10, 20, 30, 40, 50])
    make_log(path, [30, 40, 50, 60], keep={"probes/weights": 2, "scalars/reward": 2})  # resumed after step 20
    run = read_run(path)
    assert_records(run, [10, 20, 30, 40, 50, 60])
    assert run.attrs["resumes"][-1]["kept"] == {"probes/weights": 2, "scalars/reward": 2}


def test_keep_refuses_a_log_with_fewer_records_than_its_checkpoint(tmp_path):
    path = tmp_path / "run.h5"
    make_log(path, [10, 20])
    with pytest.raises(RunLogError, match="holds 2 complete records but the checkpoint was taken after 3"):
        make_log(path, [], keep={"probes/weights": 3, "scalars/reward": 2})
    with pytest.raises(RunLogError, match="names record groups the log does not have"):
        make_log(path, [], keep={"probes/other": 1})
    assert_records(read_run(path), [10, 20])  # a refused resume changes nothing


def test_the_end_record_is_preallocated_written_once_and_cut_back_on_resume(tmp_path):
    from runlog import END, RUN_END, RunLogWriteError

    path = tmp_path / "run.h5"
    with RunLog(path, config={}, seed=0, probes={}, scalars=["reward", END]) as log:
        assert read_run(path).scalars[END][0].size == 0  # allocated, not written: no record
        with h5py.File(path, "r", swmr=True) as f:
            assert f["scalars/run_end/step"].id.get_create_plist().get_alloc_time() == h5py.h5d.ALLOC_TIME_EARLY
        log.scalar("reward", 5, 1.0)
        log._write_error = "No space left on device"  # as after a failed write: later records are refused ...
        with pytest.raises(RunLogWriteError):
            log.scalar("reward", 6, 1.0)
        log.end(6, "write_error")  # ... but the end record is written in place
        with pytest.raises(ValueError, match="a run ends once"):
            log.end(7, "finished")
        log._write_error = None  # the failure was simulated: close the file normally (a real one is kept open)
    steps, values = read_run(path).scalars[END]
    assert steps.tolist() == [6] and [RUN_END[int(v)] for v in values] == ["write_error"]
    with RunLog(path, config={}, seed=0, probes={}, scalars=["reward", END], keep={"scalars/reward": 1}) as log:
        assert read_run(path).scalars[END][0].size == 0  # the resumed run has not ended
        log.end(9, "finished")
    assert read_run(path).scalars[END][0].tolist() == [9]


def test_probe_cadence_survives_a_checkpoint():
    from probes.builtin import WeightsProbe

    probe = WeightsProbe(every=100, at=[150, 350])
    probe._advance(120)
    copy = WeightsProbe(every=100, at=[150, 350])
    copy.restore(probe.state())
    assert [copy.due(s) for s in (150, 199, 200)] == [probe.due(s) for s in (150, 199, 200)] == [True, True, True]
    copy._advance(150)
    assert copy.due(199) is False and copy.due(200) is True


def test_reading_a_log_and_reporting_on_it_import_neither_torch_nor_the_engine(tmp_path):
    """The run-log package is torch-free: reading a log (bounded, so with its checking child) and
    ``python -m reports`` on it load no torch, interference, probes or agents module."""
    path = tmp_path / "runs" / "run.h5"
    with RunLog(path, config={"algo": "dqn"}, seed=0, probes={}, scalars=["episode_return"]) as log:
        for t in range(5):
            log.scalar("episode_return", t, float(t))
    code = ("import atexit, runpy, sys; "
            "atexit.register(lambda: print('LOADED', sorted({m.split('.')[0] for m in sys.modules} & "
            "{'torch', 'interference', 'probes', 'agents'}))); "
            "from runlog import read_run; assert read_run(sys.argv[1]).config == {'algo': 'dqn'}; "
            "sys.argv = ['reports', sys.argv[1], '-o', sys.argv[2]]; runpy.run_module('reports', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "report")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "LOADED []" in proc.stdout, proc.stdout
    assert (tmp_path / "report" / "index.html").exists()


def test_a_reader_in_a_new_logs_first_moments_never_calls_it_corrupt(tmp_path):
    """Reads racing a writer from the file's creation on: each finds no file yet or reads complete records; none is
    told the healthy log is corrupt, truncated or locked (a live writer mid-write is waited for)."""
    from runlog.reader import read_unchecked

    for attempt in range(3):
        path = tmp_path / f"run{attempt}.h5"
        proc = start_writer(path, 300, 0.001)
        try:
            reads = 0
            while reads < 60:
                try:
                    run = read_unchecked(path)
                except FileNotFoundError:
                    continue
                steps = run.probes["weights"]["step"]
                np.testing.assert_array_equal(steps, np.arange(len(steps)))
                reads += 1
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
