"""How long populations will train on this machine: each population's step timed here, before a grid starts.

A population's run is ``learning_starts`` steps acting at random, then steps that act epsilon-greedily and update
every member (one update per ``train_freq`` env steps: timed over whole periods). :func:`population_seconds` times both kinds of step on a throwaway
population of the same members, network, task and device (its ``learning_starts`` cut to one batch, so that updates
start at once; untimed warm-up steps first; one torch thread and glibc's allocator as training sets them) and
applies them to the run's length. Compiled implementations are timed
through their eager twins, scaled by the compiled step's speed-up measured once per implementation and device, on
the first population timed (one compile, which Inductor's cache then serves to that population's training; where
it fails, the eager time stands): networks the compiler speeds up more or less than that one make the estimate
rough. Compiles, probes, read-backs and checkpoints are not counted, and a resumed population is counted from step
0. Each shape (the shared config, the number of members, the largest buffer, the device) is timed once per
process.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from agents.allocator import retain_freed_memory
from agents.rl.envs import is_atari

from . import MEMBER_KEYS

__all__ = ["population_seconds", "step_seconds"]

#: timed steps of each kind (at least; and at least :data:`_TIMED_S` seconds of full steps)
_STEPS = 5
_TIMED_S = 0.3
_WARMUP = 3
#: the eager twin each compiled implementation is timed through
_EAGER = {"device-compiled": "device", "compiled": "batched"}

_TIMED: dict[str, tuple[float, float]] = {}
_SPEEDUP: dict[tuple[str, str], float] = {}


def step_seconds(configs: Sequence[Mapping[str, Any]], members: Sequence[Any], implementation: str,
                 device: str) -> tuple[float, float]:
    """Seconds of one env step of a population of ``members`` on ``configs`` (one per member) with
    ``implementation`` on ``device``: (acting at random, before ``learning_starts``; acting greedily and updating,
    after), as measured now."""
    from .run import _engine

    configs = [{**c, "learning_starts": int(c["batch_size"])} for c in configs]
    config = configs[0]
    every = int(config.get("train_freq", 1))
    block = -(-_STEPS // every) * every  # (timed steps in whole update periods: each period holds one update)
    retain_freed_memory()  # as training sets it (this process then keeps the heap of the largest step timed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if config.get("torch_threads") is None else int(config["torch_threads"]))
    try:
        pop = _engine(configs, members, implementation, device)
        clock = _Clock(device)
        for _ in range(config["learning_starts"] - _STEPS):
            pop.step()
        random_s = clock.time(pop.step, _STEPS)
        for _ in range(_WARMUP):
            pop.step()
        full_s, n = 0.0, 0
        while n < block or full_s * n < _TIMED_S:
            full_s, n = (full_s * n + clock.time(pop.step, block) * block) / (n + block), n + block
        return random_s, full_s
    finally:
        torch.set_num_threads(threads)
        pop = None
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()  # (the grid's own processes train next)


class _Clock:
    def __init__(self, device: str) -> None:
        cuda = torch.device(device).type == "cuda"
        self.sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)

    def time(self, step: Any, n: int) -> float:
        """Mean seconds of ``n`` calls of ``step``."""
        self.sync()
        start = time.perf_counter()
        for _ in range(n):
            step()
        self.sync()
        return (time.perf_counter() - start) / n


def population_seconds(configs: Sequence[Mapping[str, Any]], members: Sequence[Any], implementation: str,
                       device: str) -> float:
    """Estimated seconds to train ``members`` (of ``configs``, resolved ``dqn`` configs that differ only in their
    members' settings) as one population with ``implementation`` on ``device`` (module docstring)."""
    from .run import _engine

    config = configs[0]
    if implementation == "auto" and is_atari(config["env"]):  # (an Atari build allocates every member's replay)
        from .atari import atari_implementation

        implementation = atari_implementation(implementation, device)
    elif implementation == "auto":  # the engine's own choice for this population (building it compiles nothing)
        implementation = _engine(configs, members, implementation, device).implementation
    eager = _EAGER.get(implementation, implementation)
    networks = sorted(json.dumps({k: v for k, v in c.items() if k not in (*MEMBER_KEYS, "derived")},
                                 sort_keys=True, default=str) for c in configs)  # (each member's: mixes count)
    shape = json.dumps([networks, len(members), max(m.buffer_size for m in members), eager, device], sort_keys=True,
                       default=str)
    if shape not in _TIMED:
        _TIMED[shape] = step_seconds(configs, members, eager, device)
    random_s, full_s = _TIMED[shape]
    if eager != implementation:
        if (implementation, device) not in _SPEEDUP:
            try:
                _SPEEDUP[implementation, device] = full_s / step_seconds(configs, members, implementation, device)[1]
            except Exception:  # (a compile that fails here fails in training too, which says why; "auto" runs eagerly)
                _SPEEDUP[implementation, device] = 1.0
        full_s /= _SPEEDUP[implementation, device]
    steps, starts = int(config["n_timesteps"]), int(config["learning_starts"])
    return min(steps, starts) * random_s + max(0, steps - starts) * full_s
