"""Exact resume of an SB3 run: periodic checkpoints and the state they restore.

A checkpoint (``RUN_DIR/checkpoint.pkl``, one pickle) holds everything that decides the rest of a run:

* the model as ``model.save`` writes it (network weights, optimiser states, step and update counters, the
  exploration and learning-rate schedules, the last observation and episode starts, the episode-info buffer);
* the gradients left by the last update (``.grad``; probes read them);
* the replay buffer (off-policy; PPO's rollout buffer is refilled at every rollout and is not needed); the frames
  of a :class:`~agents.rl.frame_buffer.FrameReplayBuffer` go to chunk files in ``RUN_DIR/replay/`` instead, each
  checkpoint writing only the frames added since the one before (a 7 GB Atari buffer is not rewritten every time);
* the environment, pickled whole: each env's state and ``np_random`` (ALE's emulator state with its RNG, MuJoCo's
  integration state), time limits, monitors, Atari wrappers, frame stacks, and ``VecNormalize``'s
  observation/reward statistics and running returns (an env that would pickle as a fresh one, gymnasium's
  ``EzPickle`` without a wrapper carrying its state, is refused);
* the RNG states: torch (CPU and CUDA), numpy's and Python's global generators, the action and observation
  spaces' generators;
* the run log's state: record counts per series, each probe's cadence, the probe RNG and fixed probe inputs, the
  pending update's losses; the progress so far (episode returns, wall time).

It is taken at the start of a rollout (SB3's ``on_rollout_start``): after an update and before the next env step,
where ``learn`` itself starts a loop iteration, so a resumed ``learn`` continues the same sequence of steps,
updates and random draws. ``--resume`` rebuilds the model from it, cuts the run log back to the records the
checkpoint had seen (later ones are written again, identically) and continues: final weights and log records equal
those of an uninterrupted run with the same seed (tests/test_resume.py).

Writes are atomic (a temporary file, ``fsync``, ``rename``, ``fsync`` of the folder): a kill at any moment leaves
the previous checkpoint or the new one, never a mix (replay chunks are written before the checkpoint that names them
and deleted only after a later checkpoint stops naming them). A stop by Ctrl-C or SIGTERM waits for the next
rollout start and checkpoints there, so a pre-empted run loses nothing. Environments that cannot be pickled run
without checkpoints, with a note (an explicit ``--checkpoint-every N`` is refused).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import pickle
import random
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.save_util import recursive_getattr
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper
from torch import Tensor, nn

from agents.errors import ConfigError, RunWriteError
from agents.runfolder import OUTPUT_KEYS
from runlog.failpoints import kill_point
from runlog.provenance import provenance
from probes.sb3 import ProbeCallback

from .algos import ALGOS
from .callbacks import RunCallback
from .frame_buffer import prune_chunks

__all__ = ["CHECKPOINT", "REPLAY_DIR", "CheckpointError", "CheckpointWriteError", "Checkpointer", "read_checkpoint",
           "restore_model", "check_picklable", "write_atomic"]

CHECKPOINT = "checkpoint.pkl"
REPLAY_DIR = "replay"  # frame chunks of a FrameReplayBuffer
FORMAT = "interference-checkpoint"
VERSION = 2
READABLE = (1, 2)  # 1: the env as {"env"} or {"normalize", "venv", "returns"}; 2: as a wrapper chain


class CheckpointError(ConfigError):
    """A checkpoint cannot be read, does not belong to the run being resumed, or cannot hold the run's env."""


class CheckpointWriteError(RunWriteError):
    """Writing a checkpoint failed (full disk, I/O error): the run stops."""


def _rng_states(model: BaseAlgorithm) -> dict[str, Any]:
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
            "numpy": np.random.get_state(), "random": random.getstate(),
            "action_space": model.action_space.np_random.bit_generator.state,
            "observation_space": model.observation_space.np_random.bit_generator.state}


