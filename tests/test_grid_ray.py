"""``python -m agents.grid --backend ray`` on a real Ray cluster started here on loopback (2 CPUs): its results equal
the local backend's, a worker SIGKILLed mid-run is reported and ``--resume`` finishes its run exactly, and
``engine: population`` grids run as Ray tasks into the run folders the reports read (``--workers`` at a time), a
killed population resuming from its checkpoint.

The grids run in this process (one Ray job, so its workers import torch once), except a resume, which runs
``python -m agents.grid`` with ``RAY_ADDRESS`` as a user would."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from agents.grid import load_grid, main, plan, tasks  # noqa: E402
from runlog import read_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: two DQN runs of 1000 steps, a checkpoint every 200 (about 2 s each)
DQN = ("command: dqn\nfixed: {env: CartPole-v1, act: relu, hidden: 16, progress: false, steps: 1000, "
       "checkpoint_every: 200, set: [learning_starts=50]}\ngrids: [{seed: [0, 1]}]\n")
#: two populations of two members (MountainCar has a batched env; episodes capped at 200 steps)
POPULATION = ("command: dqn\nengine: population\npopulation_size: 2\nfixed: {env: MountainCar-v0, act: relu, "
              "hidden: 16, progress: false, steps: 600, set: [learning_starts=100, max_episode_steps=200]}\n"
              "grids: [{seed: [0, 1], lr: [0.001, 0.0003]}]\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_env(**extra: str) -> dict[str, str]:
    """The environment of the cluster and of grids run as subprocesses, with token authentication as in this
    process (off unless RAY_AUTH_MODE says otherwise; Ray reads it on import): left unset, ``ray start`` would turn
    it on wherever ``~/.ray/auth_token`` exists (a local ``ray.init()`` writes one), and drivers given an address
    would then be refused."""
    return {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
            "RAY_USAGE_STATS_ENABLED": "0", **extra}


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A one-node Ray cluster (``ray start --head --block``, its own ports and temp dir; SIGTERM ends it and all
    its processes) and this process connected to it; its address. It declares one GPU, which its tasks cannot use
    (this machine has none): CPU tasks never ask for it."""
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths must fit in 107 bytes
    port = _free_port()
    log = open(temp / "ray-start.log", "w+")
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", "--node-ip-address=127.0.0.1",
         f"--port={port}", "--num-cpus=2", "--num-gpus=1", "--include-dashboard=false", "--disable-usage-stats",
         f"--temp-dir={temp}", f"--dashboard-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}",
         f"--metrics-export-port={_free_port()}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=_ray_env())
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    env = pytest.MonkeyPatch()
    try:
        deadline = time.time() + 120
        while "block forever" not in (temp / "ray-start.log").read_text():
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"ray start failed:\n{(temp / 'ray-start.log').read_text()}")
            time.sleep(0.2)
        address = f"127.0.0.1:{port}"
        env.setenv("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address=address, logging_level="WARNING")
        yield address
    finally:
        ray.shutdown()
        env.undo()
        for sig, handler in handlers.items():  # ray.init sets its own SIGTERM handler
            signal.signal(sig, handler)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the cluster's processes share the group of `ray start`
            proc.wait()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, Path]:
    """The DQN grid run by the local backend: (grid file, out)."""
    root = tmp_path_factory.mktemp("reference")
    grid = _write(root / "grid.yml", DQN)
    assert main([str(grid), "--out", str(root / "runs")]) == 0
    return grid, root / "runs"


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The final network of a run: ``model.zip``'s policy (SB3) or ``q_net.pt`` (a population member)."""
    if (run_dir / "q_net.pt").exists():
        return torch.load(run_dir / "q_net.pt")
    with zipfile.ZipFile(run_dir / "model.zip") as z:
        return torch.load(io.BytesIO(z.read("policy.pth")))


def _assert_same_results(a: Path, b: Path) -> None:
    """Two finished run folders hold the same results: DONE.json's config, the summary's returns, every logged
    scalar and the final weights."""
    done_a, done_b = (json.loads((d / "DONE.json").read_text()) for d in (a, b))
    assert done_a["config"] == done_b["config"]
    for key in ("status", "steps", "episodes", "final_return"):
        assert done_a["summary"][key] == done_b["summary"][key], key
    ra, rb = read_run(a / "run.h5"), read_run(b / "run.h5")
    assert set(ra.scalars) == set(rb.scalars) and ra.scalars
    for name in ra.scalars:
        assert all(np.array_equal(x, y) for x, y in zip(ra.scalars[name], rb.scalars[name])), name
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _run_dirs(grid: Path, out: Path) -> list[Path]:
    return [r.run_dir for r in plan(load_grid(grid), out)]


