"""The Rainbow members of an Atari population (:class:`agents.population.atari.AtariPopulation` with a ``rainbow``
config): each member's own policy (online and target networks, Adam), prioritized frame replay and noise, stepped as
``agents.rl.rainbow.Rainbow`` steps a single run, with Rainbow's own methods for the targets and losses
(:class:`RainbowView`), the noise drawn from the member's torch stream and the replay from its numpy stream. ``pop``:
the :class:`~agents.population.atari.AtariPopulation` (not imported here: it imports this module)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, stack_module_state, vmap
from torch.nn import functional as F

from interference.noisy import factorised_noise

__all__ = ["update", "set_noise", "RainbowView", "Stacked"]


def set_noise(pop: Any, m: int, which: str, resample: bool = False, on: bool | None = None) -> None:
    """Switch member ``m``'s ``online`` or ``target`` noisy layers on (default: as ``noisy`` says) or off, and
    with ``resample`` redraw their noise from the member's torch stream (``Rainbow._noise``)."""
    from interference.noisy import noisy_layers

    on = bool(pop.config.get("noisy")) if on is None else on
    if pop.implementation == "vmap":
        pop.stacked.noise[which] = on
        if resample and on:
            pop.stacked.resample(m, which, pop.noise[m])
        return
    for layer in noisy_layers(pop.nets[m] if which == "online" else pop.targets[m]):
        layer.noise = on
        if resample and on:
            layer.resample(pop.noise[m])


def update(pop: Any) -> Tensor:
    """Rainbow.train's step, member by member: a prioritized (or uniform) sample drawn from the member's numpy
    stream, the online and target noise redrawn from its torch stream, the loss of ``Rainbow.batch`` and
    ``Rainbow._losses`` weighted by importance, Adam, the priorities updated (stacked: :func:`_stacked_update`)."""
    if pop.implementation == "vmap":
        return _stacked_update(pop)
    k, t = int(pop.config["batch_size"]), pop.num_timesteps
    beta0, steps = float(pop.config["per_beta0"]), int(pop.config["per_beta_steps"])
    beta = min(1.0, beta0 + (1.0 - beta0) * t / max(1, steps))
    losses = []
    for m, (net, target, opt, buf) in enumerate(zip(pop.nets, pop.targets, pop.optimizers, pop.replay)):
        rng = pop.draws.states[m]
        if pop.config.get("prioritized"):
            data, slots, w = buf.sample_prioritized(k, beta, rng=rng)
            weights = torch.as_tensor(w, device=pop.device)
        else:
            data, weights = buf._get_samples(buf.rows(rng.randint(0, buf.size(), size=k))), None
        set_noise(pop, m, "online", resample=True)
        set_noise(pop, m, "target", resample=True)
        view = RainbowView(pop.config, net, target, buf, pop.members[m].seed, pop.device)
        net.set_training_mode(True)
        per_sample, priority = view._losses(net, view.batch(data, net, target))
        loss = (per_sample * weights).mean() if weights is not None else per_sample.mean()
        losses.append(loss.detach())
        if pop.diverged[m] or not np.isfinite(loss.item()):  # (PaperDQN._step: nothing applied, the run stops)
            continue
        opt.zero_grad()
        loss.backward()
        if pop.config.get("max_grad_norm") is not None:
            torch.nn.utils.clip_grad_norm_(net.parameters(), pop.config["max_grad_norm"])
        opt.step()
        if pop.config.get("prioritized"):
            buf.update_priorities(slots, priority.cpu().numpy())
    pop.last_losses = torch.stack(losses)
    pop._finite(pop.last_losses)
    pop.adam_steps += 1
    return pop.last_losses


