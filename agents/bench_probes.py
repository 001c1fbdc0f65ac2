"""Probe overhead on real training: the paper's DQN on MountainCar-v0 (1000 Elephant units), with and without
probes (default: all built-in ones but ``outputs``), measured in the same process with one torch thread; the time
inside each probe is reported too.

    python -m agents.bench_probes [--steps 20000] [--every 1000] [--probes gradcov,ntk,sparsity,weights,plasticity]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from probes import Probe, make_probe
from probes.sb3 import ProbeCallback

from .rl.config import resolve
from .rl.run import build_model


class _TimedProbeCallback(ProbeCallback):
    """Also adds up the wall time spent inside probe rounds (a direct, noise-robust part of the overhead) and
    inside each probe."""

    seconds = 0.0
    rounds = 0

    def _probe(self, step: int) -> None:
        due = self.runner.due(step)
        start = time.perf_counter()
        super()._probe(step)
        if due:
            self.seconds += time.perf_counter() - start
            self.rounds += 1


def _timed(probe: Probe, spent: dict[str, float]) -> Probe:
    """``probe`` with its ``on_step`` timed into ``spent[probe.name]``."""
    on_step = probe.on_step

    def timed(ctx, log):
        start = time.perf_counter()
        try:
            return on_step(ctx, log)
        finally:
            spent[probe.name] = spent.get(probe.name, 0.0) + time.perf_counter() - start

    probe.on_step = timed
    return probe


def timed_learn(steps: int, every: int | None, log: Path, names: list[str] = (),
                spent: dict[str, float] | None = None) -> tuple[float, tuple[float, int]]:
    """Seconds in ``learn(steps)``, seconds inside probe rounds, and the number of rounds."""
    config = resolve("dqn", {"env": "MountainCar-v0", "act": "elephant", "seed": 0, "n_timesteps": steps})
    model = build_model(config)
    callback = None
    if every is not None:
        probes = [_timed(make_probe(name, every=every), spent if spent is not None else {}) for name in names]
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
    parser.add_argument("--probes", default="gradcov,ntk,sparsity,weights,plasticity", help="probes to time")
    args = parser.parse_args(argv)
    names = [n for n in args.probes.split(",") if n]
    torch.set_num_threads(1)
    spent: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        plain, _ = timed_learn(args.steps, None, Path(tmp) / "plain.h5")
        probed, (inside, n) = timed_learn(args.steps, args.every, Path(tmp) / "probed.h5", names, spent)
    print(f"DQN MountainCar-v0, Elephant 1000 units, {args.steps} steps, 1 thread")
    print(f"  without probes: {plain:.1f} s ({args.steps / plain:.0f} steps/s)")
    print(f"  with {'+'.join(names)} every {args.every}: {probed:.1f} s, of which {inside:.2f} s inside "
          f"{n} probe rounds ({1e3 * inside / max(n, 1):.0f} ms each, HDF5 writes included)")
    for name, seconds in spent.items():
        print(f"    {name}: {1e3 * seconds / max(n, 1):.1f} ms per round, {100 * seconds / plain:.2f}% of training")
    print(f"  overhead: {100 * inside / plain:.2f}% of training time measured inside the probes; "
          f"{100 * (probed - plain) / plain:+.2f}% from the two wall times (noisier)")


if __name__ == "__main__":
    main()