def _set_rng_states(model: BaseAlgorithm, states: Mapping[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None:
        torch.cuda.set_rng_state_all(states["cuda"])
    np.random.set_state(states["numpy"])
    random.setstate(states["random"])
    model.action_space.np_random.bit_generator.state = states["action_space"]
    model.observation_space.np_random.bit_generator.state = states["observation_space"]


def _gradients(model: BaseAlgorithm) -> dict[str, Tensor]:
    """The ``.grad`` of every tensor SB3 saves (policy parameters, SAC's ``log_ent_coef``): not in ``model.zip``,
    but probes read them (the weights probe's gradient norms) and an optimiser step may too."""
    modules, variables = model._get_torch_save_params()
    tensors = {f"{m}.{n}": p for m in modules if isinstance(obj := recursive_getattr(model, m), nn.Module)
               for n, p in obj.named_parameters()}
    tensors.update({v: recursive_getattr(model, v) for v in variables})
    return {name: t.grad.detach().clone() for name, t in tensors.items() if t.grad is not None}


def _set_gradients(model: BaseAlgorithm, grads: Mapping[str, Tensor]) -> None:
    for name, grad in grads.items():
        recursive_getattr(model, name).grad = grad.to(model.device)


def _env_state(env: VecEnv) -> dict[str, Any]:
    """The env for a checkpoint: its ``VecEnvWrapper`` chain, outermost first, each as its class and attributes
    (SB3's wrappers keep ``class_attributes``, which holds unpicklable ABC data, and ``VecNormalize`` pickles
    without its inner env and running returns), then the innermost ``VecEnv`` pickled whole."""
    chain = _chain(env)
    for sub in getattr(chain[-1], "envs", []):
        _check_state_travels(sub)
    wrappers = [(type(w), {k: v for k, v in vars(w).items() if k not in ("venv", "class_attributes")})
                for w in chain[:-1]]
    return {"wrappers": wrappers, "base": chain[-1]}


def _check_state_travels(env: Any) -> None:
    """TypeError if pickling ``env`` would lose its state: gymnasium's ``EzPickle`` envs (MuJoCo, ALE, Box2D) pickle
    as their constructor arguments, a fresh env, unless a wrapper carries their state (:class:`PicklableEmulator`,
    :class:`PicklableSimulation`)."""
    from gymnasium.utils import EzPickle

    from .envs import PicklableEmulator, PicklableSimulation

    layer = env
    while isinstance(layer, gym.Wrapper):
        if isinstance(layer, (PicklableEmulator, PicklableSimulation)):
            return
        layer = layer.env
    if isinstance(layer, EzPickle):
        raise TypeError(f"{type(layer).__name__} pickles as its constructor arguments (gymnasium's EzPickle), which "
                        "would restart it: its state cannot travel in a checkpoint")


def _restore_env(state: Mapping[str, Any]) -> VecEnv:
    if "env" in state:  # version 1
        env = state["env"]
    elif "normalize" in state:  # version 1
        env = state["normalize"]
        env.set_venv(state["venv"])
        env.returns = state["returns"]  # set_venv zeroes the discounted returns the reward scale is updated with
    else:
        env = _rewrap(state)
    for sub in getattr(_chain(env)[-1], "envs", []):  # a checkpoint written before an env's state travelled in it
        try:
            _check_state_travels(sub)
        except TypeError as err:
            raise CheckpointError(f"the checkpoint did not keep its environment's state ({err}); delete it to start "
                                  "the run afresh") from None
    return env


def _rewrap(state: Mapping[str, Any]) -> VecEnv:
    """The env of :func:`_env_state`: its innermost ``VecEnv``, wrapped again in its chain."""
    env = state["base"]
    for cls, attributes in reversed(state["wrappers"]):
        wrapper = cls.__new__(cls)
        wrapper.__dict__.update(attributes)
        wrapper.venv = env
        wrapper.class_attributes = dict(inspect.getmembers(cls))  # what VecEnvWrapper.__init__ sets
        env = wrapper
    return env


def check_picklable(env: Any, env_id: str) -> None:
    """CheckpointError (with what to do) if checkpoints cannot hold ``env``."""
    try:
        cloudpickle.dumps(_env_state(env))
    except Exception as err:  # noqa: BLE001 - any pickling failure means the same thing here
        raise CheckpointError(f"{env_id}: checkpoints cannot save this environment ({type(err).__name__}: {err}); "
                              "run it with --checkpoint-every 0 (no checkpoints; --resume starts it afresh)") from None


def _chain(env: VecEnv) -> list[VecEnv]:
    out = [env]
    while isinstance(out[-1], VecEnvWrapper):
        out.append(out[-1].venv)
    return out


class _KillableFile(io.RawIOBase):
    """A file whose first write is followed by the ``checkpoint.mid_write`` kill point (fault tests)."""

    def __init__(self, f: io.BufferedWriter) -> None:
        self.f, self.first = f, True

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = self.f.write(data)
        if self.first:
            self.first = False
            self.f.flush()
            kill_point("checkpoint.mid_write")
        return n


def write_atomic(path: Path, state: Mapping[str, Any]) -> int:
    """Pickle ``state`` to ``path`` through a temporary file renamed over it; returns the size in bytes."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            cloudpickle.dump(state, _KillableFile(f), protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)  # the previous checkpoint stays the one to resume from
        raise
    kill_point("checkpoint.before_rename")
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself reaches the disk
    finally:
        os.close(fd)
    kill_point("checkpoint.after_rename")
    return path.stat().st_size


class Checkpointer(BaseCallback):
    """Checkpoint every ``every`` env steps (at the first rollout start at or after each multiple) and when a stop
    is requested; on a resumed run, restore the global RNG states at the first rollout start.

    Must come after ``run_cb`` and ``probe_cb`` in the ``CallbackList`` (it saves their state after their hooks).
    """

    def __init__(self, run_dir: Path, every: int, *, config: Mapping[str, Any], run_cb: RunCallback,
                 probe_cb: ProbeCallback, resume: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.path = Path(run_dir) / CHECKPOINT
        self.every, self.config, self.run_cb, self.probe_cb = int(every), dict(config), run_cb, probe_cb
        self._resume = resume
        self.last_step: int | None = None if resume is None else resume["step"]
        self.saved: list[tuple[int, int, float]] = []  # (step, bytes, seconds) of each checkpoint written
        run_cb.defer_stop = True  # a requested stop waits for the checkpoint at the next rollout start

    def _on_rollout_start(self) -> None:
        if self._resume is not None:  # the boundary the checkpoint was taken at: training draws from here on
            _set_rng_states(self.model, self._resume["rng"])
            self._resume = None
            return
        step = self.num_timesteps
        due = self.every > 0 and step // self.every > (self.last_step or 0) // self.every
        if self.run_cb.stop_requested or (due and step > 0):
            self.save()
        if self.run_cb.stop_requested:
            self.run_cb.defer_stop = False

    def _on_step(self) -> bool:
        return True

    def save(self) -> None:
        """Write the checkpoint of the current state (atomically)."""
        t0 = time.perf_counter()
        model = self.model
        replay = model.replay_buffer if isinstance(model, OffPolicyAlgorithm) else None
        try:  # the frames added since the last checkpoint, in a chunk file of their own, before the state naming it
            chunks = replay.save_frames(self.path.parent / REPLAY_DIR) if hasattr(replay, "save_frames") else None
        except OSError as err:
            raise CheckpointWriteError(f"{self.path.parent / REPLAY_DIR}: cannot write the replay frames "
                                       f"({err.strerror or err}); the disk may be full") from err
        buffer = io.BytesIO()
        model.save(buffer)
        state = {
            "format": FORMAT, "version": VERSION, "step": int(model.num_timesteps),
            "config": self.config, "provenance": provenance(),
            "model": buffer.getvalue(),
            "replay_buffer": replay,
            "replay_chunks": chunks,
            "env": _env_state(model.env),
            "rng": _rng_states(model),
            "gradients": _gradients(model),
            "run": self.run_cb.state(),
            "probes": self.probe_cb.state(),
        }
        try:
            with replay.frames_in_chunks() if chunks is not None else contextlib.nullcontext():
                size = write_atomic(self.path, state)
        except OSError as err:
            raise CheckpointWriteError(f"{self.path}: cannot write the checkpoint ({err.strerror or err}); the disk "
                                       "may be full") from err
        if chunks is not None:
            prune_chunks(self.path.parent / REPLAY_DIR, chunks)
            size += sum((self.path.parent / REPLAY_DIR / name).stat().st_size for name in chunks)
        self.last_step = state["step"]
        self.saved.append((state["step"], size, time.perf_counter() - t0))


def read_checkpoint(run_dir: Path, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The checkpoint in ``run_dir`` (None if there is none), checked against the run's ``config``.

    Raises:
        CheckpointError: unreadable (corrupt, truncated, from another format), or taken with another config.
    """
    path = Path(run_dir) / CHECKPOINT
    if not path.exists():
        return None
    try:
        with open(path, "rb") as f:
            state = pickle.load(f)
    except Exception as err:  # noqa: BLE001 - unpickling garbage raises anything
        raise CheckpointError(f"{path}: corrupt or truncated checkpoint ({type(err).__name__}: {err}); delete it to "
                              "start the run afresh") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or state.get("version") not in READABLE:
        raise CheckpointError(f"{path}: not a checkpoint this version reads ({FORMAT} {', '.join(map(str, READABLE))})")
    saved, now = _comparable(state["config"]), _comparable(config)
    if saved != now:
        keys = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
        raise CheckpointError(f"{path}: taken with another config (differs in {', '.join(keys)}); resume with the "
                              "run's own config (its config.yaml), or start afresh without --resume")
    versions, current = state["provenance"]["versions"], provenance()["versions"]
    if changed := sorted(k for k in versions if versions[k] != current.get(k)):
        print(f"warning: {path} was written with other versions of {', '.join(changed)}; the resumed run may differ "
              "from an uninterrupted one", file=sys.stderr)
    return state


def _comparable(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in OUTPUT_KEYS}  # a resume may change these


def restore_model(state: Mapping[str, Any], config: Mapping[str, Any], run_dir: Path) -> BaseAlgorithm:
    """The model of a checkpoint in ``run_dir`` with its env and replay buffer (global RNGs are restored by the
    :class:`Checkpointer` at the first rollout start)."""
    with warnings.catch_warnings():  # SB3 saves the NStepReplayBuffer class it picked, then warns on load that
        warnings.filterwarnings("ignore", message=r"`n_steps=\d+` is ignored")  # n_steps ignores a custom one
        model = ALGOS[config["algo"]].model.load(io.BytesIO(state["model"]), env=_restore_env(state["env"]),
                                                 device=config["device"], force_reset=False)
    model.set_logger(Logger(folder=None, output_formats=[]))
    if state["replay_buffer"] is not None:
        model.replay_buffer = state["replay_buffer"]
        if state.get("replay_chunks") is not None:
            model.replay_buffer.place_frames(config.get("frames_on", "host"))  # (this attempt's setting)
            try:
                model.replay_buffer.load_frames(Path(run_dir) / REPLAY_DIR, state["replay_chunks"])
            except OSError as err:
                raise CheckpointError(f"{err}; delete {Path(run_dir) / CHECKPOINT} to start the run afresh") from None
    _set_gradients(model, state["gradients"])
    return model
