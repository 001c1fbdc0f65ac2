"""``python -m agents.grid`` on tiny runs: Ctrl-C, a failing run among others, stale configs, ``--dry-run | head``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from agents.grid import GridRun, expand, load_grid, main, plan
from agents.grid.worker import run_task
from runlog import read_run

ROOT = Path(__file__).resolve().parents[1]
#: DQN on CartPole with a small net; a grid appends its own settings
DQN = "command: dqn\nfixed: {env: CartPole-v1, hidden: 16, progress: false, set: [learning_starts=50]}\n"
#: tiny streaming runs (well under a second each)
STREAM = "command: stream-sin\nfixed: {n: 20, n_test: 50, width: 32, probe: '', seeds: [0]}\n"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _grid(grid: Path, out: Path, *args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "agents.grid", str(grid), "--out", str(out), *args], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _wait_for(paths: list[Path], proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while not all(p.exists() for p in paths):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise AssertionError(f"the runs did not start: {proc.communicate()[1]}")
        time.sleep(0.1)
    time.sleep(0.5)  # some training steps


def _run_dirs(grid: Path, out: Path) -> list[Path]:
    return [r.run_dir for r in plan(load_grid(grid), out)]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_signal_starts_no_queued_run(tmp_path, sig):
    grid = _write(tmp_path / "grid.yml", DQN + "grids: [{act: [relu], steps: [1000000], seed: [0, 1, 2, 3]}]\n")
    out = tmp_path / "runs"
    first, *queued = _run_dirs(grid, out)
    proc = _grid(grid, out, "--workers", "1")
    _wait_for([first / "run.h5"], proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err
    assert f"grid interrupted by {sig.name}: 0 finished, 0 failed, 1 interrupted, 3 not started" in err
    assert json.loads((first / "summary.json").read_text())["status"] == "interrupted"
    assert (first / "model.zip").is_file() and not (first / "DONE.json").exists()
    assert not any(d.exists() for d in queued)


def test_ctrl_c_to_the_process_group_stops_both_workers(tmp_path):
    grid = _write(tmp_path / "grid.yml", DQN + "grids: [{act: [relu], steps: [1000000], seed: [0, 1, 2, 3, 4]}]\n")
    out = tmp_path / "runs"
    dirs = _run_dirs(grid, out)
    proc = _grid(grid, out, "--workers", "2", start_new_session=True)
    _wait_for([d / "run.h5" for d in dirs[:2]], proc)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "grid interrupted by SIGINT: 0 finished, 0 failed, 2 interrupted, 3 not started" in err
    for d in dirs[:2]:
        assert json.loads((d / "summary.json").read_text())["status"] == "interrupted"
    assert not any(d.exists() for d in dirs[2:])


def test_a_failing_run_does_not_stop_the_others(tmp_path):
    grid = _write(tmp_path / "grid.yml", STREAM + "grids: [{act: [relu, tanh, elu]}]\n")
    out = tmp_path / "runs"
    first, failed, last = _run_dirs(grid, out)
    (failed / "seed0" / "run.h5").mkdir(parents=True)  # valid config, but the run cannot create its log
    proc = _grid(grid, out, "--workers", "2")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    message = f"{failed}: runlog.format.RunLogWriteError: {failed / 'seed0' / 'run.h5'}: cannot create the run log " \
              "(Is a directory)"
    assert f"run failed: {message}" in err and f"(traceback in {failed / 'ERROR.txt'})" in err
    assert f"grid done: 2 finished, 1 failed, 0 interrupted, 0 not started\nfailed runs:\n  {message}" in err
    assert "Traceback" not in err
    assert "Traceback" in (failed / "ERROR.txt").read_text() and not (failed / "DONE.json").exists()
    assert (first / "DONE.json").is_file() and (last / "DONE.json").is_file()


def _dry_run(capsys, grid: Path, out: Path) -> list[str]:
    assert main([str(grid), "--out", str(out), "--dry-run"]) == 0
    return [line.split()[0] for line in capsys.readouterr().out.splitlines()]


def test_changed_probe_settings_make_a_finished_run_stale(tmp_path, capsys):
    out = tmp_path / "runs"
    base = DQN + "grids: [{act: [relu], steps: [300], seed: [0]"
    grid = _write(tmp_path / "grid.yml", base + "}]\n")
    assert main([str(grid), "--out", str(out)]) == 0
    assert _dry_run(capsys, grid, out) == ["done"]
    [run_dir] = _run_dirs(grid, out)
    first = (run_dir / "DONE.json").stat().st_mtime_ns

    _write(grid, base.replace("progress: false", "progress: true") + "}]\n")
    assert _dry_run(capsys, grid, out) == ["done"]  # the progress bar does not change the results
    _write(grid, base + ", probe: [sparsity], probe_every: [100]}]\n")
    assert _dry_run(capsys, grid, out) == ["stale"]
    assert main([str(grid), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "1 runs, 0 already finished, 1 stale" in err
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["probe"] == ["sparsity"]
    assert list(read_run(run_dir / "run.h5").probes["sparsity"]["step"]) == [100, 200, 300]
    assert (run_dir / "DONE.json").stat().st_mtime_ns > first
    assert _dry_run(capsys, grid, out) == ["done"]


def test_a_run_begun_with_another_config_is_redone_not_resumed(tmp_path, capsys):
    # A stale run stopped after its DONE.json was cleared but before its files were replaced (a Ctrl-C in the worker's
    # start-up) holds the old config.yaml and a finished summary.json: it stays stale, and --resume redoes it with
    # the new config instead of keeping the old results under the new config's DONE.json.
    out = tmp_path / "runs"
    base = DQN + "grids: [{act: [relu], steps: [300], seed: [0], probe: [sparsity]"
    grid = _write(tmp_path / "grid.yml", base + ", probe_every: [100]}]\n")
    assert main([str(grid), "--out", str(out)]) == 0
    [run_dir] = _run_dirs(grid, out)
    (run_dir / "DONE.json").unlink()
    _write(grid, base + ", probe_every: [150]}]\n")
    assert _dry_run(capsys, grid, out) == ["stale"]
    assert main([str(grid), "--out", str(out), "--resume"]) == 0
    assert "1 runs, 0 already finished, 1 stale" in capsys.readouterr().err
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["probe_every"] == 150
    assert list(read_run(run_dir / "run.h5").probes["sparsity"]["step"]) == [150, 300]
    assert json.loads((run_dir / "DONE.json").read_text())["config"]["probe_every"] == 150


def test_stream_runs_are_stale_by_their_config(tmp_path, capsys):
    out = tmp_path / "runs"
    base = STREAM + "grids: [{act: [relu]"
    grid = _write(tmp_path / "grid.yml", base + "}]\n")
    assert main([str(grid), "--out", str(out)]) == 0
    [run_dir] = _run_dirs(grid, out)
    (run_dir / "config.yaml").unlink()  # (a folder written without one: DONE.json's config counts)
    _write(grid, base + ", probe: [sparsity], probe_at: ['5,20']}]\n")
    assert _dry_run(capsys, grid, out) == ["stale"]
    assert main([str(grid), "--out", str(out)]) == 0
    assert _dry_run(capsys, grid, out) == ["done"]
    assert (run_dir / "config.yaml").exists()  # every run folder begins with its config
    assert list(read_run(run_dir / "seed0" / "run.h5").probes["sparsity"]["step"]) == [5, 20]


def test_dry_run_into_a_closed_pipe_is_quiet(tmp_path):
    grid = _write(tmp_path / "grid.yml", STREAM + "grids: [{act: [relu, tanh, elu], lr: [0.1, 0.01, 0.001]}]\n")
    proc = _grid(grid, tmp_path / "runs", "--dry-run")
    proc.stdout.close()  # as `| head` does once it has read enough
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141 and err == ""


@pytest.mark.parametrize("grid", ["dqn.yml", "stream.yml"])
def test_run_folders_from_before_the_redesign_stay_done(tmp_path, grid):
    """tests/data/grid_55b829d: the config.yaml and DONE.json files a grid wrote at commit 55b829d (before the
    activation, algorithm and settings specs); the same grid planned now finds every run finished."""
    import shutil

    data = ROOT / "tests" / "data" / "grid_55b829d"
    shutil.copytree(data / "runs", tmp_path / "runs")
    runs = plan(load_grid(data / grid), tmp_path / "runs")
    assert runs and [r.status for r in runs] == ["done"] * len(runs)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _is_worker(pid: int) -> bool:
    """A pool worker the grid spawned (not its resource tracker, nor a command an import runs, e.g. h5py's
    ``uname -p``)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return "spawn_main" in cmdline and "resource_tracker" not in cmdline


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for a reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def test_workers_do_not_outlive_a_sigkilled_grid(tmp_path):
    """SIGKILL to the grid process alone: its workers notice, stop their runs cleanly (model and log saved) and
    exit within ORPHAN_EXIT_S (10 s, as documented) instead of training on (or hanging) in folders a re-run would
    use."""
    from agents.grid.worker import ORPHAN_EXIT_S

    grid = _write(tmp_path / "grid.yml", DQN + "grids: [{act: [relu], steps: [1000000], seed: [0, 1, 2]}]\n")
    out = tmp_path / "runs"
    dirs = _run_dirs(grid, out)
    proc = _grid(grid, out, "--workers", "2", start_new_session=True)
    _wait_for([d / "run.h5" for d in dirs[:2]], proc)
    workers = [p for p in _children(proc.pid) if _is_worker(p)]
    assert workers
    proc.kill()
    deadline = time.time() + ORPHAN_EXIT_S
    proc.communicate(timeout=30)
    while any(_alive(p) for p in workers) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in workers), f"a worker outlived its grid by {ORPHAN_EXIT_S} s"
    for d in dirs[:2]:
        assert json.loads((d / "summary.json").read_text())["status"] == "interrupted"
        assert not (d / "DONE.json").exists()


