"""Aggregate env steps per second of the population engine against SB3's DQN on the same network, in one process.

    python -m agents.population.bench [--env MountainCar-v0] [--act elephant] [--sizes 1,8,32,64] [--steps 600]

SB3's DQN (``agents.train dqn``'s model) and populations of P members (seeds 0..P-1, the env's default config)
train past ``learning_starts`` untimed (1000 steps), then ``--steps`` timed steps; one torch thread. SB3 is measured
before and after the populations and the ratios use the mean of both. Prints env steps/s (P x steps / seconds for
a population), the ratio to SB3 and where a population's time went (acting, env, update) for each implementation of
:data:`agents.population.engine.IMPLEMENTATIONS` asked for (the compile of "compiled" happens in the untimed
warm-up and is reported apart), with the allocator set as training sets it (:mod:`agents.allocator`). Do not run it
while a study runs on the same cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from agents.allocator import retain_freed_memory
from agents.rl.config import resolve
from agents.rl.run import build_model

from .engine import IMPLEMENTATIONS, Member, Population


def sb3_rate(config: dict, steps: int) -> float:
    model = build_model(config)
    model.learn(config["learning_starts"] + 1)
    t0 = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False)
    return steps / (time.perf_counter() - t0)


def population_rate(config: dict, p: int, steps: int, implementation: str) -> tuple[float, dict[str, float], float]:
    """Env steps/s of P members, the time shares of acting, env and update, and the warm-up's seconds."""
    members = [Member(seed=s, learning_rate=config["learning_rate"], buffer_size=config["buffer_size"])
               for s in range(p)]
    pop = Population(config, members, implementation=implementation)
    t0 = time.perf_counter()
    pop.learn(config["learning_starts"] + 1)
    warmup = time.perf_counter() - t0
    pop.seconds = dict.fromkeys(pop.seconds, 0.0)
    t0 = time.perf_counter()
    pop.learn(steps)
    elapsed = time.perf_counter() - t0
    return p * steps / elapsed, {k: v / elapsed for k, v in pop.seconds.items()}, warmup


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.population.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="MountainCar-v0")
    parser.add_argument("--act", default="elephant")
    parser.add_argument("--sizes", default="1,8,32,64")
    parser.add_argument("--steps", type=int, default=600, help="timed env steps (per member)")
    parser.add_argument("--implementations", default="compiled,batched",
                        help="comma-separated, of " + ", ".join(IMPLEMENTATIONS[1:]))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    retain_freed_memory()  # as training runs set it (SB3's and the populations'), before either is measured
    config = resolve("dqn", {"env": args.env, "act": args.act})
    before = sb3_rate(config, args.steps)
    print(f"SB3 DQN {args.env} {args.act}: {before:,.0f} env steps/s", file=sys.stderr)
    rows = []
    for impl in args.implementations.split(","):
        for p in (int(x) for x in args.sizes.split(",")):
            rate, split, warmup = population_rate(config, p, args.steps, impl)
            rows.append({"implementation": impl, "P": p, "steps_per_second": rate, "time_share": split,
                         "warmup_seconds": warmup})
            print(f"{impl:5s} P={p:3d}: {rate:9,.0f} env steps/s, {rate / before:5.2f}x SB3 (so far); time: "
                  + ", ".join(f"{k} {v:.0%}" for k, v in split.items())
                  + f" (warm-up incl. any compile {warmup:.0f} s)", file=sys.stderr)
    after = sb3_rate(config, args.steps)  # again: the machine's speed may have drifted meanwhile
    base = (before + after) / 2
    print(f"SB3 DQN again: {after:,.0f} env steps/s; ratios to their mean, {base:,.0f}:", file=sys.stderr)
    for row in rows:
        row["ratio_to_sb3"] = row["steps_per_second"] / base
        print(f"{row['implementation']:5s} P={row['P']:3d}: {row['ratio_to_sb3']:5.2f}x SB3", file=sys.stderr)
    result = {"env": args.env, "act": args.act, "sb3_steps_per_second": base, "sb3_before_after": [before, after],
              "population": rows}
    if args.json:
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
