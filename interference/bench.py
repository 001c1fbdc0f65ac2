"""Benchmarks of the core against the obvious alternatives, measured in the same run.

    python -m interference.bench [--threads 1] [--device cpu] [--quick]

Each case runs in a forked child process, so its peak extra memory (resident set on CPU, allocator peak on
CUDA) is measured from the same starting point. Times are the minimum over repeats after one warm-up call (as
``timeit`` advises: on a shared machine the slower repeats measure the other tenants, not the code).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .activations import elephant
from .gradcov import gradient_covariance
from .nets import mlp, nature_cnn
from .ntk import ntk

Setup = Callable[[], Callable[[], object]]


@dataclass
class Timing:
    seconds: float
    extra_mib: float


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(setup: Setup, repeats: int, threads: int, device: torch.device, conn) -> None:
    torch.set_num_threads(threads)
    run = setup()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    base = _peak_bytes(device)
    start = time.perf_counter()
    run()
    first = time.perf_counter() - start
    extra = _peak_bytes(device) - base
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    conn.send((min(times) if times else first, extra / 2**20))
    conn.close()


def measure(setup: Setup, repeats: int, threads: int, device: torch.device) -> Timing:
    """Minimum seconds of ``setup()()`` over ``repeats`` and its peak extra memory, in a fresh forked process."""
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(setup, repeats, threads, device, child))
    proc.start()
    seconds, mib = parent.recv()
    proc.join()
    return Timing(seconds, mib)


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


def cases(device: torch.device, quick: bool) -> list[tuple[str, Setup, Setup, str, int]]:
    """(name, ours, baseline, baseline name, repeats)."""
    n_mlp, n_cnn, k = (64, 8, 32) if quick else (256, 32, 32)

    def mlp_model() -> tuple[nn.Module, Tensor]:
        torch.manual_seed(0)
        return mlp(4, [1000], 3, "elephant").to(device), torch.randn(n_mlp, 4, device=device)

    def cnn_model() -> tuple[nn.Module, Tensor]:
        torch.manual_seed(0)
        return nature_cnn(4, 18, "elephant", {"a": 0.1}, sigma_bias=2.0).to(device), \
            torch.rand(n_cnn, 4, 84, 84, device=device)

    def ntk_case(build, fn):
        def setup():
            model, x = build()
            return lambda: fn(model, x)
        return setup

    def gradcov_case(fn):
        def setup():
            model, _ = cnn_model()
            batch = _atari_batch(k, device)
            return lambda: fn(model, batch)
        return setup

    def elephant_case(kind: str):
        def setup():
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

            def run():
                inputs = (x,) if kind == "relu" else (x, h, a)
                return torch.autograd.grad((f() * w).sum(), inputs)
            return run
        return setup

    ours_gc = lambda m, b: gradient_covariance(m, lambda model, bb: td_loss(model, *bb), b)
    return [
        (f"ntk full, MLP 4-1000-3 Elephant, N={n_mlp}", ntk_case(mlp_model, lambda m, x: ntk(m, x)),
         ntk_case(mlp_model, tutorial_ntk), "torch.func jacrev (NTK tutorial)", 15),
        (f"ntk full, MLP 4-1000-3 Elephant, N={n_mlp}, loop", ntk_case(mlp_model, lambda m, x: ntk(
            m, x, implementation="loop")), ntk_case(mlp_model, tutorial_ntk), "torch.func jacrev (NTK tutorial)", 1),
        (f"ntk full, Nature-DQN CNN, 18 outputs, N={n_cnn}", ntk_case(cnn_model, lambda m, x: ntk(m, x)),
         ntk_case(cnn_model, tutorial_ntk), "torch.func jacrev (NTK tutorial)", 1),
        (f"gradient_covariance, Nature-DQN CNN TD loss, k={k}", gradcov_case(ours_gc),
         gradcov_case(lambda m, b: vmap_grad_covariance(m, td_loss, b)), "torch.func vmap(grad)", 3),
        ("Elephant fwd+bwd (256, 1000), d=4", elephant_case("fused"), elephant_case("literal"),
         "literal h / (1 + (x/a).abs().pow(d))", 50),
        ("Elephant fwd+bwd (256, 1000), d=4", elephant_case("fused"), elephant_case("relu"),
         "eager torch.relu", 50),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: stable timings)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--quick", action="store_true", help="smaller N for a fast smoke run")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, device {device}, {args.threads} thread(s)")
    header = f"{'case':52s} {'ours':>10s} {'baseline':>10s} {'speed-up':>9s} {'ours MiB':>9s} {'base MiB':>9s}  baseline"
    print(header)
    print("-" * len(header))
    for name, ours, base, base_name, repeats in cases(device, args.quick):
        a = measure(ours, repeats, args.threads, device)
        b = measure(base, repeats, args.threads, device)
        print(f"{name:52s} {_fmt(a.seconds):>10s} {_fmt(b.seconds):>10s} {b.seconds / a.seconds:8.1f}x "
              f"{a.extra_mib:9.0f} {b.extra_mib:9.0f}  {base_name}", flush=True)


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


if __name__ == "__main__":
    main()