def test_a_grid_run_refuses_a_folder_another_process_holds(tmp_path, capsys):
    """A re-run while an earlier grid's worker still writes into a run folder: that run fails with a message naming
    the holder, nothing in the folder is touched (an older failure's ERROR.txt is not pointed at as this one's
    traceback), and the others go on."""
    from agents.grid import execute, run_grid
    from agents.runlock import run_lock

    grid = _write(tmp_path / "grid.yml", STREAM + "grids: [{act: [relu, tanh]}]\n")
    runs = plan(load_grid(grid), tmp_path / "runs")
    held = runs[0].run_dir
    held.mkdir(parents=True)
    (held / "DONE.json").write_text("{}")  # an earlier result that must survive
    (held / "ERROR.txt").write_text("an older failure")
    os.utime(held / "ERROR.txt", (time.time() - 3600, time.time() - 3600))
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; from agents.runlock import run_lock\n"
                              "with run_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)", str(held)],
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(Exception, match=f"in use by pid {child.pid}"):
            execute(runs[0])
        assert (held / "DONE.json").read_text() == "{}"
        report = run_grid(runs, progress=False)
        assert [o.state for o in report.outcomes] == ["failed", "finished"]
        assert "in use by pid" in report.outcomes[0].detail
        err = capsys.readouterr().err
        assert f"run failed: {held}" in err and "traceback in" not in err
        assert (held / "ERROR.txt").read_text() == "an older failure"
    finally:
        child.kill()
        child.wait()
    with run_lock(held):  # released with the dead holder
        pass


