"""Atari members of different activations in one process: one sub-population per network, one vector env for all.

A population's members share a network shape, so that one call runs them all (:mod:`agents.population.atari`).
Runs of one game that differ in their activation (:data:`NETWORK_KEYS`: the paper's six, with their arguments and
the widths matched to them) still share everything else: the game, the loop's schedule, the device. ``AtariGroups``
trains them together: a sub-population (:class:`~agents.population.atari.AtariPopulation`) per network, each with
its members' networks, optimisers, replays and randomness, and all members' games in one
:class:`~agents.rl.ale_vector.AtariGames` (its C++ threads stepping every game at once). Member ``m``'s game is env
``m`` seeded with its seed, as in a population of one activation, so **a member is the same run in either**: the
same draws, games and updates (tests/test_population_atari_groups.py checks weights and games bit for bit against
the sub-populations trained alone).

It has the interface of an ``AtariPopulation`` that :mod:`agents.population.run` drives (members in the order given,
whatever their sub-population).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from agents.rl.evaluation import evaluate_games

from . import MEMBER_KEYS
from .atari import AtariPopulation, training_games
from .engine import Member

__all__ = ["AtariGroups", "NETWORK_KEYS", "network_key", "shared_key"]

#: what the sub-populations of :class:`AtariGroups` may differ in (dqn and rainbow config keys): the network
NETWORK_KEYS = ("act", "act_kwargs", "layer_norm", "sigma_bias", "net_arch", "match_width", "act_layers")


def network_key(config: Mapping[str, Any]) -> str:
    """What makes a member's network: members with equal keys share a sub-population."""
    return json.dumps({k: config.get(k) for k in NETWORK_KEYS}, sort_keys=True, default=str)


def shared_key(config: Mapping[str, Any]) -> str:
    """What all members of an ``AtariGroups`` share: the config but its members' and networks' keys."""
    return json.dumps({k: v for k, v in config.items() if k not in (*MEMBER_KEYS, *NETWORK_KEYS, "derived")},
                      sort_keys=True, default=str)


class AtariGroups:
    """The runs of ``configs`` (resolved ``dqn`` or ``rainbow`` configs of one Atari game on ``ale-vector``, equal
    but in :data:`agents.population.MEMBER_KEYS` and :data:`NETWORK_KEYS`) with ``members`` (their member fields, in
    the same order): one :class:`AtariPopulation` per network (``implementation``, ``device`` as there), all games in
    one vector env (``num_threads``: its C++ threads)."""

    def __init__(self, configs: Sequence[Mapping[str, Any]], members: Sequence[Member], *, device: str = "cpu",
                 implementation: str = "auto", num_threads: int = 0) -> None:
        if len(configs) != len(members) or not members:
            raise ValueError("AtariGroups: one config per member, at least one member")
        if len({shared_key(c) for c in configs}) > 1:
            raise ValueError(f"population members may differ in {', '.join(MEMBER_KEYS)} and their network "
                             f"({', '.join(NETWORK_KEYS)}) only")
        config = configs[0]
        self.config, self.members, self.P = dict(config), list(members), len(members)
        self.env = training_games(config, [m.seed for m in members], num_threads)
        keys: dict[str, list[int]] = {}
        for i, c in enumerate(configs):
            keys.setdefault(network_key(c), []).append(i)
        self.index = [np.array(idx) for idx in keys.values()]  # each sub-population's members, in member order
        self.groups = [AtariPopulation(configs[idx[0]], [members[i] for i in idx], device=device,
                                       implementation=implementation, games=self.env) for idx in self.index]
        self.where = [(0, 0)] * self.P  # member m: (sub-population, its index there)
        for g, idx in enumerate(self.index):
            for j, i in enumerate(idx):
                self.where[i] = (g, j)
        self._set_obs(self.env.reset())
        self.device, self.implementation = self.groups[0].device, self.groups[0].implementation
        self.rainbow, self.base = self.groups[0].rainbow, self.groups[0].base
        self.num_timesteps = 0
        self.episodes = [self.groups[g].episodes[j] for g, j in self.where]  # (the sub-populations' own lists)
        self.replay = [self.groups[g].replay[j] for g, j in self.where]
        self.env_seconds = 0.0

    def _set_obs(self, obs: np.ndarray) -> None:
        for g, idx in zip(self.groups, self.index):
            g.obs = obs[idx]

    def _gather(self, parts: Sequence[Any]) -> list[Any]:
        """Per-member values in member order from each sub-population's ``parts[g]`` (its members' in its order)."""
        return [parts[g][j] for g, j in self.where]

    @property
    def diverged_at(self) -> np.ndarray:
        return np.array(self._gather([g.diverged_at for g in self.groups]), dtype=np.int64)

    @property
    def last_losses(self) -> Tensor | None:
        if any(g.last_losses is None for g in self.groups):
            return None
        return torch.stack(self._gather([g.last_losses for g in self.groups]))

    @property
    def seconds(self) -> dict[str, float]:
        total = {k: sum(g.seconds[k] for g in self.groups) for k in self.groups[0].seconds}
        total["env"] = self.env_seconds
        return total

    # --- the loop ---------------------------------------------------------------------------------------

    def step(self, before_store: Callable[[], None] | None = None) -> None:
        """One env step of every member (each sub-population acts, all games step at once, each stores and updates
        as its own population would); ``before_store`` where SB3 calls a callback's ``on_step``."""
        actions = np.zeros(self.P, dtype=np.int64)
        for g, idx in zip(self.groups, self.index):
            actions[idx] = g.act()
        start = time.perf_counter()
        obs, rewards, dones, infos = self.env.step(actions)
        self.env_seconds += time.perf_counter() - start
        self.num_timesteps += 1
        for g in self.groups:
            g.num_timesteps += 1
        if before_store is not None:
            before_store()
        for g, idx in zip(self.groups, self.index):
            g.observe(actions[idx], obs[idx], rewards[idx], dones[idx], [infos[i] for i in idx])

    def learn(self, steps: int, on_step: Callable[[AtariGroups], None] | None = None) -> None:
        for _ in range(steps):
            self.step()
            if on_step is not None:
                on_step(self)

    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Each member's greedy action ``(P,)`` for its observation ``obs`` ``(P, 4, 84, 84)``."""
        out = np.zeros(self.P, dtype=np.int64)
        for g, idx in zip(self.groups, self.index):
            out[idx] = g.greedy(obs[idx])
        return out

    def evaluate(self, seeds: Sequence[int], episodes: int) -> list[list[tuple[float, int]]]:
        """As :meth:`AtariPopulation.evaluate`: each member's greedy whole games on a test env seeded ``seeds[m]``."""
        for g in self.groups:
            g.evaluation_mode()
        return evaluate_games(self.config, seeds, episodes, self.greedy)

    # --- members as single runs ---------------------------------------------------------------------------

    def member_state(self, m: int) -> dict[str, Tensor]:
        g, j = self.where[m]
        return self.groups[g].member_state(j)

    def member_probe_context(self, m: int, model: nn.Module, rng: np.random.Generator) -> dict[str, Any]:
        g, j = self.where[m]
        return self.groups[g].member_probe_context(j, model, rng)

    def stored_observations(self, m: int, n: int, rng: np.random.Generator) -> Tensor | None:
        g, j = self.where[m]
        return self.groups[g].stored_observations(j, n, rng)
