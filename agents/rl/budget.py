"""What a run will cost before it starts: replay memory, peak memory and wall time on this machine.

A run prints its plan at the start (env steps, updates, the estimated duration, the peak memory with the replay
buffer) and refuses a replay buffer that does not fit in the memory available now, before allocating it; a resumed
run plans and checks the same way, before it loads the checkpoint (the replay buffer it loads counts).

The duration of a Q-learning run (DQN, Rainbow) is an :class:`Estimate`: a cost model with three costs per unit,
seconds per env step acting at random, per env step acting with the Q-network, and per gradient step, applied to the
run's schedule (random steps before ``learning_starts``, then epsilon-greedy: the epsilon schedule says which
share of the steps runs the network; one update of ``gradient_steps`` per ``train_freq`` steps). :func:`calibrate`
measures the three costs in about :data:`CALIBRATION_S` s before the run starts, the way the run spends them: a
throwaway copy of the env is stepped in rollouts of ``train_freq`` steps, each followed by real updates (the
algorithm's own ``train``: replay sampling, target network, loss, backward pass, optimiser step) of a copy of the
model on a small replay buffer of those steps, after warm-up rollouts that are not timed (first calls allocate and
pick kernels). The run itself is left as it was (weights, optimiser, replay buffer, random generators), so a run
trains identically with or without it. Probes, evaluations and checkpoints are not counted.

The measurement is short and the costs it measures are not steady on a shared machine (two threads' forward and
backward passes slow down several-fold while other processes want the cores), so the first estimate is labelled as
such and says when the machine is busy. After :data:`agents.rl.callbacks.ESTIMATE_AFTER_S` s of training the run
fits the same model to its own time spent acting and updating (:meth:`Estimate.measured`) and prints the updated
estimate in the first one's place. It does not extrapolate the early pace: the early steps act mostly at random
(epsilon near 1), without the Q-network's forward pass that later runs at almost every step, so their pace alone
promises a run shorter than it will be (Atari DQN here: 410 env steps/s at first, 320 once epsilon is 0.05).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.preprocessing import get_action_dim, is_image_space, is_image_space_channels_first
from stable_baselines3.common.vec_env import VecEnv, VecTransposeImage

from agents.errors import ConfigError

from .frame_buffer import frame_buffer_bytes

__all__ = ["replay_bytes", "available_memory", "rss", "check_memory", "calibrate", "estimate_seconds", "Estimate",
           "busy", "fmt_bytes", "CALIBRATE_ABOVE", "CALIBRATION_S"]

#: runs longer than this (env steps) calibrate their duration estimate at the start
CALIBRATE_ABOVE = 20_000
#: seconds the start-of-run calibration measures for (at least :data:`_MIN_ROLLOUTS` rollouts of each kind)
CALIBRATION_S = 1.5
_WARMUP_ROLLOUTS = 2  # of each kind, not timed
_MIN_ROLLOUTS = 3  # timed, of each kind
_CALIBRATION_BUFFER = 1000  # transitions of the calibration's replay buffer (at least)
_GRID = 4096  # intervals of the table of random-action steps


def fmt_bytes(n: float) -> str:
    """``7.46 GB`` (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return ""


def replay_bytes(config: Mapping[str, Any], obs: spaces.Space, act: spaces.Space) -> int:
    """Bytes of host memory the replay buffer of a resolved off-policy config allocates (0 for on-policy configs): the
    frame buffer's (:func:`agents.rl.frame_buffer.frame_buffer_bytes`, less its frames where ``frames_on: device`` puts
    them on a GPU) or SB3's (whole observations and next observations, actions,
    rewards, dones, timeouts), plus the sum tree of prioritized replay."""
    if "buffer_size" not in config:
        return 0
    if is_image_space(obs, check_channels=False) and not is_image_space_channels_first(obs):
        obs = VecTransposeImage.transpose_space(obs)  # as the model stores it
    n_envs = config.get("n_envs", 1)
    rows = max(config["buffer_size"] // n_envs, 1)
    if config.get("replay") == "frames":
        size = frame_buffer_bytes(config["buffer_size"], obs, act, n_envs)
        if config.get("frames_on") == "device" and _on_cuda(config):  # (the GPU's memory holds the frames)
            size -= frame_buffer_bytes(config["buffer_size"], obs, act, n_envs, frames_only=True)
    else:
        obs_bytes = int(np.prod(obs.shape)) * np.dtype(obs.dtype).itemsize
        size = rows * n_envs * (2 * obs_bytes + 4 * get_action_dim(act) + 12)
    if config.get("prioritized"):
        size += 2 * 2 * (1 << max(0, (rows - 1).bit_length())) * 8  # sums and minima
    return size


def _on_cuda(config: Mapping[str, Any]) -> bool:
    device = str(config.get("device", "cpu"))
    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


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


def check_memory(config: Mapping[str, Any], env: VecEnv, resume: bool = False) -> tuple[int, int]:
    """``(replay bytes, peak bytes)`` of a run of ``config`` on ``env`` (anything with its observation and action
    spaces), called before the replay buffer is allocated (a fresh run) or loaded (``resume``: before the checkpoint
    is read); ConfigError if they do not fit in the memory available now (with what to change)."""
    replay = replay_bytes(config, env.observation_space, env.action_space)
    peak = rss() + replay
    free = available_memory()
    if replay and peak > free:
        other = ("; replay: frames stores each frame once (about 8x less for 4 stacked frames)"
                 if config.get("replay", "full") == "full" and len(env.observation_space.shape or ()) == 3 else "")
        what = ("free memory to resume this run, or start it afresh (without --resume) with a lower buffer_size "
                "(--buffer-size)" if resume else "lower buffer_size (--buffer-size)")
        raise ConfigError(f"the replay buffer of {config['buffer_size']:,} transitions needs {fmt_bytes(replay)} "
                          f"and this machine has {fmt_bytes(free)} of memory available: {what}{other}")
    return replay, peak


# --- duration ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Estimate:
    """The duration of a Q-learning run of ``total`` env steps from its schedule and three costs (module docstring).

    ``random_steps`` tabulates the cumulative number of env steps acted at random (before ``learning_starts``, then
    a share epsilon) at the steps ``grid``; ``rollout`` is the env steps between updates (``train_freq`` times the
    envs), each update ``gradient_steps`` gradient steps. ``calibration_s``: how long the measurement took.
    """

    total: int
    learning_starts: int
    rollout: int
    gradient_steps: int
    random_s: float  # seconds per env step acting at random (env step, storing the transition, the loop)
    forward_s: float  # seconds more per env step acting with the Q-network (its forward pass)
    update_s: float  # seconds per gradient step (sampling, target, loss, backward pass, optimiser step)
    grid: np.ndarray
    random_steps: np.ndarray
    calibration_s: float = 0.0

    def _rollout_ends(self, step: int) -> int:
        """Rollout ends after which the run updates, up to ``step`` (the last, at ``total``, rounds up: SB3 ends a
        run with a whole rollout)."""
        ends = -(-step // self.rollout) if step >= self.total else step // self.rollout
        return max(0, ends - self.learning_starts // self.rollout)

    def updates(self, start: int, end: int | None = None) -> int:
        """Gradient steps between env steps ``start`` and ``end`` (default: the end of the run)."""
        end = self.total if end is None else end
        return self.gradient_steps * max(0, self._rollout_ends(end) - self._rollout_ends(start))

    def greedy_steps(self, start: int, end: int | None = None) -> float:
        """Env steps acted with the Q-network between ``start`` and ``end`` (the others act at random)."""
        end = self.total if end is None else end
        lo, hi = np.interp([start, end], self.grid, self.random_steps)
        return float(min(max(0, end - start), max(0.0, (end - start) - (hi - lo))))

    def acting_seconds(self, start: int, end: int | None = None) -> float:
        """Seconds of env steps (acting, stepping, storing) between ``start`` and ``end``."""
        end = self.total if end is None else end
        return max(0, end - start) * self.random_s + self.greedy_steps(start, end) * self.forward_s

    def seconds(self, start: int, end: int | None = None) -> float:
        """Seconds from env step ``start`` to ``end`` (default: the end of the run)."""
        return self.acting_seconds(start, end) + self.updates(start, end) * self.update_s

    def scaled(self, stepping: float, network: float, forward: float | None = None) -> Estimate:
        """This model with the cost of env steps times ``stepping`` and the network's costs (updates and, unless
        ``forward`` says otherwise, forward passes) times ``network``: what a run measured on itself."""
        return dataclasses.replace(self, random_s=self.random_s * stepping, update_s=self.update_s * network,
                                   forward_s=self.forward_s * (network if forward is None else forward))

    def measured(self, start: int, end: int, acting: float, updating: float) -> Estimate:
        """This model fitted to a run that spent ``acting`` seconds in its env steps from ``start`` to ``end`` and
        ``updating`` seconds in the updates after them: the update cost from the updates; the forward passes scale
        with it (network work both; early on, at epsilon near 1, the run hardly measures them), the env steps take
        the rest of the acting time (or, where that leaves too little, everything acting scales alike)."""
        said_updating = self.updates(start, end) * self.update_s
        network = updating / said_updating if said_updating > 0 and updating > 0 else 1.0
        stepping_said = max(0, end - start) * self.random_s
        rest = acting - self.greedy_steps(start, end) * self.forward_s * network
        if stepping_said > 0 and rest > 0.2 * acting:
            return self.scaled(rest / stepping_said, network)
        said = self.acting_seconds(start, end)
        alike = acting / said if said > 0 else 1.0
        return self.scaled(alike, network, forward=alike)


def busy() -> str:
    """``load 4.4 on 2 cores`` when more processes want to run than this process has cores (``os.getloadavg``),
    else empty: timings measured now are slower than they will be on a quiet machine."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return f"load {load:.1f} on {cores} cores" if load > cores else ""


def _epsilon(model: BaseAlgorithm, total: int) -> Callable[[int], float]:
    """The model's exploration rate after ``t`` env steps: PaperDQN's absolute schedule or SB3's fraction of the run."""
    if getattr(model, "exploration_steps", None) is not None and hasattr(model, "epsilon"):
        return model.epsilon
    schedule = getattr(model, "exploration_schedule", None)
    if schedule is None:
        return lambda t: 0.0
    return lambda t: float(schedule(1.0 - t / max(total, 1)))


def _random_table(model: BaseAlgorithm, total: int, learning_starts: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps, cumulative env steps acted at random up to each): exact for piecewise-linear epsilon schedules whose
    kinks lie on the grid (learning_starts, the end of the decay)."""
    eps = _epsilon(model, total)
    kinks = [learning_starts, learning_starts + (getattr(model, "exploration_steps", None) or 0),
             getattr(model, "exploration_fraction", 0.0) * total]
    grid = np.unique(np.clip(np.concatenate([np.linspace(0, total, _GRID + 1), kinks]), 0, total))
    share = np.array([1.0 if t < learning_starts else min(1.0, max(0.0, eps(int(t)))) for t in grid])
    cumulative = np.concatenate([[0.0], np.cumsum(np.diff(grid) * (share[1:] + share[:-1]) / 2)])
    return grid, cumulative


@contextlib.contextmanager
def _generators_kept(device: torch.device) -> Iterator[None]:
    """Restore the global random generators (Python, numpy, torch, CUDA) on the way out."""
    py, np_state, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.device(device).type == "cuda" and torch.cuda.is_initialized() \
        else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(np_state)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _twin(model: BaseAlgorithm, n_envs: int) -> BaseAlgorithm:
    """A copy of ``model`` to train in the calibration: its own networks, optimiser and a small replay buffer of
    the same kind; the env is shared (never stepped), the logger is a throwaway."""
    size = max(_CALIBRATION_BUFFER, 2 * int(model.batch_size) + 64)
    buffer = model.replay_buffer_class(size, model.observation_space, model.action_space, device=model.device,
                                       n_envs=n_envs, optimize_memory_usage=model.optimize_memory_usage,
                                       **model.replay_buffer_kwargs)
    memo: dict[int, Any] = {id(model.replay_buffer): buffer, id(model.logger): Logger(folder=None, output_formats=[])}
    for shared in (model.env, getattr(model, "_vec_normalize_env", None)):
        if shared is not None:
            memo[id(shared)] = shared
    twin = copy.deepcopy(model, memo)
    twin.exploration_rate = 0.0  # predict acts with the network
    return twin


def _wrapped(env: VecEnv) -> VecEnv:
    """``env`` as the model sees it (image observations channel-first)."""
    return BaseAlgorithm._wrap_env(env, verbose=0, monitor_wrapper=False)


def calibrate(config: Mapping[str, Any], model: BaseAlgorithm, make_env: Callable[[], VecEnv],
              seconds: float | None = None) -> Estimate | None:
    """The :class:`Estimate` of a Q-learning run (DQN, Rainbow), measured in about ``seconds`` (default
    :data:`CALIBRATION_S`; module docstring); None for other algorithms. ``make_env`` builds a throwaway copy of the
    training env."""
    seconds = CALIBRATION_S if seconds is None else seconds
    if getattr(model, "q_net", None) is None or "train_freq" not in config \
            or getattr(model, "replay_buffer_class", None) is None:
        return None
    t_start = time.perf_counter()
    total, starts = int(config["n_timesteps"]), int(getattr(model, "learning_starts", 0))
    freq, gradient_steps = int(config["train_freq"]), int(config.get("gradient_steps", 1))
    with _generators_kept(model.device):
        env = _wrapped(make_env())
        try:
            n = env.num_envs
            twin = _twin(model, n)
            buffer, batch = twin.replay_buffer, int(model.batch_size)
            obs = env.reset()

            def rollout(greedy: bool) -> None:
                nonlocal obs
                for _ in range(freq):
                    action = twin.predict(obs, deterministic=False)[0] if greedy else \
                        np.array([env.action_space.sample() for _ in range(n)])
                    new_obs, reward, done, infos = env.step(action)
                    buffer.add(obs, new_obs, action, reward, done, infos)
                    obs = new_obs

            def update() -> None:
                twin.train(gradient_steps=gradient_steps, batch_size=batch)

            while buffer.size() < batch + 16:  # enough transitions to sample (untimed)
                rollout(False)
            for _ in range(_WARMUP_ROLLOUTS):  # first calls allocate and pick kernels (untimed)
                for greedy in (False, True):
                    rollout(greedy)
                    update()
            acting = {False: [0.0, 0], True: [0.0, 0]}  # seconds, env steps
            updating = [0.0, 0]  # seconds, gradient steps
            greedy = False
            while True:  # alternating as the run alternates: a rollout, then its update
                t0 = time.perf_counter()
                rollout(greedy)
                t1 = time.perf_counter()
                update()
                t2 = time.perf_counter()
                acting[greedy][0] += t1 - t0
                acting[greedy][1] += freq * n
                updating[0] += t2 - t1
                updating[1] += gradient_steps
                greedy = not greedy
                if not greedy and acting[True][1] >= _MIN_ROLLOUTS * freq * n \
                        and t2 - t_start >= seconds:
                    break
        finally:
            env.close()
    grid, randomly = _random_table(model, total, starts)
    random_s, greedy_s = acting[False][0] / acting[False][1], acting[True][0] / acting[True][1]
    return Estimate(total=total, learning_starts=starts, rollout=freq * n, gradient_steps=gradient_steps,
                    random_s=random_s, forward_s=max(0.0, greedy_s - random_s), update_s=updating[0] / updating[1],
                    grid=grid, random_steps=randomly, calibration_s=time.perf_counter() - t_start)


def estimate_seconds(config: Mapping[str, Any], model: BaseAlgorithm, make_env: Callable[[], VecEnv]
                     ) -> tuple[float, int] | None:
    """``(seconds, updates)`` of a Q-learning run's remaining steps (:func:`calibrate`); None for other algorithms."""
    estimate = calibrate(config, model, make_env)
    if estimate is None:
        return None
    done = int(model.num_timesteps)
    return estimate.seconds(done), estimate.updates(done)
