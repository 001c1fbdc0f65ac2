"""Benchmarks of the core against the obvious alternatives, measured in the same run.

    python -m interference.bench [--threads 1] [--device cpu|cuda] [--quick] [--only SUBSTRING]
    python -m interference.bench --patterns [--threads 1] [--device cpu|cuda] [--only SUBSTRING]

Each case runs in a forked child process, so its peak extra memory (resident set on CPU, allocator peak on
CUDA) is measured from the same starting point. Times are the minimum over repeats after one warm-up call (as
``timeit`` advises: on a shared machine the slower repeats measure the other tenants, not the code). The warm-up
call of the ``ntk`` cases is reported on its own ("first call overhead"): it makes the plan the later calls reuse.
:func:`table` prints rows of cases against their baselines; the learners' own benchmarks (e.g.
:mod:`agents.classinc.bench`) use it.

``--patterns`` times ``ntk`` (``implementation="auto"``) against ``implementation="func"`` on every model of the test
registry ``tests/ntk_patterns.py`` at N=32, in this process (the models are tiny), the engine's warnings silenced.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import resource
import sys
import textwrap
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

from .activations import elephant
from .gradcov import gradient_covariance
from .nets import mlp, nature_cnn
from .ntk import ntk

Setup = Callable[[], Callable[[], object]]

PATTERN_N = 32  # samples per pattern under --patterns
PATTERN_REPEATS = 3


@dataclass
class Timing:
    seconds: float  # minimum over the repeats
    first: float  # the warm-up call
    extra_mib: float


@dataclass
class Case:
    name: str
    ours: Setup
    baseline: Setup
    baseline_name: str
    repeats: int
    first_call: bool = False  # also reported under "first call overhead"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(run: Callable[[], object], device: torch.device) -> float:
    """Seconds of one ``run()``, the work it queued on the device included."""
    start = time.perf_counter()
    run()
    _sync(device)
    return time.perf_counter() - start


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(setup: Setup, repeats: int, threads: int, device: torch.device, conn: Connection) -> None:
    torch.set_num_threads(threads)
    run = setup()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    base = _peak_bytes(device)
    first = _timed(run, device)
    extra = _peak_bytes(device) - base
    times = [_timed(run, device) for _ in range(repeats)]
    conn.send((min(times, default=first), first, extra / 2**20))
    conn.close()


def measure(setup: Setup, repeats: int, threads: int, device: torch.device) -> Timing:
    """Minimum seconds of ``setup()()`` over ``repeats``, its warm-up call and peak extra memory, in a fresh forked
    process."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(setup, repeats, threads, device, child))
    proc.start()
    child.close()
    try:
        seconds, first, mib = parent.recv()
    except EOFError:
        proc.join()
        message = f"a benchmark's child process failed (exit code {proc.exitcode}); its error is above"
        raise RuntimeError(message) from None
    proc.join()
    return Timing(seconds, first, mib)


# ----------------------------------------------------------------------------------------------- baselines
def tutorial_ntk(model: nn.Module, x: Tensor) -> Tensor:
    """PyTorch's NTK tutorial: ``vmap(jacrev)`` Jacobians contracted per parameter, ``(N, N, O, O)``."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def fnet_single(p: dict[str, Tensor], xi: Tensor) -> Tensor:
        return torch.func.functional_call(model, p, (xi.unsqueeze(0),)).squeeze(0)

    jac = torch.func.vmap(torch.func.jacrev(fnet_single), (None, 0))(params, x)
    jac = [j.flatten(2) for j in jac.values()]
    return torch.stack([torch.einsum("Naf,Mbf->NMab", j, j) for j in jac]).sum(0)


def vmap_grad_covariance(model: nn.Module, loss: Callable, batch: tuple[Tensor, ...]) -> Tensor:
    """Per-sample gradients by ``vmap(grad)``, flattened, then their cosine-similarity matrix ``(k, k)``."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def single(p: dict[str, Tensor], *sample: Tensor) -> Tensor:
        return loss(lambda o: torch.func.functional_call(model, p, (o,)), *(s.unsqueeze(0) for s in sample))[0]

    grads = torch.func.vmap(torch.func.grad(single), (None, 0, 0, 0))(params, *batch)
    g = torch.cat([v.flatten(1) for v in grads.values()], 1)
    n = g.norm(dim=1)
    return (g @ g.T) / n[:, None] / n[None, :]


