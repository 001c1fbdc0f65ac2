"""Would a PPO or SAC population pay on this device? SB3's training against its update stacked over P members.

    python -m agents.rl.bench_pg_members [--algo sac|ppo] [--env ENV] [--act elephant] [--sizes 1,4,16]
                                         [--device cpu] [--steps N] [--updates 30] [--threads 1]

A population engine (:mod:`agents.population`) gains by doing P members' work in one call per layer. For the
``agents.train ALGO`` config of ``--env`` and ``--act`` (the authors' widths and activation arguments) this bench
prints SB3's training rate (env steps/s, one CPU thread) and what stacking P members (``torch.func``: one
``vmap(grad)`` call of the losses, one Adam step on the stacked tensors) does to the parts that stacking can share:

* SAC (default env Swimmer-v4): one update per env step on batches of 256 with [256, 256] networks. SB3's update
  alone (``SAC.train(gradient_steps=1)``), and SAC's update on P members' actors and critics stacked, in
  member-updates/s; their ratio to SB3's training rate is the most a SAC population could gain (it still steps the
  envs and acts).
* PPO (default env HalfCheetah-v4): rollouts of ``n_steps`` env steps, then ``n_epochs`` passes of minibatch updates.
  SB3's env step alone (random actions), its update phase alone (``PPO.train()``), and for P members stacked one
  acting call (a batch of one observation each) and one minibatch update; the estimate per member and env step is
  the env step plus the stacked acting and update shares, against SB3's time per env step: the most a PPO
  population could gain (its own bookkeeping not counted).

The stacked losses have the algorithms' shapes and kernels (squashed Gaussian actor, twin critics and targets for
SAC; Gaussian policy, clipped surrogate and value loss for PPO), not SB3's every detail: bounds, not twins.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, stack_module_state, vmap

from .config import resolve

__all__ = ["sac_rates", "sac_stacked", "ppo_rates", "ppo_stacked", "main"]


def _model(algo: str, env: str, act: str):
    from .run import build_model

    config = resolve(algo, {"env": env, "act": act, "seed": 0, "device": "cpu", "n_timesteps": 10 ** 9,
                            "progress": False})
    return build_model(config), config


def sac_rates(model, learning_starts: int, steps: int) -> tuple[float, float]:
    """SB3's SAC: ``(env steps/s of training, updates/s of its update alone)``, after ``learning_starts`` steps."""
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


def sac_stacked(model, P: int, updates: int, device: str) -> float:
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
        logp = (-0.5 * noise ** 2 - log_std - 0.9189385332046727).sum(-1)
        return torch.tanh(u), logp - torch.log1p(-torch.tanh(u) ** 2 + 1e-6).sum(-1)

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

    draw = _draws(P, device)
    data = (draw(batch, obs_dim), draw(batch, act_dim).tanh(), draw(batch, obs_dim), draw(batch),
            (draw(batch) > 2).float())
    step = vmap(grad(loss))
    adam = _adam(params)

    def update() -> None:
        adam(step(params, target, *data, draw(batch, act_dim), draw(batch, act_dim)))
        with torch.no_grad():  # the critics' Polyak average
            for k, t in target.items():
                t.lerp_(params["critic." + k], 0.005)

    return P * updates / _seconds(update, updates, device)


def _draws(P: int, device: str):
    gen = torch.Generator(device=device).manual_seed(0)
    return lambda *shape: torch.randn(P, *shape, generator=gen, device=device)


def _adam(params: dict[str, Tensor]):
    """An Adam step (lr 3e-4) on stacked parameters from their gradients."""
    m = {k: torch.zeros_like(v) for k, v in params.items()}
    v2 = {k: torch.zeros_like(v) for k, v in params.items()}

    def step(g: Mapping[str, Tensor]) -> None:
        with torch.no_grad():
            for k, p in params.items():
                m[k].lerp_(g[k], 0.1)
                v2[k].mul_(0.999).addcmul_(g[k], g[k], value=0.001)
                p.sub_(3e-4 * m[k] / (v2[k].sqrt() + 1e-8))
    return step


