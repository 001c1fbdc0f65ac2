"""Probe overhead on real training: the paper's DQN on MountainCar-v0 (1000 Elephant units), with and without
the gradcov + ntk + sparsity probes, measured in the same process with one torch thread.

    python -m agents.bench_probes [--steps 20000] [--every 1000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from probes import make_probe
from probes.sb3 import ProbeCallback

from .rl.config import resolve
from .rl.run import build_model


def timed_learn(steps: int, every: int | None, log: Path) -> tuple[float, int]:
    """Seconds spent in ``learn(steps)`` and the number of gradcov records (0 without probes)."""
    config = resolve("dqn", {"env": "MountainCar-v0", "act": "elephant", "seed": 0, "n_timesteps": steps})
    model = build_model(config)
    callback = None
    if every is not None:
        probes = [make_probe("gradcov", every=every), make_probe("ntk", every=every),
                  make_probe("sparsity", every=every)]
        callback = ProbeCallback(probes, log, config=config, seed=0)
    start = time.perf_counter()
    model.learn(steps, callback=callback)
    seconds = time.perf_counter() - start
    return seconds, (steps // every if every else 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agents.bench_probes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per run")
    parser.add_argument("--every", type=int, default=1000, help="probe cadence in env steps")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        plain, _ = timed_learn(args.steps, None, Path(tmp) / "plain.h5")
        probed, n = timed_learn(args.steps, args.every, Path(tmp) / "probed.h5")
    print(f"DQN MountainCar-v0, Elephant 1000 units, {args.steps} steps, 1 thread")
    print(f"  without probes: {plain:.1f} s ({args.steps / plain:.0f} steps/s)")
    print(f"  with gradcov+ntk+sparsity every {args.every}: {probed:.1f} s")
    print(f"  overhead: {100 * (probed - plain) / plain:+.2f}% of training time, "
          f"{1e3 * (probed - plain) / max(n, 1):.0f} ms per probe round ({n} rounds)")


if __name__ == "__main__":
    main()