def td_loss(q_fn: Callable[[Tensor], Tensor], obs: Tensor, actions: Tensor, targets: Tensor) -> Tensor:
    """Per-sample squared TD error of a Q-network against fixed targets, ``(k,)``."""
    return (q_fn(obs).gather(1, actions[:, None]).squeeze(1) - targets) ** 2


# ----------------------------------------------------------------------------------------------- cases
def _atari_batch(k: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    obs = torch.rand(k, 4, 84, 84, generator=g).to(device)
    return obs, torch.randint(0, 18, (k,), generator=g).to(device), torch.randn(k, generator=g).to(device)


def _prime(model: nn.Module, x: Tensor) -> None:
    """One forward and backward on two samples and a tiny ``vmap(jacrev)``, so that a first timed call does not pay
    for torch's own first use of the kernels (on CUDA, of its libraries) and of ``torch.func`` (about 1 s on CPU)."""
    model(x[:2]).sum().backward()
    model.zero_grad(set_to_none=True)
    torch.func.vmap(torch.func.jacrev(torch.sin))(x[:2].detach().flatten(1)[:, :2])


def cases(device: torch.device, quick: bool) -> list[Case]:
    """The core's cases: ``ntk``, ``gradient_covariance`` and Elephant against their baselines."""
    n_mlp, n_cnn, k = (64, 8, 32) if quick else (256, 32, 32)

    def mlp_model() -> tuple[nn.Module, Tensor]:
        torch.manual_seed(0)
        return mlp(4, [1000], 3, "elephant").to(device), torch.randn(n_mlp, 4, device=device)

    def cnn_model() -> tuple[nn.Module, Tensor]:
        torch.manual_seed(0)
        return nature_cnn(4, 18, "elephant", {"a": 0.1}, sigma_bias=2.0).to(device), \
            torch.rand(n_cnn, 4, 84, 84, device=device)

    def ntk_case(build: Callable[[], tuple[nn.Module, Tensor]], fn: Callable[[nn.Module, Tensor], Tensor]) -> Setup:
        def setup() -> Callable[[], Tensor]:
            model, x = build()
            _prime(model, x)
            return lambda: fn(model, x)
        return setup

    def gradcov_case(fn: Callable[[nn.Module, tuple[Tensor, ...]], Tensor]) -> Setup:
        def setup() -> Callable[[], Tensor]:
            model, _ = cnn_model()
            batch = _atari_batch(k, device)
            return lambda: fn(model, batch)
        return setup

    def elephant_case(kind: str) -> Setup:
        def setup() -> Callable[[], tuple[Tensor, ...]]:
            g = torch.Generator().manual_seed(0)
            x = torch.randn(256, 1000, generator=g).to(device).requires_grad_()
            h = torch.ones(1000, device=device, requires_grad=True)
            a = torch.full((1000,), 0.2, device=device, requires_grad=True)
            w = torch.randn(256, 1000, generator=g).to(device)
            f = {
                "fused": lambda: elephant(x, h, a, 4.0),
                "literal": lambda: h / (1 + (x / a).abs().pow(4.0)),
                "relu": lambda: torch.relu(x),
            }[kind]

            def run() -> tuple[Tensor, ...]:
                inputs = (x,) if kind == "relu" else (x, h, a)
                return torch.autograd.grad((f() * w).sum(), inputs)
            return run
        return setup

    ours_gc = lambda m, b: gradient_covariance(m, lambda model, bb: td_loss(model, *bb), b)
    jacrev = "torch.func jacrev (NTK tutorial)"
    return [
        Case(f"ntk full, MLP 4-1000-3 Elephant, N={n_mlp}", ntk_case(mlp_model, lambda m, x: ntk(m, x)),
             ntk_case(mlp_model, tutorial_ntk), jacrev, 15, first_call=True),
        Case(f"ntk full, MLP 4-1000-3 Elephant, N={n_mlp}, loop",
             ntk_case(mlp_model, lambda m, x: ntk(m, x, implementation="loop")), ntk_case(mlp_model, tutorial_ntk),
             jacrev, 1),
        Case(f"ntk full, Nature-DQN CNN, 18 outputs, N={n_cnn}", ntk_case(cnn_model, lambda m, x: ntk(m, x)),
             ntk_case(cnn_model, tutorial_ntk), jacrev, 1, first_call=True),
        Case(f"gradient_covariance, Nature-DQN CNN TD loss, k={k}", gradcov_case(ours_gc),
             gradcov_case(lambda m, b: vmap_grad_covariance(m, td_loss, b)), "torch.func vmap(grad)", 3),
        Case("Elephant fwd+bwd (256, 1000), d=4", elephant_case("fused"), elephant_case("literal"),
             "literal h / (1 + (x/a).abs().pow(d))", 50),
        Case("Elephant fwd+bwd (256, 1000), d=4", elephant_case("fused"), elephant_case("relu"), "eager torch.relu",
             50),
    ]


# ----------------------------------------------------------------------------------------------- registry patterns
def _registry() -> ModuleType:
    """``tests/ntk_patterns.py``, from the checkout this package is in or from the working directory."""
    for root in (Path(__file__).resolve().parent.parent, Path.cwd()):
        if (root / "tests" / "ntk_patterns.py").is_file():
            sys.path.insert(0, str(root / "tests"))
            import ntk_patterns
            return ntk_patterns
    raise SystemExit("interference.bench --patterns: tests/ntk_patterns.py not found (run it in a checkout of the "
                     "repository)")


def _to(batch: Any, device: torch.device) -> Any:
    """``batch`` (a tensor, or a tuple, list or dict of them) on ``device``."""
    if isinstance(batch, Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    return type(batch)(_to(v, device) for v in batch)


def _best_of(run: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Minimum seconds of ``run()`` over ``repeats`` after one warm-up call."""
    run()
    _sync(device)
    return min(_timed(run, device) for _ in range(repeats))


def _error_line(err: Exception) -> str:
    """The error's type and the first line of its message, cut to 90 characters."""
    text = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
    return text if len(text) <= 90 else text[:87] + "..."


def run_patterns(registry: ModuleType, device: torch.device, keep: Callable[[str], bool]) -> None:
    """``ntk`` auto against ``implementation="func"`` on every pattern of ``registry`` at N=32: same model, same
    inputs."""
    header = f"{'pattern':46s} {'auto':>12s} {'func':>12s} {'func/auto':>10s}  note"
    print(f"registry patterns at N={PATTERN_N} (ntk, output full; minimum of {PATTERN_REPEATS} after a warm-up)")
    print(header)
    print("-" * len(header))
    ratios: dict[str, float] = {}
    func_refuses = auto_refuses = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, p in registry.PATTERNS.items():
            if not keep(name):
                continue
            model = registry.build_model(p).to(device)
            x = _to(registry.make_inputs(p, PATTERN_N, 0), device)
            kw: dict[str, Any] = {"params": list(p.params)} if p.params else {}
            times: dict[str, float | Exception] = {}
            for impl in ("auto", "func"):
                try:
                    times[impl] = _best_of(partial(ntk, model, x, implementation=impl, **kw), PATTERN_REPEATS, device)
                except Exception as err:  # a refusal, or a failure: reported in the row
                    times[impl] = err
            auto, func = times["auto"], times["func"]
            if isinstance(auto, Exception):
                auto_refuses += 1
                row = ("auto refuses", "", "", _error_line(auto))
            elif isinstance(func, Exception):
                func_refuses += 1
                row = (_fmt(auto), "func refuses", "", _error_line(func))
            else:
                ratios[name] = func / auto
                row = (_fmt(auto), _fmt(func), f"{func / auto:.2f}x", "")
            print(f"{name:46s} {row[0]:>12s} {row[1]:>12s} {row[2]:>10s}  {row[3]}".rstrip(), flush=True)
    print(f"\ncompared on {len(ratios)} patterns ({func_refuses} more where func refuses, {auto_refuses} where auto "
          "refuses)")
    if not ratios:
        return
    print(f"geometric mean func/auto: {math.exp(sum(map(math.log, ratios.values())) / len(ratios)):.2f}x")
    slower = sorted((r, name) for name, r in ratios.items() if r < 1)
    print(f"auto slower than func on {len(slower)} of {len(ratios)} patterns" + (", slowest first:" if slower else ""))
    if slower:
        print(textwrap.fill(", ".join(f"{name} ({r:.2f}x)" for r, name in slower), width=118, initial_indent="  ",
                            subsequent_indent="  ", break_on_hyphens=False))


# ----------------------------------------------------------------------------------------------- output
def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if abs(seconds) < 1 else f"{seconds:.2f} s"


def table(rows: list[Case], ratio_name: str, ratio: Callable[[Timing, Timing], float], threads: int,
           device: torch.device) -> list[tuple[Case, Timing, Timing]]:
    """Measure and print each case against its baseline; the measurements."""
    if not rows:
        return []
    header = (f"{'case':52s} {'ours':>10s} {'baseline':>10s} {ratio_name:>9s} {'ours MiB':>9s} {'base MiB':>9s}"
              "  baseline")
    print(header)
    print("-" * len(header))
    done = []
    for case in rows:
        a = measure(case.ours, case.repeats, threads, device)
        b = measure(case.baseline, case.repeats, threads, device)
        r = ratio(a, b)
        print(f"{case.name:52s} {_fmt(a.seconds):>10s} {_fmt(b.seconds):>10s} {r:8.{2 if r < 10 else 1}f}x "
              f"{a.extra_mib:9.0f} {b.extra_mib:9.0f}  {case.baseline_name}", flush=True)
        done.append((case, a, b))
    return done


def _first_calls(done: list[tuple[Case, Timing, Timing]]) -> None:
    """The warm-up call (cold: the plan is made) against the repeated calls' minimum."""
    rows = [(case, a, b) for case, a, b in done if case.first_call]
    if not rows:
        return
    print("\nfirst call overhead (a new model's first call, planning included; torch.func warmed up before it)")
    header = (f"{'case':52s} {'first':>10s} {'repeated':>10s} {'overhead':>10s} {'base first':>11s} "
              f"{'base rep.':>10s}")
    print(header)
    print("-" * len(header))
    for case, a, b in rows:
        print(f"{case.name:52s} {_fmt(a.first):>10s} {_fmt(a.seconds):>10s} {_fmt(a.first - a.seconds):>10s} "
              f"{_fmt(b.first):>11s} {_fmt(b.seconds):>10s}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: stable timings)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--quick", action="store_true", help="smaller N for a fast smoke run")
    parser.add_argument("--only", metavar="SUBSTRING",
                        help="only the cases (with --patterns: the patterns) whose name contains SUBSTRING "
                             "(case-insensitive)")
    parser.add_argument("--patterns", action="store_true",
                        help=f"instead of the cases: ntk auto against implementation='func' on every pattern of "
                             f"tests/ntk_patterns.py at N={PATTERN_N} (needs a checkout of the repository)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    # device_count asks NVML where it can, leaving CUDA uninitialised in this process for the forked children
    if device.type == "cuda" and torch.cuda.device_count() == 0:
        parser.error("--device cuda: no CUDA device")
    registry = _registry() if args.patterns else None
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, device {device}, {args.threads} thread(s)")

    def keep(name: str) -> bool:
        return args.only is None or args.only.lower() in name.lower()

    if registry is not None:
        run_patterns(registry, device, keep)
        return
    done = table([c for c in cases(device, args.quick) if keep(c.name)], "speed-up",
                  lambda a, b: b.seconds / a.seconds, args.threads, device)
    _first_calls(done)


if __name__ == "__main__":
    main()
