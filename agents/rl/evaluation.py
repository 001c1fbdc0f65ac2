"""Evaluation episodes during training, logged apart from the training returns.

The authors' Atari protocol (Tianshou's test collector on EnvPool): every 100k env steps, 5 episodes with epsilon 0
on an env without episodic life and without reward clipping, i.e. whole games and their real scores. Here: every
``eval_every`` env steps (the first step at or past each multiple), ``eval_episodes`` episodes of
``model.predict(obs, deterministic=True)`` (greedy; Rainbow's noisy layers use their mean weights) on an env built
like the training env except that Atari's life losses do not end episodes and rewards are not clipped. Returns and
lengths go to the run log as the scalar series ``eval_return`` and ``eval_length`` (``episode_return`` stays the
training episodes').

An evaluation is a function of the weights and the step: its env is built afresh, seeded from the run's seed and
the step, and draws no random numbers from the training's generators, so runs with and without evaluation train
identically and a resumed run evaluates as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnv

from probes.sb3 import ProbeCallback

__all__ = ["EvalCallback", "EVAL_SEED_OFFSET", "evaluate_games"]

EVAL_SEED_OFFSET = 1_000_003  # evaluation envs' seeds: seed + offset + step (apart from the training env's)


class EvalCallback(BaseCallback):
    """Run ``episodes`` greedy episodes every ``every`` env steps on ``make_env(seed)``; log them to the run log.

    Must come after ``probe_cb`` in the ``CallbackList`` (it writes through its log).
    """

    def __init__(self, make_env: Callable[[int], VecEnv], every: int, episodes: int, seed: int,
                 probe_cb: ProbeCallback) -> None:
        super().__init__()
        if every < 1 or episodes < 1:
            raise ValueError(f"EvalCallback needs every >= 1 and episodes >= 1, got {every}, {episodes}")
        self.make_env, self.every, self.episodes, self.seed, self.probe_cb = make_env, every, episodes, seed, probe_cb
        self._next: int | None = None
        self.last: tuple[int, float] | None = None  # (step, mean return) of this attempt's last evaluation

    def _on_training_start(self) -> None:
        self._next = (self.num_timesteps // self.every + 1) * self.every  # (a resumed run: the next one due)

    def _on_step(self) -> bool:
        if self.num_timesteps >= self._next:
            self.evaluate(self.num_timesteps)
            self._next = (self.num_timesteps // self.every + 1) * self.every
        return True

    def evaluate(self, step: int) -> list[tuple[float, int]]:
        """Run the episodes now; ``[(return, length)]``, also written to the run log at ``step``."""
        env = self.make_env(self.seed + EVAL_SEED_OFFSET + step)
        normalize = self.model._vec_normalize_env  # the network sees normalised observations
        episodes: list[tuple[float, int]] = []
        try:
            obs = env.reset()
            while len(episodes) < self.episodes:
                seen = obs if normalize is None else normalize.normalize_obs(obs)
                action, _ = self.model.predict(seen, deterministic=True)
                obs, _, dones, infos = env.step(action)
                for done, info in zip(dones, infos):
                    if done and "episode" in info:  # the Monitor's whole-game return (unclipped)
                        episodes.append((float(info["episode"]["r"]), int(info["episode"]["l"])))
        finally:
            env.close()
        for ret, length in episodes[: self.episodes]:
            self.probe_cb.runner.scalar("eval_return", step, ret)
            self.probe_cb.runner.scalar("eval_length", step, length)
        self.last = (step, float(np.mean([r for r, _ in episodes[: self.episodes]])))
        return episodes[: self.episodes]


def evaluate_games(config: Mapping[str, Any], seeds: Sequence[int], episodes: int,
                   greedy: Callable[[np.ndarray], np.ndarray]) -> list[list[tuple[float, int]]]:
    """The first ``episodes`` whole games (raw score, agent steps) of each of P Atari agents on test games of
    ``config``'s Atari id (no episodic life, no reward clipping: the authors' test protocol), agent ``m``'s seeded
    ``seeds[m]``, acting ``greedy(obs)`` (``(P, 4, 84, 84)`` uint8 -> ``(P,)``): a population's evaluation."""
    from .ale_vector import AtariGames, game_name  # (ale-py only where Atari is played)

    env = AtariGames(game_name(config["env"]), list(seeds), train=False,
                     max_episode_steps=config.get("max_episode_steps") or 108_000)
    done: list[list[tuple[float, int]]] = [[] for _ in seeds]
    try:
        obs = env.observation()
        while any(len(d) < episodes for d in done):
            s = env.step(greedy(obs))
            for m in np.flatnonzero(s.game_over):
                if len(done[m]) < episodes:
                    done[m].append((float(s.returns[m]), int(s.lengths[m])))
            obs = s.obs
    finally:
        env.close()
    return done
