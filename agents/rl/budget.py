"""What a run will cost before it starts: replay memory, peak memory and wall time on this machine.

A run prints its plan at the start (env steps, updates, the estimated duration, the peak memory with the replay
buffer) and refuses a replay buffer that does not fit in the memory available now, before allocating it. The
duration comes from a calibration of about a second: env steps with random actions on a throwaway copy of the env,
and forward/backward passes of the model's networks on a batch of random observations (no optimiser step; the
gradients are cleared), so it counts acting, env stepping and updates but not probes, evaluations or checkpoints.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.preprocessing import (get_action_dim, is_image_space, is_image_space_channels_first,
                                                    preprocess_obs)
from stable_baselines3.common.vec_env import VecEnv, VecTransposeImage

from agents.commands import ConfigError

from .frame_buffer import frame_buffer_bytes

__all__ = ["replay_bytes", "available_memory", "rss", "check_memory", "estimate_seconds", "fmt_bytes", "CALIBRATE_ABOVE"]

#: runs longer than this (env steps) calibrate their duration estimate at the start
CALIBRATE_ABOVE = 20_000


def fmt_bytes(n: float) -> str:
    """``7.46 GB`` (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return ""


def replay_bytes(config: Mapping[str, Any], obs: spaces.Space, act: spaces.Space) -> int:
    """Bytes of the replay buffer a resolved off-policy config allocates (0 for on-policy configs): the frame buffer's
    (:func:`agents.rl.frame_buffer.frame_buffer_bytes`) or SB3's (whole observations and next observations, actions,
    rewards, dones, timeouts), plus the sum tree of prioritized replay."""
    if "buffer_size" not in config:
        return 0
    if is_image_space(obs, check_channels=False) and not is_image_space_channels_first(obs):
        obs = VecTransposeImage.transpose_space(obs)  # as the model stores it
    n_envs = config.get("n_envs", 1)
    rows = max(config["buffer_size"] // n_envs, 1)
    if config.get("replay") == "frames":
        size = frame_buffer_bytes(config["buffer_size"], obs, act, n_envs)
    else:
        obs_bytes = int(np.prod(obs.shape)) * np.dtype(obs.dtype).itemsize
        size = rows * n_envs * (2 * obs_bytes + 4 * get_action_dim(act) + 12)
    if config.get("prioritized"):
        size += 2 * 2 * (1 << max(0, (rows - 1).bit_length())) * 8  # sums and minima
    return size


def available_memory() -> int:
    """Bytes of memory available now (``MemAvailable``; total physical memory where /proc is missing)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def rss() -> int:
    """This process's resident memory in bytes."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def check_memory(config: Mapping[str, Any], env: VecEnv) -> tuple[int, int]:
    """``(replay bytes, peak bytes)`` of a new run of ``config`` on ``env``; ConfigError if they do not fit in the
    memory available now (with what to change)."""
    replay = replay_bytes(config, env.observation_space, env.action_space)
    peak = rss() + replay
    free = available_memory()
    if replay and rss() + replay > free:
        other = ("; replay: frames stores each frame once (about 8x less for 4 stacked frames)"
                 if config.get("replay", "full") == "full" and len(env.observation_space.shape or ()) == 3 else "")
        raise ConfigError(f"the replay buffer of {config['buffer_size']:,} transitions needs {fmt_bytes(replay)} "
                          f"and this machine has {fmt_bytes(free)} of memory available: lower buffer_size "
                          f"(--buffer-size){other}")
    return replay, peak


def _seconds_per(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up (first calls allocate)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def _random_observations(space: spaces.Space, n: int) -> np.ndarray:
    """``n`` observations drawn from a generator of their own (the spaces' generators belong to the run)."""
    rng = np.random.default_rng(0)
    if np.issubdtype(space.dtype, np.integer):
        return rng.integers(space.low, space.high, size=(n, *space.shape), endpoint=True).astype(space.dtype)
    low, high = np.maximum(space.low, -1e3), np.minimum(space.high, 1e3)
    return rng.uniform(low, high, size=(n, *space.shape)).astype(space.dtype)


def estimate_seconds(config: Mapping[str, Any], model: BaseAlgorithm, make_env: Callable[[], VecEnv]
                     ) -> tuple[float, int] | None:
    """``(seconds, updates)``: the estimated duration of a Q-learning run's remaining steps (DQN, Rainbow) and the
    gradient updates in them, from a short calibration (module docstring); None for other algorithms."""
    q_net = getattr(model, "q_net", None)
    if q_net is None or "train_freq" not in config:
        return None
    steps = config["n_timesteps"] - int(model.num_timesteps)
    env = make_env()
    try:
        env.reset()
        n = env.num_envs
        env_s = _seconds_per(lambda: env.step(np.array([env.action_space.sample() for _ in range(n)])), 50) / n
    finally:
        env.close()
    policy = model.policy
    batch = _random_observations(model.observation_space, config.get("batch_size", 32))
    x = preprocess_obs(torch.as_tensor(batch, device=model.device), model.observation_space,
                       normalize_images=policy.normalize_images)
    act_s = _seconds_per(lambda: policy.predict(batch[:1], deterministic=True), 10)

    def update() -> None:
        q_net(x).float().sum().backward()

    update_s = _seconds_per(update, 3) * 1.5  # (plus the target network's forward pass and the optimiser step)
    q_net.zero_grad(set_to_none=True)
    updates = math.ceil(max(0, steps - config.get("learning_starts", 0)) / config["train_freq"]) * \
        config.get("gradient_steps", 1)
    return steps * (env_s + act_s / n) + updates * update_s, updates