class RainbowView:
    """What Rainbow's own methods (``batch``, ``losses``, ``_losses``; :func:`agents.rl.rainbow.rainbow_context`)
    read of a run, for one member: its settings, networks and replay."""

    def __init__(self, config: Mapping[str, Any], q_net: nn.Module, q_net_target: nn.Module, replay: Any, seed: int,
                 device: torch.device) -> None:
        from agents.rl.rainbow import Rainbow

        self.gamma, self.td_loss, self.seed, self.device = float(config["gamma"]), config["td_loss"], seed, device
        self.double_q, self.distributional = bool(config["double_q"]), bool(config["distributional"])
        self.noisy, self.probe_noise = bool(config["noisy"]), config["probe_noise"]
        self.q_net, self.q_net_target, self.replay_buffer, self._vec_normalize_env = q_net, q_net_target, replay, None
        self._methods = Rainbow

    def batch(self, *args: Any) -> Any:
        return self._methods.batch(self, *args)

    def losses(self, *args: Any) -> Tensor:
        return self._methods.losses(self, *args)

    def _losses(self, *args: Any) -> tuple[Tensor, Tensor]:
        return self._methods._losses(self, *args)


class _Heads(nn.Module):
    """A RainbowQNetwork on float observations (SB3's preprocessing casts to float32; a float64 twin keeps float64):
    ``kind`` "log_probs" ``(B, actions, atoms)`` or "q" ``(B, actions)``; parameter names ``q.`` + the network's."""

    def __init__(self, q: nn.Module) -> None:
        super().__init__()
        self.q = q

    def forward(self, x: Tensor, kind: str) -> Tensor:
        logits = self.q.head_logits(self.q.features_extractor(x))
        return F.log_softmax(logits, dim=-1) if kind == "log_probs" else self.q.q_of(logits)


class Stacked:
    """The members' Rainbow networks stacked on a member axis (``implementation="vmap"``): one ``torch.func`` call
    per step and per update for every member (noise per member in stacked buffers, redrawn from each member's own
    generator in :class:`~interference.noisy.NoisyLinear`'s order), the targets and losses of ``Rainbow.batch`` and
    ``Rainbow._losses`` on the stacked tensors (C51's projection over members x samples), one Adam step."""

    def __init__(self, policies: Sequence[Any], device: torch.device) -> None:
        from interference.noisy import NoisyLinear

        q = policies[0].q_net
        self.base = _Heads(copy.deepcopy(q))  # (its tensors are replaced in every call)
        self.noisy = [(f"q.{name}", mod.in_features, mod.out_features) for name, mod in q.named_modules()
                      if isinstance(mod, NoisyLinear)]
        self.layers = [mod for mod in self.base.modules() if isinstance(mod, NoisyLinear)]
        params, self.buffers = stack_module_state([_Heads(p.q_net) for p in policies])
        self.params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        _, target_buffers = stack_module_state([_Heads(p.q_net_target) for p in policies])
        self.target = {k: v.detach().clone() for k, v in self.params.items()}
        self.target_buffers = {k: v.detach().clone() for k, v in target_buffers.items()}
        self.exp_avg = {k: torch.zeros_like(v) for k, v in self.params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(v) for k, v in self.params.items()}
        self.noise = {"online": True, "target": True}
        self.device = device

    def resample(self, m: int, which: str, generator: torch.Generator) -> None:
        """New noise for member ``m``'s ``online`` or ``target`` layers, in the network's layer order."""
        buffers = self.buffers if which == "online" else self.target_buffers
        with torch.no_grad():
            for name, fan_in, fan_out in self.noisy:
                eps_in, eps_out = factorised_noise(fan_in, fan_out, generator, self.device)
                buffers[f"{name}.eps_in"][m] = eps_in
                buffers[f"{name}.eps_out"][m] = eps_out

    def __call__(self, obs: Tensor, kind: str, which: str = "online") -> Tensor:
        """Every member's ``kind`` (``log_probs``, ``q``) of ``obs`` ``(P, B, 4, 84, 84)`` on its ``online`` or
        ``target`` network, with that network's noise switch."""
        for layer in self.layers:
            layer.noise = self.noise[which]
        params, buffers = (self.params, self.buffers) if which == "online" else (self.target, self.target_buffers)
        x = obs.to(next(iter(self.params.values())).dtype)
        return vmap(lambda p, b, xm: functional_call(self.base, (p, b), (xm,), {"kind": kind}))(params, buffers, x)

    def copy_target(self) -> None:
        """SB3's target copy: the parameters (the target's noise stays its own)."""
        self.target = {k: v.detach().clone() for k, v in self.params.items()}

    def member_state(self, m: int, which: str = "online") -> dict[str, Tensor]:
        """Member ``m``'s ``state_dict`` as its RainbowQNetwork names it."""
        params, buffers = (self.params, self.buffers) if which == "online" else (self.target, self.target_buffers)
        return {k.removeprefix("q."): v[m].detach() for k, v in (*params.items(), *buffers.items())}