def test_a_lock_files_heartbeat_never_shows_a_reader_an_empty_or_cut_record(tmp_path):
    """Another host reads the lock file to see whether it is held (NFS may not pass flock): a rewrite must not show it
    ``{}`` or half a record, which read as "not held" (the heartbeat truncated the file, then wrote)."""
    import threading

    from agents.runlock import _read, _write

    fd = os.open(tmp_path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    _write(fd, {"host": "h" * 300, "pid": 1, "heartbeat": 0.0})  # a longer record first: later ones are shorter
    done, seen = threading.Event(), []

    def read() -> None:
        reader = os.open(tmp_path / ".lock", os.O_RDONLY)
        while not done.is_set():
            seen.append(_read(reader).get("host"))
        os.close(reader)

    thread = threading.Thread(target=read)
    thread.start()
    for i in range(20_000):
        _write(fd, {"host": "node", "pid": 2, "heartbeat": float(i)})
    done.set()
    thread.join()
    os.close(fd)
    assert len(seen) > 100 and None not in seen


def _population_spec(**extra) -> dict:
    return {"command": "dqn", "engine": "population",
            "fixed": {"env": "MountainCar-v0", "hidden": 16, "steps": 600, "progress": False,
                      "set": ["learning_starts=100", "seed=9", "lr=0.5"]},
            "grids": [{"act": ["relu", "elephant"], "lr": [0.001, 0.0003], "seed": [0, 1], "buffer_size": [100]}],
            **extra}


def test_population_tasks_group_runs_that_differ_in_seed_learning_rate_and_buffer_size(tmp_path):
    from agents.grid import PopulationTask, tasks
    from agents.population import MEMBER_KEYS

    runs = plan(_population_spec(population_size=3), tmp_path)
    single = plan({k: v for k, v in _population_spec().items() if k != "engine"}, tmp_path)
    assert [r.run_dir for r in runs] == [r.run_dir for r in single]  # the same run folders either way
    assert all(isinstance(t, GridRun) for t in tasks(single))
    work = tasks(runs)
    assert all(isinstance(t, PopulationTask) for t in work)
    # as few populations as hold each kind, of sizes differing by at most one
    assert [(t.runs[0].config["act"], len(t.runs)) for t in work] == [("relu", 2), ("relu", 2), ("elephant", 2),
                                                                      ("elephant", 2)]
    assert [r for t in work for r in t.runs] == sorted(runs, key=lambda r: r.config["act"] != "relu")
    for t in work:  # the members' configs differ only in the members' settings
        shared = [{k: v for k, v in r.config.items() if k not in (*MEMBER_KEYS, "derived")} for r in t.runs]
        assert all(s == shared[0] for s in shared)
    assert not any(t.resume for t in work)
    assert [len(t.runs) for t in tasks(plan(_population_spec(), tmp_path))] == [4, 4]  # no population_size: all


def test_population_size_auto_fills_the_devices_memory_and_the_plan_says_so(tmp_path, monkeypatch):
    from agents.grid import tasks
    from agents.grid.cli import _population_plan
    from agents.population import memory

    runs = plan(_population_spec(population_size="auto"), tmp_path)
    assert [len(t.runs) for t in tasks(runs)] == [4, 4]  # all fit this machine's memory
    one = max(memory.population_bytes([r.config]) for r in runs)
    monkeypatch.setattr(memory, "budget", lambda device: 3 * one)  # room for three members of the larger net
    work = tasks(runs)
    assert [len(t.runs) for t in work] == [2, 2, 2, 2]  # each kind's four: three fit, so two populations of two
    for t in work:
        assert memory.population_bytes([r.config for r in t.runs]) <= 3 * one
    assert [len(t.runs) for t in tasks(runs, at_once=3)] == [1] * 8  # three side by side: a third of it each
    largest = max(work, key=lambda t: len(t.runs))
    assert _population_plan(work) == (
        f"plan: {len(work)} populations of 2 members, {8 * 600:,} agent-steps; the largest "
        f"~{memory.population_bytes([r.config for r in largest.runs]) / 2**30:.2f} GiB on cpu")
    with pytest.raises(Exception, match="population_size must be a positive integer .* or auto"):
        plan(_population_spec(population_size="most"), tmp_path)


def test_population_size_auto_on_a_cuda_device_this_machine_lacks_is_refused(monkeypatch):
    import torch

    from agents.errors import ConfigError
    from agents.population import memory

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="sizes populations by the free memory of cuda here, and this machine has no "
                                          "CUDA device: plan on the GPU machine, or give population_size: N"):
        memory.budget("cuda")


