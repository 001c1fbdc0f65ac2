"""How many members fit one population on a device: an estimate of a member's memory and the device's budget.

A member holds its replay buffer (observations and next observations as float32, actions int64, rewards and
terminations float32), its parameters four times (online, target, optimiser state, gradient) and its update's
activations: every layer's output per sample, measured by a forward pass of the member's network on one sample
(FTA's expanded bins, Maxout's wide Linear layer), four times (the online forward and backward, the target forward,
slack) per sample of the batch. A population allocates every member's buffer at the largest member's size. The
budget is a share of the device's free memory (:data:`SHARE`): CUDA's free memory, or the machine's available RAM.
With ``--workers N`` on one device, N populations share it. On a CPU a population also stops at :data:`CPU_MEMBERS`:
beyond it the update's activations outgrow the caches and each member trains slower (docs/agents/populations.md).

An Atari member (:mod:`agents.population.atari`) keeps its frame replay in host memory
(:func:`agents.rl.frame_buffer.frame_buffer_bytes`: ~7.5 GB at the paper's 1e6 transitions) and its networks,
optimiser state and activations on the device: on a GPU both budgets bound a population (the host's RAM, not the
GPU's memory, is what limits it at the paper's buffer), on a CPU their sum.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import torch

from agents.errors import ConfigError
from agents.rl.budget import available_memory

__all__ = ["SHARE", "CPU_MEMBERS", "member_bytes", "atari_member_bytes", "population_bytes", "budget", "capacity"]

#: the config keys a population's members differ in (agents.population.MEMBER_KEYS; not imported: a cycle)
_MEMBER_KEYS = ("seed", "learning_rate", "buffer_size", "exploration_initial_eps", "exploration_final_eps",
                "exploration_steps")

#: the share of the device's free memory one population may take
SHARE = 0.8

#: the most members of one population on a CPU
CPU_MEMBERS = 64


def member_bytes(config: Mapping[str, Any], buffer_size: int | None = None) -> int:
    """Bytes of one member of a resolved ``dqn`` config (its buffer at ``buffer_size``, default its own)."""
    if config["derived"].get("cnn"):
        return sum(atari_member_bytes(config, buffer_size))
    params, floats = _network(config)
    d = math.prod(config["derived"]["observation_shape"])
    replay = int(buffer_size or config["buffer_size"]) * (2 * 4 * d + 8 + 4 + 4)
    activations = int(config["batch_size"]) * floats * 4 * 4  # online forward, its backward, target forward, slack
    return replay + 4 * 4 * params + activations


def atari_member_bytes(config: Mapping[str, Any], buffer_size: int | None = None) -> tuple[int, int]:
    """``(host bytes, device bytes)`` of one Atari member: its frame replay (host; its frames on the device with
    ``frames_on: device``) and its networks (online, target, Adam's two moments, gradient) with its update's
    activations (device)."""
    from gymnasium import spaces

    from agents.rl.frame_buffer import frame_buffer_bytes

    params, floats = _network(config)
    args = (int(buffer_size or config["buffer_size"]),
            spaces.Box(0, 255, tuple(config["derived"]["observation_shape"]), "uint8"), spaces.Discrete(2))
    replay = frame_buffer_bytes(*args)
    frames = frame_buffer_bytes(*args, frames_only=True) if config.get("frames_on") == "device" else 0
    activations = int(config["batch_size"]) * floats * 4 * 4
    return replay - frames, 5 * 4 * params + activations + frames


def _network(config: Mapping[str, Any]) -> tuple[int, int]:
    """The member network's parameters and the floats its layers output per sample (every module's output, as a
    forward on one sample measures them: FTA's expanded bins and Maxout's wide Linear included); measured once per
    network (the members' own settings left out of the key)."""
    from .networks import member_q_net

    key = json.dumps({k: v for k, v in config.items() if k not in _MEMBER_KEYS}, sort_keys=True, default=str)
    if key not in _MEASURED:
        cnn = bool(config["derived"].get("cnn"))
        net = member_q_net(config, 0) if cnn else member_q_net(config, 0).q_net
        floats = [0]
        hooks = [m.register_forward_hook(lambda m, i, o: floats.__setitem__(0, floats[0] + o.numel()))
                 for m in net.modules() if not list(m.children())]
        with torch.no_grad():
            net(torch.zeros(1, *config["derived"]["observation_shape"], dtype=torch.uint8) if cnn else
                torch.zeros(1, math.prod(config["derived"]["observation_shape"])))
        for h in hooks:
            h.remove()
        _MEASURED[key] = (sum(p.numel() for p in net.parameters()), floats[0])
    return _MEASURED[key]


_MEASURED: dict[str, tuple[int, int]] = {}


def _networks(configs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One config per distinct network among ``configs`` (an Atari population's sub-populations differ in it)."""
    return list({json.dumps({k: v for k, v in c.items() if k not in _MEMBER_KEYS}, sort_keys=True, default=str): c
                 for c in configs}.values())


def population_bytes(configs: Sequence[Mapping[str, Any]]) -> int:
    """Bytes of a population of these members (every buffer at the largest member's size, every network the
    largest)."""
    largest = max(int(c["buffer_size"]) for c in configs)
    return len(configs) * max(member_bytes(c, largest) for c in _networks(configs))


@lru_cache(maxsize=8)
def budget(device: str) -> int:
    """Bytes one population may take on ``device``: :data:`SHARE` of its free memory (read once per process: a
    grid's plan sizes every population by the same budget)."""
    if torch.device(device).type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"population_size: auto sizes populations by the free memory of {device} here, and "
                              "this machine has no CUDA device: plan on the GPU machine, or give population_size: N")
        free, _ = torch.cuda.mem_get_info(torch.device(device))
    else:
        free = available_memory()
    return int(SHARE * free)


def capacity(configs: Sequence[Mapping[str, Any]], device: str, at_once: int = 1) -> int:
    """The most members like ``configs`` (every buffer at the largest of theirs) one population should hold on
    ``device`` while ``at_once`` populations share the machine: their share of :func:`budget` (at least one), and on
    a CPU at most :data:`CPU_MEMBERS`."""
    largest = max(int(c["buffer_size"]) for c in configs)
    if configs[0]["derived"].get("cnn") and torch.device(device).type == "cuda":  # replay on the host, nets on the GPU
        host, on_device = (max(b) for b in zip(*(atari_member_bytes(c, largest) for c in _networks(configs))))
        return max(1, min(budget("cpu") // at_once // host, budget(device) // at_once // on_device))
    fit = max(1, budget(device) // at_once // max(member_bytes(c, largest) for c in _networks(configs)))
    return min(fit, CPU_MEMBERS) if torch.device(device).type == "cpu" else fit