def _stacked_update(pop: Any) -> Tensor:
    """:func:`update` on the stacked networks: the members' samples drawn and noise redrawn member by member (their
    own streams), the samples copied to the device together, then one batched target, loss and Adam step."""
    from agents.rl.frame_buffer import stacked_samples
    from agents.rl.rainbow import project

    from .atari import _adam

    st, config, k = pop.stacked, pop.config, int(pop.config["batch_size"])
    beta0, steps = float(config["per_beta0"]), int(config["per_beta_steps"])
    beta = min(1.0, beta0 + (1.0 - beta0) * pop.num_timesteps / max(1, steps))
    parts, slots, weights = [], [], []
    for m, buf in enumerate(pop.replay):
        rng = pop.draws.states[m]
        if config.get("prioritized"):
            s, w = buf.draw(k, beta, rng=rng)
            slots.append(s)
            weights.append(w)
        else:
            s = buf.rows(rng.randint(0, buf.size(), size=k))
        parts.append(buf.sample_arrays(s))
        st.resample(m, "online", pop.noise[m])
        st.resample(m, "target", pop.noise[m])
    st.noise = {"online": bool(config.get("noisy")), "target": bool(config.get("noisy"))}
    dtype = next(iter(st.params.values())).dtype
    obs, act, nxt, rewards, dones, disc = stacked_samples(pop.replay, parts, pop.device, float(config["gamma"]))
    rewards, dones = rewards.to(dtype), dones.to(dtype)
    disc = disc.to(dtype) if parts[0][5] is not None else torch.full_like(rewards, float(config["gamma"]))
    disc = disc * (1 - dones)
    with torch.no_grad():
        next_actions = st(nxt, "q", "online" if config.get("double_q") else "target").argmax(-1)
        if config.get("distributional"):
            next_lp = st(nxt, "log_probs", "target")
            probs = next_lp.gather(2, next_actions[..., None, None].expand(-1, -1, 1, next_lp.shape[-1]))[:, :, 0].exp()
            support = st.buffers["q.support"][0]
            targets = project(probs.flatten(0, 1), rewards.flatten(), disc.flatten(), support).view(probs.shape)
        else:
            targets = rewards + disc * st(nxt, "q", "target").gather(2, next_actions[..., None])[..., 0]
    if config.get("distributional"):
        lp = st(obs, "log_probs")
        per_sample = -(targets * lp.gather(2, act[..., None, None].expand(-1, -1, 1, lp.shape[-1]))[:, :, 0]).sum(-1)
        priority = per_sample.detach()
    else:
        delta = st(obs, "q").gather(2, act[..., None])[..., 0] - targets
        per_sample = delta ** 2 if config["td_loss"] == "mse" else \
            F.smooth_l1_loss(delta, torch.zeros_like(delta), reduction="none")
        priority = delta.detach().abs()
    losses = (per_sample * torch.as_tensor(np.stack(weights), device=pop.device)).mean(-1) if weights else \
        per_sample.mean(-1)
    grads = torch.autograd.grad(losses.sum(), list(st.params.values()))
    finite = pop._finite(losses.detach())
    if not bool(finite.all()):
        grads = [torch.where(finite.view(-1, *([1] * (g.dim() - 1))), g, torch.zeros_like(g)) for g in grads]
    pop.adam_steps += 1
    opt = dict(config.get("optimizer_kwargs") or {})
    with torch.no_grad():
        _adam(list(st.params.values()), grads, list(st.exp_avg.values()), list(st.exp_avg_sq.values()),
              pop.adam_steps, pop.lr, tuple(opt.get("betas", (0.9, 0.999))), float(opt.get("eps", 1e-8)))
    for m, buf in enumerate(pop.replay if config.get("prioritized") else []):
        if bool(finite[m]) and not pop.diverged[m]:
            buf.update_priorities(slots[m], priority[m].cpu().numpy())
    pop.last_losses = losses.detach()
    return pop.last_losses