def test_population_size_auto_on_a_cpu_stops_at_its_most_members(tmp_path, monkeypatch):
    """On a CPU a population holds at most memory.CPU_MEMBERS members, however much memory there is."""
    from agents.grid import tasks
    from agents.population import memory

    monkeypatch.setattr(memory, "CPU_MEMBERS", 3)
    spec = _population_spec(population_size="auto")
    spec["grids"][0]["seed"] = [0, 1, 2, 3, 4]  # ten runs of each kind
    assert [len(t.runs) for t in tasks(plan(spec, tmp_path))] == [3, 3, 2, 2] * 2  # each kind: four of 2-3


def test_population_tasks_group_runs_that_differ_in_their_epsilon_schedules(tmp_path):
    from agents.grid import PopulationTask, tasks
    from agents.population import MEMBER_KEYS
    from agents.population.engine import Member

    spec = _population_spec()
    spec["fixed"]["set"] = [*spec["fixed"]["set"], "exploration_initial_eps=0.9"]
    spec["grids"] = [{"act": ["relu"], "lr": [0.001], "seed": [0, 1], "buffer_size": [100],
                      "exploration_final_eps": [0.01, 0.1], "exploration_steps": [200]}]
    work = tasks(plan(spec, tmp_path))
    assert len(work) == 1 and isinstance(work[0], PopulationTask) and len(work[0].runs) == 4
    members = [Member(*(r.config[k] for k in MEMBER_KEYS)) for r in work[0].runs]
    assert {(m.exploration_initial_eps, m.exploration_final_eps, m.exploration_steps) for m in members} == \
        {(0.9, 0.01, 200), (0.9, 0.1, 200)}


