"""Aggregate env steps per second of the population engine against SB3's DQN on the same network, in one process.

    python -m agents.population.bench [--env MountainCar-v0] [--act elephant] [--sizes 1,8,32,64] [--steps 600]
    python -m agents.population.bench --device cuda --sizes 1024,4096,16384 --implementations device,device-compiled
    python -m agents.population.bench --env ALE/Breakout-v5 [--algo rainbow] [--device cuda]


SB3's DQN (``agents.train dqn``'s model) and populations of P members (seeds 0..P-1, the env's default config)
train past ``learning_starts`` untimed (1000 steps), then ``--steps`` timed steps; one torch thread. SB3 is measured
before and after the populations and the ratios use the mean of both. Prints env steps/s (P x steps / seconds for
a population), the ratio to SB3 and where a population's time went (acting, env, update) for each implementation of
:data:`agents.population.engine.IMPLEMENTATIONS` asked for (the compile of "compiled" happens in the untimed
warm-up and is reported apart), with the allocator set as training sets it (:mod:`agents.allocator`), and for the
device step (:mod:`agents.population.device`: ``device``, eager; ``device-compiled``, both phases through
``torch.compile``). SB3's DQN runs on the CPU (one thread, as a single run trains fastest; an Atari run on
``--device``); ``--device cuda`` runs
the populations on the GPU and adds the GPU's busy share (kernel time over wall time, from the profiler, over 20
steps) and the peak GPU memory per member. Memory per member is the
population's own tensors (parameters, optimiser state, replay) over P. Do not run it while a study runs on the same
cores.

An Atari id benchmarks :class:`agents.population.atari.AtariPopulation` (implementations ``loop`` and ``vmap``;
default sizes 1, 4, 8) against ``agents.train dqn --set atari_env=ale-vector`` (the authors' Atari DQN, one update
per 10 env steps, on the same C++ vector env; ``--algo rainbow``: their Rainbow), both with the full
1e6-transition frame buffer per member (allocated, filled only as far as the run goes: the memory per member is
what a member needs at the paper's scale), and prints the device-hours the paper's Atari study of that algorithm
(:data:`STUDY_STEPS`) would take at the best rate measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
import torch

from agents.allocator import retain_freed_memory
from agents.rl.config import resolve
from agents.rl.run import build_model

from agents.rl.envs import is_atari
from agents.rl.frame_buffer import FrameReplayBuffer

from .device import DEVICE_MODES, DevicePopulation
from .engine import IMPLEMENTATIONS, Member, Population

#: agent-steps of the paper's Atari study of one algorithm (DQN or Rainbow): 10 games x 6 activations x 5 seeds x
#: 12.5M env steps
STUDY_STEPS = 10 * 6 * 5 * 12_500_000


def sb3_rate(config: dict, steps: int) -> float:
    model = build_model(config)
    model.learn(config["learning_starts"] + 1)
    t0 = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False)
    return steps / (time.perf_counter() - t0)


def _tensor_bytes(pop: Any) -> int:
    """Bytes of the population's own tensors and arrays (parameters, target, optimiser state, replay buffers; the
    Atari population's per-member networks and frame buffers as allocated; sub-populations summed)."""
    if hasattr(pop, "groups"):
        return sum(_tensor_bytes(g) for g in pop.groups)
    seen, total = set(), 0
    for value in vars(pop).values():
        items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else [value]
        for t in items:
            if isinstance(t, torch.nn.Module):
                t = list(t.state_dict().values())
            for x in t if isinstance(t, list) else [t]:
                if isinstance(x, torch.Tensor) and x.data_ptr() not in seen:
                    seen.add(x.data_ptr())
                    total += x.numel() * x.element_size()
                elif isinstance(x, np.ndarray):
                    total += x.nbytes
                elif isinstance(x, FrameReplayBuffer):
                    total += x.nbytes()
    return total


