"""The Rainbow members of an Atari population (:class:`agents.population.atari.AtariPopulation` with a ``rainbow``
config): each member's own policy (online and target networks, Adam), prioritized frame replay and noise, stepped as
``agents.rl.rainbow.Rainbow`` steps a single run, with Rainbow's own methods for the targets and losses
(:class:`RainbowView`), the noise drawn from the member's torch stream and the replay from its numpy stream. ``pop``:
the :class:`~agents.population.atari.AtariPopulation` (not imported here: it imports this module)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["update", "set_noise", "RainbowView"]


def set_noise(pop: Any, m: int, which: str, resample: bool = False, on: bool | None = None) -> None:
    """Switch member ``m``'s ``online`` or ``target`` noisy layers on (default: as ``noisy`` says) or off, and
    with ``resample`` redraw their noise from the member's torch stream (``Rainbow._noise``)."""
    from interference.noisy import noisy_layers

    on = bool(pop.config.get("noisy")) if on is None else on
    for layer in noisy_layers(pop.nets[m] if which == "online" else pop.targets[m]):
        layer.noise = on
        if resample and on:
            layer.resample(pop.noise[m])


def update(pop: Any) -> Tensor:
    """Rainbow.train's step, member by member: a prioritized (or uniform) sample drawn from the member's numpy
    stream, the online and target noise redrawn from its torch stream, the loss of ``Rainbow.batch`` and
    ``Rainbow._losses`` weighted by importance, Adam, the priorities updated."""
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