def test_a_resumed_population_keeps_its_checkpoint_when_the_grids_chunks_move(tmp_path, monkeypatch, capsys,
                                                                            full_disk_at_results):
    # A population of seeds 0 and 1 stops with a checkpoint (a full disk at its results); the grid is then extended
    # with seed 2 listed first, so its chunks of 2 are now (2, 0) and (1): --resume must still continue (0, 1) from
    # their checkpoint (it started both anew, the checkpoint orphaned) and train 2 alone.
    from agents.grid import run_grid, tasks, worker

    free_space = full_disk_at_results

    def spec(seeds: list[int]) -> Path:
        s = _population_spec(population_size=2, grids=[{"act": ["relu"], "lr": [0.001], "seed": seeds,
                                                        "buffer_size": [100]}])
        s["fixed"]["set"] = [*s["fixed"]["set"], "checkpoint_every=200"]
        return _write(tmp_path / "grid.yml", yaml.safe_dump(s))

    out = tmp_path / "runs"
    monkeypatch.setattr(worker, "_WRITE_FAILED", False)
    report = run_grid(plan(load_grid(spec([0, 1])), out), workers=1, progress=False)
    assert [o.state for o in report.outcomes] == ["failed"] * 2, report.summary()
    free_space()
    [checkpoint] = (out / "populations").glob("*.pkl")
    resumed = [replace(r, resume=True) for r in plan(load_grid(spec([2, 0, 1])), out)]
    assert [[r.config["seed"] for r in t.runs] for t in tasks(resumed)] == [[0, 1], [2]]
    assert [[r.config["seed"] for r in t.runs] for t in tasks(plan(load_grid(spec([2, 0, 1])), out))] == [[2, 0], [1]]
    capsys.readouterr()
    assert main([str(spec([2, 0, 1])), "--out", str(out), "--workers", "1", "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"{checkpoint}: resuming the population of 2 at step 400" in err, err
    assert "starts at step 0" in err and "population of 1" in err  # seed 2, which had none
    assert not list((out / "populations").iterdir())  # both finished: checkpoints and member lists gone


def test_a_run_belongs_to_the_newest_checkpoint_that_lists_it(tmp_path):
    # Checkpoint A holds seeds (0, 1), a newer B holds (1, 2), and seed 2 is no longer in the grid: B cannot be
    # resumed, and A must not be resumed over seed 1's folder, whose log is B's; both start in the grid's chunks.
    from agents.grid import tasks
    from agents.population import record_members

    spec = _population_spec(population_size=1, grids=[{"act": ["relu"], "lr": [0.001], "seed": [0, 1, 2],
                                                       "buffer_size": [100]}])
    runs = [replace(r, resume=True) for r in plan(spec, tmp_path)]
    (tmp_path / "populations").mkdir()
    for name, seeds, age in (("a", (0, 1), 60), ("b", (1, 2), 30)):
        checkpoint = tmp_path / "populations" / f"{name}.pkl"
        checkpoint.write_bytes(b"")
        record_members(checkpoint, [runs[s].run_dir for s in seeds], tmp_path)
        os.utime(checkpoint, (time.time() - age, time.time() - age))
    assert [[r.config["seed"] for r in t.runs] for t in tasks(runs)] == [[1, 2], [0]]  # B, when 2 is in the grid
    assert [[r.config["seed"] for r in t.runs] for t in tasks(runs[:2])] == [[0], [1]]
    (tmp_path / "populations" / "b.members.json").write_text('{"members": [')  # torn or corrupt: ignored
    assert [[r.config["seed"] for r in t.runs] for t in tasks(runs)] == [[0, 1], [2]]  # A, now the newest listing 1


@pytest.mark.parametrize("change, message", [
    ({"command": "ppo", "fixed": {"env": "CartPole-v1"}}, "engine: population trains runs of dqn, rainbow only, not ppo"),
    ({"engine": "fast"}, "unknown engine 'fast'"),
    ({"engine": None, "population_size": 4}, "population_size is for grids with engine: population"),
    ({"population_size": 0}, "population_size must be a positive integer"),
])
def test_bad_population_grids_are_refused(tmp_path, change, message):
    from agents.errors import ConfigError

    spec = {**_population_spec(), **change}
    with pytest.raises(ConfigError, match=message):
        plan({k: v for k, v in spec.items() if v is not None}, tmp_path)


def test_a_failing_population_fails_every_member(tmp_path):
    from agents.grid import run_grid

    spec = _population_spec()
    spec["fixed"] = {**spec["fixed"], "env": "CartPole-v1"}  # no batched CartPole: the population raises
    runs = plan(spec, tmp_path)
    report = run_grid(runs, progress=False)
    assert [o.state for o in report.outcomes] == ["failed"] * 8 and report.exit_status == 1
    assert all("no batched version of 'CartPole-v1'" in o.detail for o in report.outcomes)
    for r in runs:
        assert "Traceback" in (r.run_dir / "ERROR.txt").read_text() and not (r.run_dir / "DONE.json").exists()


def test_a_run_finished_by_another_grid_since_planning_is_not_redone(tmp_path, capsys):
    # Two grids on the same folders: each plans its runs as "todo"; the other finishes one before this one reaches
    # it. Under the run's lock this grid finds it done with its config and keeps it: a finished run is never redone.
    out = tmp_path / "runs"
    grid = _write(tmp_path / "grid.yml", STREAM + "grids: [{act: [relu, elephant]}]\n")
    runs = plan(load_grid(grid), out)
    assert [r.status for r in runs] == ["todo", "todo"]
    assert main([str(grid), "--out", str(out)]) == 0  # the other grid finishes both
    def files():
        return {f: f.stat().st_mtime_ns for r in runs for f in r.run_dir.rglob("*")
                if f.is_file() and f.name != ".lock"}

    first = files()
    assert len(first) > 2
    summaries = [run_task(r) for r in runs]  # this grid's worker, on its plan made before
    assert summaries == [json.loads((r.run_dir / "DONE.json").read_text())["summary"] for r in runs]
    assert files() == first  # nothing rewritten, DONE.json included


def test_a_population_finished_by_another_grid_since_planning_is_not_redone(tmp_path):
    # As for single runs: a population task planned as "todo" whose members another grid finished meanwhile returns
    # their saved summaries under the members' locks and trains nothing (no checkpoint, no file rewritten).
    from agents.grid import PopulationTask, run_grid, tasks

    spec = _population_spec(grids=[{"act": ["relu"], "lr": [0.001], "seed": [0, 1], "buffer_size": [100]}])
    runs = plan(spec, tmp_path)
    [task] = tasks(runs)
    assert isinstance(task, PopulationTask) and [r.status for r in task.runs] == ["todo", "todo"]
    assert run_grid(plan(spec, tmp_path), progress=False).exit_status == 0  # the other grid finishes both
    def files():
        return {f: f.stat().st_mtime_ns for f in tmp_path.rglob("*") if f.is_file() and f.name != ".lock"}

    first = files()
    summaries = run_task(task)  # this grid's worker, on its plan made before
    assert summaries == [json.loads((r.run_dir / "DONE.json").read_text())["summary"] for r in runs]
    assert files() == first


def test_a_population_partly_finished_by_another_grid_trains_only_the_rest(tmp_path):
    # Another grid finished seed 0 alone since this grid planned seeds 0 and 1 as one population: under the locks
    # seed 0's results are kept as they are (not cleared and retrained) and only seed 1 is trained.
    from agents.grid import tasks

    spec = _population_spec(grids=[{"act": ["relu"], "lr": [0.001], "seed": [0, 1], "buffer_size": [100]}])
    [task] = tasks(plan(spec, tmp_path))
    other = _population_spec(grids=[{"act": ["relu"], "lr": [0.001], "seed": [0], "buffer_size": [100]}])
    assert main_grid(other, tmp_path) == 0
    seed0 = {f: f.stat().st_mtime_ns for f in task.runs[0].run_dir.iterdir() if f.name != ".lock"}
    summaries = run_task(task)
    assert {f: f.stat().st_mtime_ns for f in task.runs[0].run_dir.iterdir() if f.name != ".lock"} == seed0
    assert [json.loads((r.run_dir / "DONE.json").read_text())["summary"] for r in task.runs] == summaries
    assert summaries[1]["status"] == "finished" and summaries[1]["run_dir"] == str(task.runs[1].run_dir)


def main_grid(spec: dict, out: Path) -> int:
    from agents.grid import run_grid

    return run_grid(plan(spec, out), progress=False).exit_status


def test_a_failed_write_stays_the_reason_when_error_txt_cannot_be_written_either(tmp_path, monkeypatch):
    # A full disk: the run's RunLogWriteError propagates (not the ENOSPC of writing ERROR.txt) and marks the process
    # as one whose log writes failed (HDF5's state), so that no further run starts in it.
    from agents.commands import get_command
    from agents.grid import worker
    from runlog import RunLogWriteError

    [run] = plan(load_grid(_write(tmp_path / "grid.yml", STREAM + "grids: [{act: [relu]}]\n")), tmp_path / "runs")

    def full_disk(*args, **kwargs):
        raise RunLogWriteError("cannot write run.h5 (No space left on device)")

    write_text = Path.write_text

    def no_space_for_the_error(self, *args, **kwargs):
        if self.name == "ERROR.txt":
            raise OSError(28, "No space left on device")
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(get_command("stream-sin"), "train", full_disk)
    monkeypatch.setattr(Path, "write_text", no_space_for_the_error)
    monkeypatch.setattr(worker, "_WRITE_FAILED", False)
    with pytest.raises(RunLogWriteError, match="cannot write run.h5"):
        run_task(run)
    assert worker._WRITE_FAILED


def test_a_stop_signal_a_finishing_run_takes_still_stops_an_in_process_grid(tmp_path, monkeypatch, capsys):
    # --workers 1: the run's own handler takes a Ctrl-C that comes while it finishes (its last step, its summary)
    # and the run ends "finished"; the grid must still start no further run and exit 130.
    from agents.commands import get_command
    from agents.signals import STOP_SIGNALS, handling

    def finishing(run):
        run.start()
        with handling(STOP_SIGNALS, lambda signum, frame: None):  # the run finishes what it is doing
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
        return run.finish({"status": "finished"})

    monkeypatch.setattr(get_command("stream-sin"), "train", finishing)
    grid = _write(tmp_path / "grid.yml", STREAM + "grids: [{act: [relu, tanh]}]\n")
    assert main([str(grid), "--out", str(tmp_path / "runs"), "--workers", "1"]) == 130
    assert "grid interrupted by SIGINT: 1 finished, 0 failed, 0 interrupted, 1 not started" in capsys.readouterr().err


@pytest.mark.parametrize("population", [False, True])
def test_a_stop_signal_while_finished_runs_are_marked_done_leaves_them_finished(tmp_path, monkeypatch, capsys,
                                                                              population):
    # SIGTERM while DONE.json is written (the run or population has returned its summaries): every run is marked
    # and reported finished, and the in-process grid starts nothing more (it reported them interrupted, some
    # without DONE.json, so --resume redid finished runs).
    from agents import grid

    spec = _population_spec(grids=[{"act": ["relu"], "lr": [0.001], "seed": [0, 1], "buffer_size": [100]},
                                   {"act": ["elephant"], "lr": [0.001], "seed": [0], "buffer_size": [100]}])
    if not population:
        spec = {k: v for k, v in spec.items() if k != "engine"}
    runs = plan(spec, tmp_path)
    replace = os.replace

    def signalled(source, target):
        if Path(source).name == ".DONE.json.tmp" and not any(r.run_dir.joinpath("DONE.json").exists() for r in runs):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
        return replace(source, target)

    monkeypatch.setattr(os, "replace", signalled)
    report = grid.run_grid(runs, workers=1, progress=False)
    finished = 2 if population else 1
    assert [o.state for o in report.outcomes] == ["finished"] * finished and report.not_started == 3 - finished
    assert report.stop_signal == signal.SIGTERM
    assert [r.run_dir.joinpath("DONE.json").exists() for r in runs] == [True] * finished + [False] * (3 - finished)


@pytest.mark.long  # two spawned workers (~20 s): .ci/run's step of long tests
def test_a_worker_killed_in_a_pool_is_reported_with_the_way_to_resume(tmp_path):
    """SIGKILL to one of two workers: the pool breaks and stops the other run too; both are reported with what
    happened and that --resume continues them, nothing more starts, and the stopped sibling left a checkpoint."""
    grid = _write(tmp_path / "grid.yml", DQN + "grids: [{act: [relu], steps: [1000000], seed: [0, 1, 2]}]\n")
    out = tmp_path / "runs"
    dirs = _run_dirs(grid, out)
    proc = _grid(grid, out, "--workers", "2", start_new_session=True)
    _wait_for([d / "run.h5" for d in dirs[:2]], proc)
    victim = json.loads((dirs[0] / ".lock").read_text())["pid"]
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "grid stopped: 0 finished, 2 failed, 0 interrupted, 1 not started" in err, err
    assert err.count("a worker of the pool died (killed, or out of memory)") >= 2 and "--resume continues" in err
    assert json.loads((dirs[1] / "summary.json").read_text())["status"] == "interrupted"
    assert (dirs[1] / "checkpoint.pkl").exists() and not dirs[2].exists()


def test_ctrl_c_while_the_workers_start_up_is_no_traceback_and_no_failure(tmp_path):
    # Workers inherit blocked stop signals and drop them once they ignore them: a Ctrl-C while they import is not a
    # KeyboardInterrupt in them (which broke the pool and reported runs that never started as failed).
    grid = _write(tmp_path / "grid.yml", DQN + "grids: [{act: [relu], steps: [1000000], seed: [0, 1, 2, 3]}]\n")
    proc = _grid(grid, tmp_path / "runs", "--workers", "2", start_new_session=True)
    deadline = time.time() + 60
    while not [p for p in _children(proc.pid) if _is_worker(p)]:  # (not a short-lived child of an import)
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "0 failed" in err and "grid interrupted by SIGINT" in err, err


def test_axis_flags_scale_a_grid_file_to_the_papers_grid(tmp_path, capsys):
    """``--axis`` replaces a key's values in every sub-grid (the file's lists, a fixed value, under either alias) and
    drops the sub-grids that become identical: classic_study.yml with the paper's 8 learning rates and 10 seeds is
    its 4,800 runs, and with its own values the file's 1,200 run folders."""
    from agents.grid.spec import axis_values, with_axes

    assert axis_values("0-3,7") == [0, 1, 2, 3, 7] and axis_values("1e-3,3e-4") == [1e-3, 3e-4]
    assert axis_values("elephant,relu,32") == ["elephant", "relu", 32]
    study = load_grid(ROOT / "agents" / "grids" / "classic_study.yml")
    paper = with_axes(study, {"learning_rate": axis_values("1e-2,3e-3,1e-3,3e-4,1e-4,3e-5,1e-5,3e-6"),
                              "seed": axis_values("0-9")})
    assert len(paper["grids"]) == 3  # the per-lr lines of each task's Elephant and ReLU became one
    assert len(expand(paper)) == 2 * 6 * 5 * 8 * 10
    same = with_axes(study, {"lr": [1e-3, 3e-4, 1e-4, 3e-5], "seed": [0, 1, 2, 3, 4]})
    entries = [frozenset(e.items()) for e in expand(same)]
    assert len(entries) == 1200 and set(entries) == {frozenset(e.items()) for e in expand(study)}
    fixed = with_axes({"command": "dqn", "fixed": {"lr": 0.1, "env": "CartPole-v1"}, "grids": [{"seed": [0]}]},
                      {"learning_rate": [1e-3]})
    assert fixed["fixed"] == {"env": "CartPole-v1"} and fixed["grids"] == [{"seed": [0], "learning_rate": [1e-3]}]
    in_set = with_axes({"command": "dqn", "fixed": {"set": ["learning_rate=0.5", "gamma=0.9"]}, "grids": [{}]},
                       {"lr": [1e-3]})
    assert in_set["fixed"] == {"set": ["gamma=0.9"]} and in_set["grids"] == [{"lr": [1e-3]}]
    grid = tmp_path / "g.yml"
    grid.write_text(yaml.safe_dump(_population_spec()))
    assert main([str(grid), "--out", str(tmp_path / "o"), "--dry-run", "--axis", "seed=0-2"]) == 0
    assert capsys.readouterr().out.count("todo") == 2 * 2 * 3
    with pytest.raises(SystemExit) as err:
        main([str(grid), "--out", str(tmp_path / "o"), "--dry-run", "--axis", "seed"])
    assert err.value.code == 2 and "--axis takes KEY=VALUES (e.g. seed=0-9 or lr=1e-3,3e-4), got 'seed'" in \
        capsys.readouterr().err