def _gpu_busy(pop: Any, steps: int = 20) -> float:
    """The GPU's busy share over ``steps`` steps: summed kernel time over wall time (the profiler's CUDA events)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        pop.learn(steps)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    busy_us = sum(getattr(e, "self_device_time_total", 0) for e in prof.key_averages())  # (each kernel once)
    return busy_us / 1e6 / wall


def population_rate(config: dict, p: int, steps: int, implementation: str, device: str = "cpu",
                    mix: list[dict] | None = None) -> tuple[float, dict[str, float], float, dict[str, float]]:
    """Env steps/s of P members, the time shares of acting, env and update (the engine's implementations), the
    warm-up's seconds and the memory (MB per member; on CUDA, also the peak) and GPU busy share. Atari: ``mix``,
    configs of other activations, member ``i`` on ``mix[i % len(mix)]`` (sub-populations in one process)."""
    members = [Member(seed=s, learning_rate=config["learning_rate"], buffer_size=config["buffer_size"])
               for s in range(p)]
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    if is_atari(config["env"]):
        from .run import _engine

        mix = mix or [config]
        pop: Any = _engine([mix[i % len(mix)] for i in range(p)], members, implementation, device)
    elif implementation in DEVICE_MODES:
        pop = DevicePopulation(config, members, device=device, compile=implementation == "device-compiled")
    else:
        pop = Population(config, members, implementation=implementation, device=device)
    t0 = time.perf_counter()
    pop.learn(config["learning_starts"] + 1)
    if cuda:
        torch.cuda.synchronize()
    warmup = time.perf_counter() - t0
    before = dict(getattr(pop, "seconds", {}))
    t0 = time.perf_counter()
    pop.learn(steps)
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    seconds = {k: v - before[k] for k, v in getattr(pop, "seconds", {}).items()}
    extra = {"mb_per_member": _tensor_bytes(pop) / p / 2**20}
    if cuda:
        extra["gpu_busy"] = _gpu_busy(pop)
        extra["peak_mb_per_member"] = torch.cuda.max_memory_allocated() / p / 2**20
    return p * steps / elapsed, {k: v / elapsed for k, v in seconds.items()}, warmup, extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.population.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="MountainCar-v0")
    parser.add_argument("--act", default="elephant",
                        help="the activation; on Atari a comma-separated list trains members of each in turn "
                             "as sub-populations of one population (SB3 on the first)")
    parser.add_argument("--algo", default="dqn", choices=("dqn", "rainbow"), help="rainbow: Atari ids only")
    parser.add_argument("--sizes", default=None, help="population sizes (default 1,8,32,64; Atari 1,4,8)")
    parser.add_argument("--steps", type=int, default=600, help="timed env steps (per member)")
    parser.add_argument("--implementations", default=None,
                        help="default compiled,batched (Atari: loop,vmap); "
                             "comma-separated, of " + ", ".join((*IMPLEMENTATIONS[1:], *DEVICE_MODES)))
    parser.add_argument("--device", default="cpu", help="cpu or cuda: the populations' device (SB3 runs on the CPU)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config setting for SB3 and the populations alike, e.g. --set frames_on=device")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    retain_freed_memory()  # as training runs set it (SB3's and the populations'), before either is measured
    atari = is_atari(args.env)
    sizes = args.sizes or ("1,4,8" if atari else "1,8,32,64")
    implementations = args.implementations or ("loop,vmap" if atari else "compiled,batched")
    extra_settings = {"atari_env": "ale-vector", "eval_every": None, "probe": []} if atari else {}
    if args.algo != "dqn" and not atari:
        parser.error(f"--algo {args.algo} benchmarks Atari populations: give an ALE id as --env")
    acts = args.act.split(",")
    if len(acts) > 1 and not atari:
        parser.error("--act: several activations in one population are for Atari ids")
    mix = [resolve(args.algo, {"env": args.env, "act": a, "device": args.device, **extra_settings, "set": args.set})
           for a in acts]
    config = mix[0]
    sb3_config = config if atari else {**config, "device": "cpu"}  # (an Atari run trains fastest on the device)
    before = sb3_rate(sb3_config, args.steps)
    agent = "Rainbow" if args.algo == "rainbow" else "SB3 DQN"
    print(f"{agent} {args.env} {acts[0]}: {before:,.0f} env steps/s", file=sys.stderr)
    rows = []
    for impl in implementations.split(","):
        for p in (int(x) for x in sizes.split(",")):
            rate, split, warmup, extra = population_rate(config, p, args.steps, impl, args.device, mix)
            rows.append({"implementation": impl, "P": p, "steps_per_second": rate, "time_share": split,
                         "warmup_seconds": warmup, **extra})
            print(f"{impl:5s} P={p:3d}: {rate:9,.0f} env steps/s, {rate / before:5.2f}x SB3 (so far); "
                  + (f"time: {', '.join(f'{k} {v:.0%}' for k, v in split.items())}; " if split else "")
                  + f"{extra['mb_per_member']:.2f} MB/member"
                  + (f", GPU busy {extra['gpu_busy']:.0%}, peak {extra['peak_mb_per_member']:.2f} MB/member"
                     if "gpu_busy" in extra else "")
                  + f" (warm-up incl. any compile {warmup:.0f} s)", file=sys.stderr)
    after = sb3_rate(sb3_config, args.steps)  # again: the machine's speed may have drifted meanwhile
    base = (before + after) / 2
    print(f"{agent} again: {after:,.0f} env steps/s; ratios to their mean, {base:,.0f}:", file=sys.stderr)
    for row in rows:
        row["ratio_to_sb3"] = row["steps_per_second"] / base
        print(f"{row['implementation']:5s} P={row['P']:3d}: {row['ratio_to_sb3']:5.2f}x SB3", file=sys.stderr)
    if atari:
        best = max(rows, key=lambda r: r["steps_per_second"])
        hours = STUDY_STEPS / best["steps_per_second"] / 3600
        print(f"the paper's Atari {agent.removeprefix('SB3 ')} study ({STUDY_STEPS:.2e} agent-steps) at the best "
              f"rate ({best['implementation']}"
              f" P={best['P']}: {best['steps_per_second']:,.0f} agent-steps/s): {hours:,.0f} hours of this machine "
              f"({args.device}); single runs at {base:,.0f} steps/s: {STUDY_STEPS / base / 3600:,.0f} hours",
              file=sys.stderr)
    result = {"env": args.env, "act": args.act, "device": args.device, "set": args.set, "sb3_steps_per_second": base,
              "sb3_before_after": [before, after], "population": rows}
    if args.json:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