def test_a_grid_on_ray_equals_the_local_backend(cluster, reference, tmp_path, capsys):
    grid, ref = reference
    out = tmp_path / "runs"
    assert main([str(grid), "--out", str(out), "--backend", "ray"]) == 0
    err = capsys.readouterr().err
    assert re.search(rf"ray: the cluster at \S+:{cluster.rsplit(':', 1)[1]}, 2 CPUs", err), err
    assert "grid done: 2 finished, 0 failed, 0 interrupted, 0 not started" in err
    for a, b in zip(_run_dirs(grid, ref), _run_dirs(grid, out), strict=True):
        _assert_same_results(a, b)


def _ray_grid_killing_its_writer(grid: Path, out: Path, run_dir: Path, checkpointed) -> tuple[int, list[int]]:
    """Run ``grid`` on Ray and SIGKILL the Ray worker writing ``run_dir`` (its run lock's pid) once
    ``checkpointed()`` is true; the grid's exit status and the pids killed."""
    killed: list[int] = []

    def kill_after_first_checkpoint() -> None:
        deadline = time.time() + 120
        while not checkpointed() and time.time() < deadline:
            time.sleep(0.01)
        pid = json.loads((run_dir / ".lock").read_text())["pid"]  # the run folder's writer: its Ray worker
        assert "ray::" in Path(f"/proc/{pid}/cmdline").read_text()
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_after_first_checkpoint)
    killer.start()
    status = main([str(grid), "--out", str(out), "--backend", "ray"])
    killer.join()
    return status, killed


def test_a_killed_worker_is_reported_and_resume_finishes_its_run(cluster, reference, tmp_path, capsys):
    grid, ref = reference
    out = tmp_path / "runs"
    victim, other = _run_dirs(grid, out)
    status, killed = _ray_grid_killing_its_writer(grid, out, victim, lambda: (victim / "checkpoint.pkl").exists())
    err = capsys.readouterr().err
    assert killed and status == 1, err
    message = (f"{victim}: agents.grid.WorkerLost: the Ray worker running it died (WorkerCrashedError: The worker "
               "died unexpectedly while executing this task.")
    assert f"run failed: {message}" in err
    assert "grid done: 1 finished, 1 failed, 0 interrupted, 0 not started" in err
    assert "re-run the grid with --resume to continue it from its last checkpoint" in err
    assert (victim / "checkpoint.pkl").exists() and not (victim / "DONE.json").exists()
    assert (other / "DONE.json").exists()

    # as a user would: python -m agents.grid, connecting to RAY_ADDRESS
    proc = subprocess.run([sys.executable, "-m", "agents.grid", str(grid), "--out", str(out), "--backend", "ray",
                           "--resume"], cwd=ROOT, env=_ray_env(RAY_ADDRESS=cluster), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "2 runs, 1 already finished" in proc.stderr and "grid done: 1 finished, 0 failed" in proc.stderr
    assert len(read_run(victim / "run.h5").attrs["resumes"]) == 1  # continued from its checkpoint, not redone
    for a, b in zip(_run_dirs(grid, ref), (victim, other), strict=True):
        _assert_same_results(a, b)


def test_ctrl_c_counts_a_task_still_waiting_for_a_cpu_as_not_started(cluster, tmp_path, capsys):
    # Three runs, --workers 3 on the 2-CPU cluster: the third waits for a CPU. Ctrl-C once the first two have begun
    # cancels all three; Ray raises the same TaskCancelledError for each, and the one that never began (it took no
    # run lock) is "not started", not "interrupted" (they resume alike; the summary must not say it ran). The runs
    # are long (50k steps), so that none ends before the cancel frees a CPU for the third.
    grid = _write(tmp_path / "grid.yml", DQN.replace("seed: [0, 1]", "seed: [0, 1, 2]").replace("steps: 1000",
                                                                                              "steps: 50000"))
    dirs = _run_dirs(grid, tmp_path / "runs")

    def interrupt_once_two_began() -> None:
        deadline = time.time() + 120
        while sum((d / ".lock").exists() for d in dirs) < 2 and time.time() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=interrupt_once_two_began)
    sender.start()
    status = main([str(grid), "--out", str(tmp_path / "runs"), "--backend", "ray", "--workers", "3"])
    sender.join()
    err = capsys.readouterr().err
    assert status == 130, err
    assert "grid interrupted by SIGINT: 0 finished, 0 failed, 2 interrupted, 1 not started" in err, err
    assert sum((d / ".lock").exists() for d in dirs) == 2


