"""Env steps per second of DQN (or PPO/SAC) with different activations, measured in one process.

    python -m agents.rl.bench [--algo dqn] [--env MountainCar-v0] [--acts elephant,relu] [--steps 5000]
                              [--warmup 1500] [--repeats 3] [--set KEY=VALUE ...]

Each activation gets its agent from the same config resolution as ``agents.train`` (the per-env YAML defaults:
for DQN on MountainCar the paper's Elephant 1000 and a width-matched ReLU). Per repeat and activation (the order
alternates between repeats, so slow phases of a shared machine hit both): a fresh agent trains ``--warmup`` steps
untimed (past ``learning_starts``, so every timed step includes a gradient update), then ``--steps`` timed steps.
Reports the median steps per second per activation and the ratio to the first activation. One torch thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from .algos import ALGOS
from .config import resolve


def measure(algo: str, env: str, act: str, steps: int, warmup: int, seed: int = 0,
            extra: dict | None = None) -> float:
    """Env steps per second of ``steps`` timed training steps after ``warmup`` untimed ones."""
    from .run import build_model

    config = resolve(algo, {"env": env, "act": act, "seed": seed, "n_timesteps": warmup + steps, **(extra or {})})
    model = build_model(config)
    model.learn(warmup, log_interval=None)
    start = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False, log_interval=None)
    elapsed = time.perf_counter() - start
    model.get_env().close()
    return steps / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.rl.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", default="dqn", choices=list(ALGOS))
    parser.add_argument("--env", default="MountainCar-v0")
    parser.add_argument("--acts", default="elephant,relu", help="comma-separated activations; ratios are to the first")
    parser.add_argument("--steps", type=int, default=5000, help="timed env steps per measurement")
    parser.add_argument("--warmup", type=int, default=1500, help="untimed env steps before (past learning_starts)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config setting for every activation, e.g. --set buffer_size=1000")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    acts = [a for a in args.acts.split(",") if a]
    extra = {"set": args.set} if args.set else {}
    rates: dict[str, list[float]] = {a: [] for a in acts}
    for r in range(args.repeats):
        for act in acts if r % 2 == 0 else acts[::-1]:
            rate = measure(args.algo, args.env, act, args.steps, args.warmup, seed=r, extra=extra)
            rates[act].append(rate)
            print(f"repeat {r}: {act:10s} {rate:8.1f} steps/s", file=sys.stderr, flush=True)
    medians = {a: statistics.median(v) for a, v in rates.items()}
    first = acts[0]
    # time per step of the first activation relative to each other one (> 1: the first is slower)
    slowdown = {a: medians[a] / medians[first] for a in acts[1:]}
    result = {"algo": args.algo, "env": args.env, "steps": args.steps, "warmup": args.warmup,
              "repeats": args.repeats, "threads": args.threads, "steps_per_second": rates,
              "median_steps_per_second": medians, f"{first}_time_per_step_ratio": slowdown}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for a in acts:
            print(f"{a:10s} median {medians[a]:8.1f} env steps/s")
        for a, ratio in slowdown.items():
            print(f"{first} takes {ratio:.2f}x the time per env step of {a}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
