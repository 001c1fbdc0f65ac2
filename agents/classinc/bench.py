"""The cost of Streaming EWC's training step: one mini-batch update with it against the same update without it, on
the class-incremental defaults of Split Digits (the default data) and Split MNIST (the paper's batches of 125).

    python -m agents.classinc.bench [--threads 1] [--device cpu|cuda]

Each step runs in a forked child process (:func:`interference.bench.measure`); the time is the minimum over repeats
after one warm-up call, and the ratio is ours over the plain step's.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import torch

from interference.bench import Case, Setup, table

__all__ = ["step_cases", "main"]

EWC_LAMBDA = 100.0  # any lambda > 0 costs the same; the smaller of the digits grid's values
SHAPES = {"split-digits": (1, 8, 8), "split-mnist": (1, 28, 28)}  # sample shapes; 10 classes each
CLASSES = 10


def _step(data: str, ewc: bool, device: torch.device) -> Setup:
    """One mini-batch update of the class-incremental learner as ``train_class_inc`` makes it, on ``data``'s default
    configuration (Streaming EWC on with ``ewc``), a random batch of that data's shape and default size."""
    def setup() -> Callable[[], None]:
        from agents.allocator import retain_freed_memory

        from .commands import defaults
        from .learner import ClassIncConfig, StreamingEWC, build_model, optimizer, update

        retain_freed_memory()
        cfg = ClassIncConfig(**{**defaults(data), "data": data, "ewc_lambda": EWC_LAMBDA})
        shape = SHAPES[data]
        model = build_model(cfg, shape, CLASSES, seed=0).to(device)
        opt = optimizer(model, cfg)
        g = torch.Generator().manual_seed(0)
        batch = (torch.rand(cfg.batch_size, *shape, generator=g).to(device),
                 torch.randint(0, CLASSES, (cfg.batch_size,), generator=g).to(device))
        state = StreamingEWC(model, cfg.ewc_lambda, cfg.ewc_gamma) if ewc else None

        def step() -> None:
            update(model, opt, state, batch, cfg.updates)
        return step
    return setup


def step_cases(device: torch.device) -> list[Case]:
    """Streaming EWC's mini-batch update against the plain one, per dataset."""
    from .commands import defaults

    out = []
    for data, repeats in (("split-digits", 50), ("split-mnist", 20)):
        cfg = defaults(data)
        features = math.prod(SHAPES[data])
        name = (f"Streaming EWC step, {data.removeprefix('split-')} {cfg['model'].upper()} {features}-{cfg['width']}-"
                f"{CLASSES} {cfg['act']}, B={cfg['batch_size']}")
        out.append(Case(name, _step(data, True, device), _step(data, False, device),
                        "plain step (no EWC), same model and batch", repeats))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: stable timings)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and torch.cuda.device_count() == 0:
        parser.error("--device cuda: no CUDA device")
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, device {device}, {args.threads} thread(s)")
    print("training step cost (ours/base: the time of our step over the baseline's)")
    table(step_cases(device), "ours/base", lambda a, b: a.seconds / b.seconds, args.threads, device)


if __name__ == "__main__":
    main()