def test_populations_run_as_ray_tasks_into_the_folders_reports_read(cluster, tmp_path, capsys):
    from reports.classic import classic_table
    from reports.data import finished

    grid = _write(tmp_path / "grid.yml", POPULATION)
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    assert main([str(grid), "--out", str(local)]) == 0
    assert main([str(grid), "--out", str(on_ray), "--backend", "ray", "--workers", "1"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"ray: the cluster at \S+, 2 CPUs, 1 task at a time \(--workers\)", err), err
    spans = sorted((min(os.stat(r.run_dir / "config.yaml").st_mtime_ns for r in t.runs),
                    max(os.stat(r.run_dir / "DONE.json").st_mtime_ns for r in t.runs))
                   for t in tasks(plan(load_grid(grid), on_ray)))
    assert len(spans) == 2 and spans[0][1] <= spans[1][0], spans  # one population after the other, as asked
    assert err.count("4 runs, 0 already finished; 4 to train in 2 populations") == 2
    assert err.count("grid done: 4 finished, 0 failed, 0 interrupted, 0 not started") == 2
    for a, b in zip(_run_dirs(grid, local), _run_dirs(grid, on_ray), strict=True):
        _assert_same_results(a, b)
        assert json.loads((b / "summary.json").read_text())["engine"].startswith("population:")
    runs = [read_run(d / "run.h5") for d in _run_dirs(grid, on_ray)]
    assert all(finished(r) for r in runs)
    (row,), warnings = classic_table(runs)
    assert not warnings and (row.env, row.act, row.buffer_size, row.n_seeds) == ("MountainCar-v0", "relu", 10_000, 2)
    assert main([str(grid), "--out", str(on_ray), "--dry-run"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["done"] * 4


def test_a_population_whose_worker_is_killed_resumes_from_its_checkpoint(cluster, tmp_path, capsys):
    """A population of two on Ray, its worker SIGKILLed after its first checkpoint: every member is reported failed,
    and ``--resume`` continues the population from that checkpoint to the uninterrupted population's results."""
    grid = _write(tmp_path / "grid.yml", POPULATION.replace("steps: 600", "steps: 3000, checkpoint_every: 300")
                  .replace("lr: [0.001, 0.0003]", "lr: [0.001]"))
    ref, out = tmp_path / "local", tmp_path / "ray"
    assert main([str(grid), "--out", str(ref)]) == 0
    dirs = _run_dirs(grid, out)
    status, killed = _ray_grid_killing_its_writer(grid, out, dirs[0],
                                                  lambda: bool(list((out / "populations").glob("*.pkl"))))
    err = capsys.readouterr().err
    assert killed and status == 1, err
    assert "grid done: 0 finished, 2 failed, 0 interrupted, 0 not started" in err, err
    for d in dirs:  # as it fails, and in the summary's list
        assert err.count(f"{d}: agents.grid.WorkerLost: the Ray worker running it died") == 2, err
    assert not any((d / "DONE.json").exists() for d in dirs)
    proc = subprocess.run([sys.executable, "-m", "agents.grid", str(grid), "--out", str(out), "--backend", "ray",
                           "--resume"], cwd=ROOT, env=_ray_env(RAY_ADDRESS=cluster), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "grid done: 2 finished, 0 failed" in proc.stderr
    # (from the summaries: the worker's own "resuming the population" line reaches the driver's stderr only when
    # Ray forwards it before the driver exits)
    assert all(json.loads((d / "DONE.json").read_text())["summary"]["resumed_from_step"] >= 300 for d in dirs)
    for a, b in zip(_run_dirs(grid, ref), dirs, strict=True):
        _assert_same_results(a, b)


def _cuda(task, device="cuda"):
    """``task`` with its runs' configs saying ``device`` (which this machine's config checks would refuse)."""
    from dataclasses import replace

    from agents.grid import PopulationTask

    runs = tuple(replace(r, config={**r.config, "device": device}) for r in
                 (task.runs if isinstance(task, PopulationTask) else (task,)))
    return replace(task, runs=runs) if isinstance(task, PopulationTask) else runs[0]


def test_populations_on_cuda_ask_ray_for_a_share_of_a_gpu_by_their_memory(tmp_path):
    from agents.grid.ray_backend import CUDA_OVERHEAD, gpu_share
    from agents.population import memory

    population, *_ = tasks(plan(load_grid(_write(tmp_path / "p.yml", POPULATION)), tmp_path / "p"))
    single, *_ = tasks(plan(load_grid(_write(tmp_path / "d.yml", DQN)), tmp_path / "d"))
    need = memory.population_bytes([r.config for r in population.runs]) + CUDA_OVERHEAD
    assert gpu_share(_cuda(population), 4 * need) == 0.25  # four such populations share a GPU
    assert gpu_share(_cuda(population), 3 * need) == 0.34  # (in hundredths, rounded up)
    assert gpu_share(_cuda(population), need // 2) == 1.0  # at most a whole GPU
    assert gpu_share(_cuda(single), 100 * need) == 1.0  # a single run: a whole GPU


ATARI = ("command: dqn\nengine: population\npopulation_size: 2\nfixed: {env: ALE/Pong-v5, atari_env: ale-vector, "
         "steps: 1000, buffer_size: 100000, progress: false}\ngrids:\n  - {seed: [0, 1]}\n")


def test_atari_populations_ask_ray_for_the_host_memory_of_their_replays(cluster, tmp_path):
    """Ray's ``memory`` resource: a node runs only as many Atari populations as its RAM holds their frame replays
    (0.7 GB a member at 1e5 transitions, ~7 GB at 1e6); a population larger than every node is refused in one line; populations
    whose replays are on their device ask for none; on CUDA an Atari population's share of a GPU is by its
    networks alone."""
    from agents.errors import ConfigError
    import math

    from agents.grid.ray_backend import CUDA_OVERHEAD, _host_memory, gpu_share
    from agents.population import memory

    work = tasks(plan(load_grid(_write(tmp_path / "a.yml", ATARI)), tmp_path / "a"))
    assert len(work) == 1 and len(work[0].runs) == 2
    host, device = memory.atari_member_bytes(work[0].runs[0].config)
    assert _host_memory(work) == {id(work[0]): 2 * host}
    # on a GPU its share is its networks' memory (not the replays'): a few hundredths of an 80 GB GPU
    assert gpu_share(_cuda(work[0]), 80 * 10**9) == math.ceil(100 * (2 * device + CUDA_OVERHEAD) / (80 * 10**9)) / 100
    assert _host_memory(tasks(plan(load_grid(_write(tmp_path / "p.yml", POPULATION)), tmp_path / "p"))) == {}
    huge = tasks(plan(load_grid(_write(tmp_path / "h.yml", ATARI.replace("buffer_size: 100000",
                                                                            "buffer_size: 1000000000"))), tmp_path / "h"))
    with pytest.raises(ConfigError, match=r"needs [0-9.]+ GiB of host memory for its replays and the largest node"):
        _host_memory(huge)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the cluster's declared GPU is a real one here")
def test_a_grid_on_cuda_is_refused_where_the_clusters_gpus_cannot_run_it(cluster, tmp_path, monkeypatch):
    from agents.errors import ConfigError
    from agents.grid.drive import _Stop
    from agents.grid.ray_backend import _gpu_shares

    cpu = tasks(plan(load_grid(_write(tmp_path / "p.yml", POPULATION)), tmp_path / "p"))
    work = [_cuda(t) for t in cpu]
    assert _gpu_shares(cpu, _Stop()) == {}  # CPU only
    with pytest.raises(ConfigError, match=r"GPU tasks cannot use CUDA \(torch.cuda.is_available\(\) is False"):
        _gpu_shares(work, _Stop())  # the cluster declares a GPU that this machine does not have
    for device in ("auto", "cuda:1"):
        with pytest.raises(ConfigError, match="on Ray name device: cuda or device: cpu, not auto or cuda:N"):
            _gpu_shares([_cuda(t, device) for t in cpu], _Stop())
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    with pytest.raises(ConfigError, match="2 of this grid's tasks ask for device cuda and the Ray cluster has no GPUs"):
        _gpu_shares(work, _Stop())


def test_a_grid_on_cuda_waits_for_a_gpu_only_so_long(cluster, tmp_path, monkeypatch):
    """Every GPU busy: the probe of a GPU's memory gives up after PROBE_S with a one-line refusal, and is cancelled."""
    from agents.errors import ConfigError
    from agents.grid import ray_backend
    from agents.grid.drive import _Stop

    work = [_cuda(t) for t in tasks(plan(load_grid(_write(tmp_path / "p.yml", POPULATION)), tmp_path / "p"))]
    busy = ray.remote(num_gpus=1, num_cpus=0)(lambda s: time.sleep(s)).remote(60)  # (a lambda: pickled by value)
    try:
        deadline = time.time() + 60
        while ray.available_resources().get("GPU", 0) > 0:  # until the sleeper holds the GPU
            assert time.time() < deadline, "the sleeping task never got the GPU"
            time.sleep(0.1)
        monkeypatch.setattr(ray_backend, "PROBE_S", 2.0)
        with pytest.raises(ConfigError, match="no GPU of the Ray cluster came free in 2 s to read its memory"):
            ray_backend._gpu_shares(work, _Stop())
    finally:
        ray.cancel(busy, force=True)