def _seconds(call, n: int, device: str) -> float:
    """Seconds of ``n`` calls of ``call`` after three untimed ones."""
    for _ in range(3):
        call()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        call()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def ppo_rates(model, rollouts: int = 2) -> dict[str, float]:
    """SB3's PPO: env steps/s of training (``rollouts`` rollouts after one untimed), seconds of one env step with
    random actions, and seconds of one minibatch update (``PPO.train()`` over the last rollout, divided)."""
    n = model.n_steps * model.n_envs
    model.learn(n, log_interval=None)
    start = time.perf_counter()
    model.learn(rollouts * n, reset_num_timesteps=False, log_interval=None)
    training = rollouts * n / (time.perf_counter() - start)
    env = model.get_env()
    env.reset()
    start = time.perf_counter()
    for _ in range(n):
        env.step(np.stack([model.action_space.sample() for _ in range(model.n_envs)]))
    env_s = (time.perf_counter() - start) / n
    minibatches = model.n_epochs * -(-n // model.batch_size)
    start = time.perf_counter()
    model.train()
    return {"training": training, "env_s": env_s, "update_s": (time.perf_counter() - start) / minibatches,
            "minibatches_per_step": minibatches / n}


def ppo_stacked(model, P: int, updates: int, device: str) -> tuple[float, float]:
    """Seconds per member of one stacked acting call (one observation each) and of one stacked minibatch update of
    PPO (clipped surrogate and value loss, ``batch_size`` samples) on ``P`` copies of ``model``'s policy."""
    policy = model.policy
    parts = nn.ModuleDict({"mlp": policy.mlp_extractor, "action": policy.action_net, "value": policy.value_net})
    base = copy.deepcopy(parts).to("meta")
    copies = [copy.deepcopy(parts).to(device) for _ in range(P)]
    params = {k: v.detach().clone() for k, v in stack_module_state(copies)[0].items()}
    params["log_std"] = policy.log_std.detach().to(device).expand(P, -1).clone()
    batch, obs_dim = model.batch_size, model.observation_space.shape[0]
    act_dim, clip = model.action_space.shape[0], 0.2

    def forward(p: Mapping[str, Tensor], obs: Tensor) -> tuple[Tensor, Tensor]:
        pi, vf = functional_call(base["mlp"], _sub(p, "mlp."), (obs,))
        return functional_call(base["action"], _sub(p, "action."), (pi,)), \
            functional_call(base["value"], _sub(p, "value."), (vf,))[..., 0]

    def loss(p, obs, actions, old_logp, adv, returns):
        mean, value = forward(p, obs)
        logp = (-0.5 * ((actions - mean) / p["log_std"].exp()) ** 2 - p["log_std"] - 0.9189385332046727).sum(-1)
        ratio = (logp - old_logp).exp()
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        surrogate = torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv).mean()
        return -surrogate + 0.5 * ((returns - value) ** 2).mean()

    draw = _draws(P, device)
    data = (draw(batch, obs_dim), draw(batch, act_dim), draw(batch), draw(batch), draw(batch))
    step, adam = vmap(grad(loss)), _adam(params)
    act = vmap(forward)
    one = draw(1, obs_dim)
    with torch.no_grad():
        acting = _seconds(lambda: act(params, one), updates, device) / updates / P
    return acting, _seconds(lambda: adam(step(params, *data)), updates, device) / updates / P


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.rl.bench_pg_members", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", default="sac", choices=("sac", "ppo"))
    parser.add_argument("--env", default=None, help="default: Swimmer-v4 (SAC), HalfCheetah-v4 (PPO)")
    parser.add_argument("--act", default="elephant")
    parser.add_argument("--sizes", default="1,4,16", help="comma-separated member counts P")
    parser.add_argument("--device", default="cpu", help="where the stacked members run (SB3: one CPU thread)")
    parser.add_argument("--steps", type=int, default=400, help="SAC: timed env steps of SB3's training")
    parser.add_argument("--updates", type=int, default=30, help="timed stacked updates per P")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if not sizes or min(sizes) < 1:
        parser.error(f"--sizes: member counts >= 1, got {args.sizes!r}")
    env = args.env or ("Swimmer-v4" if args.algo == "sac" else "HalfCheetah-v4")
    model, config = _model(args.algo, env, args.act)
    if args.algo == "sac":
        training, alone = sac_rates(model, int(config["learning_starts"]), args.steps)
        print(f"SAC {env} {args.act}: SB3 trains {training:.1f} env steps/s (one update each); its update alone "
              f"{alone:.1f} updates/s (one CPU thread)")
        for P in sizes:
            rate = sac_stacked(model, P, args.updates, args.device)
            print(f"  stacked update, P={P:<5d} on {args.device}: {rate:9.1f} member-updates/s, "
                  f"{rate / training:6.2f}x SB3's training (the most a population of {P} could gain)", flush=True)
    else:
        sb3 = ppo_rates(model)
        per_step, updates = 1 / sb3["training"], sb3["update_s"] * sb3["minibatches_per_step"]
        print(f"PPO {env} {args.act}: SB3 trains {sb3['training']:.0f} env steps/s ({per_step * 1e6:.0f} us a step: "
              f"env {sb3['env_s'] * 1e6:.0f} us, its updates {updates * 1e6:.0f} us, acting and the rest "
              f"{(per_step - sb3['env_s'] - updates) * 1e6:.0f} us)")
        for P in sizes:
            acting, update = ppo_stacked(model, P, args.updates, args.device)
            member = sb3["env_s"] + acting + update * sb3["minibatches_per_step"]
            print(f"  stacked, P={P:<5d} on {args.device}: per member acting {acting * 1e6:7.1f} us, a minibatch "
                  f"update {update * 1e6:8.1f} us (SB3 {sb3['update_s'] * 1e6:.0f}); {member * 1e6:6.0f} us per env "
                  f"step, {per_step / member:5.2f}x SB3 (the most a population of {P} could gain)", flush=True)
    model.get_env().close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
