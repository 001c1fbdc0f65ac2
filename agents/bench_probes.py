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


class _TimedProbeCallback(ProbeCallback):
    """Also adds up the wall time spent inside probe rounds (a direct, noise-robust part of the overhead)."""

    seconds = 0.0
    rounds = 0

    def _probe(self, step: int) -> None:
        due = self.runner.due(step)
        start = time.perf_counter()
        super()._probe(step)
        if due:
            self.seconds += time.perf_counter() - start
            self.rounds += 1


def timed_learn(steps: int, every: int | None, log: Path) -> tuple[float, tuple[float, int]]:
    """Seconds in ``learn(steps)``, seconds inside probe rounds, and the number of rounds."""
    config = resolve("dqn", {"env": "MountainCar-v0", "act": "elephant", "seed": 0, "n_timesteps": steps})
    model = build_model(config)
    callback = None
    if every is not None:
        probes = [make_probe("gradcov", every=every), make_probe("ntk", every=every),
                  make_probe("sparsity", every=every)]
        callback = _TimedProbeCallback(probes, log, config=config, seed=0)
    start = time.perf_counter()
    model.learn(steps, callback=callback)
    seconds = time.perf_counter() - start
    return seconds, ((callback.seconds, callback.rounds) if callback else (0.0, 0))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agents.bench_probes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20_000, help="env steps per run")
    parser.add_argument("--every", type=int, default=1000, help="probe cadence in env steps")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        plain, _ = timed_learn(args.steps, None, Path(tmp) / "plain.h5")
        probed, (inside, n) = timed_learn(args.steps, args.every, Path(tmp) / "probed.h5")
    print(f"DQN MountainCar-v0, Elephant 1000 units, {args.steps} steps, 1 thread")
    print(f"  without probes: {plain:.1f} s ({args.steps / plain:.0f} steps/s)")
    print(f"  with gradcov+ntk+sparsity every {args.every}: {probed:.1f} s, of which {inside:.2f} s inside "
          f"{n} probe rounds ({1e3 * inside / max(n, 1):.0f} ms each, HDF5 writes included)")
    print(f"  overhead: {100 * inside / plain:.2f}% of training time measured inside the probes; "
          f"{100 * (probed - plain) / plain:+.2f}% from the two wall times (noisier)")


if __name__ == "__main__":
    main()
