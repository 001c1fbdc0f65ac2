"""Would a SAC population pay on this device? SB3's SAC against its update stacked over P members, in one process.

    python -m agents.rl.bench_sac_members [--env Swimmer-v4] [--act elephant] [--sizes 1,4,16] [--device cpu]
                                          [--steps 400] [--updates 30] [--threads 1]

A population engine (:mod:`agents.population`) gains by doing P members' work in one call per layer; SAC does one
update per env step on batches of 256 with [256, 256] networks, so its update is large already. This bench prints,
for the ``agents.train sac`` config of ``--env`` and ``--act`` (the authors' widths and activation arguments):

* SB3's SAC training, env steps/s (``--steps`` timed after ``learning_starts``; one update per step);
* SB3's update alone (``SAC.train(gradient_steps=1)``), updates/s;
* SAC's update on P members' actors and critics stacked (``torch.func``: one ``vmap(grad)`` call of the critics' and
  the actor's losses, one Adam step on the stacked tensors), member-updates/s, for each P in ``--sizes``.

The last over the first is the most a SAC population of P members could gain over P SB3 runs on this device: it
still steps the envs and acts, which is not counted. The stacked loss has SAC's shapes and kernels (squashed Gaussian
actor, twin critics, their targets, the temperature's term), not SB3's every detail: it is a bound, not a twin.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Mapping

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, stack_module_state, vmap

from .config import resolve

__all__ = ["sb3_rates", "stacked_rate", "main"]


def _model(env: str, act: str, device: str):
    from .run import build_model

    config = resolve("sac", {"env": env, "act": act, "seed": 0, "device": device,
                             "n_timesteps": 10 ** 9, "progress": False})
    return build_model(config), config


def sb3_rates(model, learning_starts: int, steps: int) -> tuple[float, float]:
    """``(env steps/s of SB3's SAC training, updates/s of its update alone)``, after ``learning_starts`` steps."""
    model.learn(learning_starts + 20, log_interval=None)
    start = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False, log_interval=None)
    training = steps / (time.perf_counter() - start)
    n = max(steps // 2, 10)
    start = time.perf_counter()
    for _ in range(n):
        model.train(gradient_steps=1, batch_size=model.batch_size)
    return training, n / (time.perf_counter() - start)


def _sub(params: Mapping[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def stacked_rate(model, P: int, updates: int, device: str) -> float:
    """Member-updates/s of SAC's update on ``P`` copies of ``model``'s actor and critics stacked (module docstring)."""
    actor, critic = model.actor, model.critic
    nets = nn.ModuleDict({"actor": actor, "critic": critic, "target": model.critic_target})
    base = copy.deepcopy(nets).to("meta")
    params, buffers = stack_module_state([copy.deepcopy(nets).to(device) for _ in range(P)])
    params = {k: v.detach().clone() for k, v in params.items() if not k.startswith("target.")}
    target = {k: v.detach() for k, v in stack_module_state([copy.deepcopy(model.critic_target).to(device)
                                                            for _ in range(P)])[0].items()}
    batch, obs_dim = model.batch_size, model.observation_space.shape[0]
    act_dim, gamma = model.action_space.shape[0], float(model.gamma)
    n_q = len(critic.q_networks)

    def pi(p: Mapping[str, Tensor], obs: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        a = base["actor"]
        h = functional_call(a.latent_pi, _sub(p, "actor.latent_pi."), (obs,))
        mu = functional_call(a.mu, _sub(p, "actor.mu."), (h,))
        log_std = functional_call(a.log_std, _sub(p, "actor.log_std."), (h,)).clamp(-20, 2)
        u = mu + log_std.exp() * noise
        logp = (-0.5 * noise ** 2 - log_std - 0.9189385332046727).sum(-1) - torch.log1p(-torch.tanh(u) ** 2 + 1e-6).sum(-1)
        return torch.tanh(u), logp

    def qs(p: Mapping[str, Tensor], prefix: str, obs: Tensor, action: Tensor) -> Tensor:
        x = torch.cat([obs, action], -1)
        return torch.stack([functional_call(base["critic"].q_networks[i], _sub(p, f"{prefix}qf{i}."), (x,))[..., 0]
                            for i in range(n_q)])

    def loss(p, t, obs, action, nxt, reward, done, noise_next, noise_now):
        with torch.no_grad():
            a2, logp2 = pi(p, nxt, noise_next)
            y = reward + (1 - done) * gamma * (qs(t, "", nxt, a2).min(0).values - 0.2 * logp2)
        critic_loss = 0.5 * ((qs(p, "critic.", obs, action) - y) ** 2).mean(-1).sum()
        a1, logp1 = pi(p, obs, noise_now)
        frozen = {k: v.detach() for k, v in p.items() if k.startswith("critic.")}
        actor_loss = (0.2 * logp1 - qs(frozen, "critic.", obs, a1).min(0).values).mean()
        return critic_loss + actor_loss

    gen = torch.Generator(device=device).manual_seed(0)

    def draw(*shape: int) -> Tensor:
        return torch.randn(P, *shape, generator=gen, device=device)

    data = (draw(batch, obs_dim), draw(batch, act_dim).tanh(), draw(batch, obs_dim), draw(batch),
            (draw(batch) > 2).float())
    step = vmap(grad(loss))
    m = {k: torch.zeros_like(v) for k, v in params.items()}
    v2 = {k: torch.zeros_like(v) for k, v in params.items()}

    def update() -> None:
        g = step(params, target, *data, draw(batch, act_dim), draw(batch, act_dim))
        with torch.no_grad():  # Adam, and the critics' Polyak average
            for k, p in params.items():
                m[k].lerp_(g[k], 0.1)
                v2[k].mul_(0.999).addcmul_(g[k], g[k], value=0.001)
                p.sub_(3e-4 * m[k] / (v2[k].sqrt() + 1e-8))
            for k, t in target.items():
                t.lerp_(params["critic." + k], 0.005)

    for _ in range(3):
        update()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(updates):
        update()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return P * updates / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.rl.bench_sac_members", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="Swimmer-v4")
    parser.add_argument("--act", default="elephant")
    parser.add_argument("--sizes", default="1,4,16", help="comma-separated member counts P")
    parser.add_argument("--device", default="cpu", help="where the stacked update runs (SB3's SAC: one CPU thread)")
    parser.add_argument("--steps", type=int, default=400, help="timed env steps of SB3's SAC")
    parser.add_argument("--updates", type=int, default=30, help="timed stacked updates per P")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if not sizes or min(sizes) < 1:
        parser.error(f"--sizes: member counts >= 1, got {args.sizes!r}")
    model, config = _model(args.env, args.act, "cpu")
    training, alone = sb3_rates(model, int(config["learning_starts"]), args.steps)
    print(f"SAC {args.env} {args.act}: SB3 trains {training:.1f} env steps/s (one update each); its update alone "
          f"{alone:.1f} updates/s (one CPU thread)")
    for P in sizes:
        rate = stacked_rate(model, P, args.updates, args.device)
        print(f"  stacked update, P={P:<5d} on {args.device}: {rate:9.1f} member-updates/s, "
              f"{rate / training:6.2f}x SB3's training (the most a population of {P} could gain)", flush=True)
    model.get_env().close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
