"""The Ray backend: the tasks on a Ray cluster, one CPU each (and, for tasks on CUDA, a share of a GPU) and never
retried."""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from tqdm import tqdm

from ..commands import get_command, population
from ..errors import ConfigError
from ..runlock import LOCK_NAME
from ..signals import STOP_SIGNALS, handling
from .drive import Outcome, _drive, _outcomes, _Stop
from .planning import PopulationTask, Task, _runs
from .worker import _NotStarted, run_task


def _ray_task(task: Task) -> tuple[str, Any]:
    """:func:`run_task` as a Ray task: ``("done", result)``, or ``("exit", status)`` for SystemExit (a run stopped
    by a signal; ``ray.cancel`` sends SIGINT), which must not leave the worker (Ray would report it crashed)."""
    try:
        return "done", run_task(task)
    except SystemExit as err:
        return "exit", err.code
    except KeyboardInterrupt:
        return "exit", 128 + signal.SIGINT


class WorkerLost(RuntimeError):
    """The Ray worker (or node) running a task died: killed, out of memory, or its node lost."""

    __module__ = "agents.grid"  # its public name, which a run's failure reason shows (agents.grid.WorkerLost: ...)


def _run_ray(work: Sequence[Task], workers: int | None, stop: _Stop, record: Callable[[Outcome], None],
             began: float) -> None:
    """Run the tasks on the Ray cluster at ``RAY_ADDRESS`` (else a local one started here), ``workers`` at a time
    (default: as many as it has CPUs), one CPU each (tasks on CUDA also a share of a GPU: :func:`_gpu_shares`;
populations whose replays live on the host also that memory: :func:`_host_memory`) and
    never retried. A stop signal cancels the running tasks
    (SIGINT in their workers: they stop as on Ctrl-C); a cancelled task that took no run lock since ``began`` (the
    grid's start) never began."""
    try:
        import ray
    except ImportError:
        raise ConfigError("the ray backend needs Ray: pip install -e '.[ray]'") from None
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    address = os.environ.get("RAY_ADDRESS") or None
    owned = not ray.is_initialized()
    if owned:
        if address:
            _check_reachable(address)
        try:
            if address:
                ray.init(address=address, logging_level=logging.WARNING)
            else:
                ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
        except ConnectionError as err:
            token = "InvalidAuthToken" in "".join(traceback.format_exception(err))
            hint = "; the cluster uses token authentication: set RAY_AUTH_MODE=token, with its token in " \
                   "~/.ray/auth_token or RAY_AUTH_TOKEN" if token else ""
            raise ConfigError(f"cannot connect to the Ray cluster at RAY_ADDRESS={address}: {err}{hint}") from None
    try:
        with handling(STOP_SIGNALS, stop.on_signal):  # again: ray.init sets its own SIGTERM handler
            cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
            slots = workers or cpus
            started = " (started here)" if owned and not address else ""
            limit = f", {slots} task{'s' * (slots > 1)} at a time (--workers)" if workers else ""
            shares = _gpu_shares(work, stop)
            host = _host_memory(work)
            if shares:
                low, high = min(shares.values()), max(shares.values())
                limit += f"; tasks on cuda take {low:g}{f'-{high:g}' if high > low else ''} of a GPU each"
            tqdm.write(f"ray: the cluster at {ray.get_runtime_context().gcs_address}{started}, {cpus} CPUs{limit}",
                       file=sys.stderr)
            # max_calls=1: a fresh worker process per task. A task cancelled in the middle of an import (ray.cancel
            # raises KeyboardInterrupt wherever the task is) leaves half-initialised modules in its process, and a
            # reused worker would fail every later task there (e.g. torch's lazy import of sympy).
            remote = ray.remote(num_cpus=1, max_retries=0, max_calls=1)(_ray_task)
            cancelled: set[Hashable] = set()
            def ended(ref: Hashable, task: Task) -> list[Outcome]:
                return _outcomes(task, lambda: _ray_result(ref, lambda: _locked_since(task, began)))

            def wait_some(running: dict[Hashable, Task]) -> list[Outcome]:
                while True:
                    if stop.signum is not None:
                        # the latest first: those still waiting for a CPU, which a cancelled task's CPU would start
                        for ref in [r for r in reversed(running) if r not in cancelled]:
                            ray.cancel(ref)
                            cancelled.add(ref)
                    done, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
                    if done:
                        return [o for ref in done for o in ended(ref, running.pop(ref))]

            def start(task: Task) -> Hashable:
                share, memory = shares.get(id(task), 0.0), host.get(id(task))
                options = {**({"num_gpus": share} if share else {}), **({"memory": memory} if memory else {})}
                return (remote.options(**options) if options else remote).remote(task)

            _drive(work, slots, start, wait_some, stop, record)
    finally:
        if owned:
            ray.shutdown()


#: GPU memory allowed for each task's process beyond its estimate (its CUDA context and the allocator's slack): an
#: allowance, not a measurement
CUDA_OVERHEAD = 2**30
#: seconds to wait for a GPU of the cluster to read its memory
PROBE_S = 60.0


def _on_cuda(task: Task) -> bool:
    return any(str(r.config.get("device", "cpu")).startswith("cuda") for r in _runs(task))


def _gpu_shares(work: Sequence[Task], stop: _Stop) -> dict[int, float]:
    """The share of one GPU each task on CUDA asks Ray for (by ``id``): a population, its engine's memory estimate
    plus :data:`CUDA_OVERHEAD` over the memory of a GPU of the cluster (probed by a task given one; the cluster's
    GPUs are taken to be alike), in hundredths, rounded up, at most 1, so that small populations share a GPU; any
    other run, a whole GPU. Refuses ``cuda:N``, and ``auto`` on a cluster with GPUs (Ray picks the GPU, shows a task
    only its own and hides them all from tasks that ask for none), a cluster without GPUs, or one whose GPU tasks
    cannot use CUDA; a stop signal while waiting for a GPU raises KeyboardInterrupt."""
    import ray
    from ray.exceptions import RayError

    devices = {str(r.config.get("device", "cpu")) for t in work for r in _runs(t)}
    gpus = ray.cluster_resources().get("GPU", 0)
    if any(d.startswith("cuda:") for d in devices) or "auto" in devices and gpus:
        raise ConfigError("on Ray name device: cuda or device: cpu, not auto or cuda:N (Ray hides the GPUs from tasks "
                          "that ask for none, and shows a task given one only that GPU)")
    cuda = [t for t in work if _on_cuda(t)]
    if not cuda:
        return {}
    if not gpus:
        raise ConfigError(f"{len(cuda)} of this grid's tasks ask for device cuda and the Ray cluster has no GPUs: "
                          "start its nodes with GPUs (ray start --num-gpus N), or set device: cpu")
    ref = ray.remote(num_gpus=1, num_cpus=0, max_retries=0)(_cuda_memory).remote()
    deadline = time.monotonic() + PROBE_S
    while not ray.wait([ref], timeout=0.5)[0]:
        if stop.signum is not None or time.monotonic() > deadline:
            ray.cancel(ref, force=True)
            if stop.signum is not None:
                raise KeyboardInterrupt
            raise ConfigError(f"no GPU of the Ray cluster came free in {PROBE_S:.0f} s to read its memory; run the "
                              "grid when one is free")
    try:
        usable, total = ray.get(ref)
    except RayError as err:
        raise ConfigError(f"reading a GPU's memory in a Ray task failed ({type(err).__name__}: "
                          f"{str(err).strip().splitlines()[-1] if str(err).strip() else ''})") from None
    if not usable:
        raise ConfigError("the Ray cluster's GPU tasks cannot use CUDA (torch.cuda.is_available() is False in a task "
                          "given a GPU): check its nodes' drivers and torch build, or set device: cpu")
    return {id(t): gpu_share(t, total) for t in cuda}


def _host_memory(work: Sequence[Task]) -> dict[int, int]:
    """The host memory each population task asks Ray for (by ``id``; Ray's ``memory`` resource): its engine's
    estimate of what it holds on the host (an Atari population's replays), so that a node runs only as many as its
    RAM holds. Refuses a task larger than every node's memory."""
    import ray

    need = {}
    for task in work:
        if isinstance(task, PopulationTask):
            engine = population(get_command(task.runs[0].command))
            estimate = engine.host_bytes([r.config for r in task.runs]) if hasattr(engine, "host_bytes") else None
            if estimate:
                need[id(task)] = int(estimate)
    if need:
        largest = max((n.get("Resources", {}).get("memory", 0) for n in ray.nodes() if n.get("Alive")), default=0)
        if max(need.values()) > largest:
            raise ConfigError(f"a population of this grid needs {max(need.values()) / 2**30:.1f} GiB of host memory "
                              f"for its replays and the largest node of the Ray cluster has {largest / 2**30:.1f} "
                              "GiB for tasks: set population_size smaller, or buffer_size")
    return need


def gpu_share(task: Task, gpu_bytes: int) -> float:
    """The share of a GPU of ``gpu_bytes`` that ``task`` (on CUDA) asks for (:func:`_gpu_shares`)."""
    if not isinstance(task, PopulationTask):
        return 1.0
    engine = population(get_command(task.runs[0].command))
    estimate = engine.memory_bytes([r.config for r in task.runs]) if hasattr(engine, "memory_bytes") else None
    if estimate is None:
        return 1.0
    return min(1.0, math.ceil(100 * (estimate + CUDA_OVERHEAD) / gpu_bytes) / 100)


def _cuda_memory() -> tuple[bool, int]:
    """In a Ray task given a GPU: whether torch sees CUDA, and the GPU's memory in bytes."""
    import torch

    if not torch.cuda.is_available():
        return False, 0
    return True, torch.cuda.get_device_properties(0).total_memory


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """ConfigError unless ``address`` (HOST:PORT; other forms are left to Ray) takes a TCP connection: Ray itself
    retries an unreachable address for minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ConfigError(f"cannot reach the Ray cluster at RAY_ADDRESS={address} ({err.strerror or err}); start it "
                          "with ray start --head, or unset RAY_ADDRESS for a local cluster") from None


def _locked_since(task: Task, t: float) -> bool:
    """Whether a worker took one of ``task``'s run locks since ``t`` (the task began: it writes the lock first)."""
    for run in _runs(task):
        try:
            if (run.run_dir / LOCK_NAME).stat().st_mtime >= t:
                return True
        except OSError:
            continue
    return False


def _ray_result(ref: Any, started: Callable[[], bool]) -> Any:
    """A Ray task's result, or what it raised: the task's own exception; SystemExit for a run a signal stopped;
    for a cancelled task (Ray does not say whether it had started), KeyboardInterrupt if ``started()``, else
    :class:`_NotStarted`; :class:`WorkerLost` when its worker or node died."""
    import ray
    from ray.exceptions import RayError, RayTaskError, TaskCancelledError

    try:
        kind, value = ray.get(ref)
    except RayTaskError as err:
        raise (err.cause if isinstance(err.cause, BaseException) else err) from None
    except TaskCancelledError:
        raise (KeyboardInterrupt if started() else _NotStarted) from None
    except RayError as err:
        raise WorkerLost(f"the Ray worker running it died ({type(err).__name__}: {' '.join(str(err).split())}); "
                         "re-run the grid with --resume to continue it from its last checkpoint") from None
    if kind == "exit":
        raise SystemExit(value)
    return value
