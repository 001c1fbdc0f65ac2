"""A replay buffer for stacked pixel observations that stores each frame once (Atari at the paper's 1e6 scale).

SB3's replay buffer keeps every observation and next observation whole: a 4x84x84 stack twice per transition,
~56 kB, 56 GB for the paper's 1e6 transitions (28 GB with ``optimize_memory_usage``). :class:`FrameReplayBuffer`
keeps one ``84x84`` uint8 frame per transition (~7.1 kB, ~7.5 GB at 1e6 with its slack) and rebuilds stacks from
indices when it samples.

Storage. Frames live in a ring of ``F`` slots, each with the serial number of the frame before it in its stack
(``prev``; ``-1``: nothing before it, i.e. zeros). A transition stores the serials of the newest frames of its
observation and next observation (``obs_head``, ``next_head``); a stack is rebuilt by following ``prev`` from the
head, ``frame_stack`` frames deep, zeros where the chain ends. When a transition is added:

* its observation continues the previous transition of the same env if it equals that transition's next
  observation (compared in full), and shares its frames; otherwise (the first transition, the one after an episode
  ended) its frames are written as a new chain whose leading all-zero frames become the end of the chain;
* its next observation shares all but its newest frame with the observation if they are shifted copies of each
  other (compared in full), and then adds one frame; otherwise (never, after SB3's ``VecFrameStack``) it is written
  as a chain of its own.

So a rebuilt stack equals the stack the agent was shown, whatever the padding: the padding convention is the
acting wrapper's. SB3's ``VecFrameStack`` (our Atari envs) pads an episode's first stacks with zero frames
(``[0, 0, 0, f0]``, then ``[0, 0, f0, f1]``, ...) and starts a new stack after every ``done`` (with Atari's
episodic life: every life lost); the terminal observation (``infos["terminal_observation"]``) continues the
episode's stack. No comparison is assumed to hold: a stack that does not continue is stored whole.

A typical step writes one frame, an episode's first step two. The ring holds ``ceil(buffer_size * (1 + frame_slack))
+ frame_stack * n_envs`` frames; the slack pays for the episode starts (5 %: lives of 20 steps or more on average).
If episodes are shorter, the oldest transitions whose frames have been overwritten leave the buffer before
``buffer_size`` is reached (``evicted`` counts them); the buffer never returns a frame it no longer holds.

Sampling returns what SB3's buffers return for the same indices, bit for bit: :class:`~stable_baselines3.common.
buffers.ReplayBuffer`'s samples for ``n_steps=1``, :class:`~stable_baselines3.common.buffers.NStepReplayBuffer`'s
(n-step returns cut at a termination or truncation, and at the newest transition) otherwise; tests/
test_frame_buffer.py checks both against buffers holding full stacks, on recorded Atari episodes.

Checkpoints (:mod:`agents.rl.checkpoint`) pickle the buffer without its frames (:meth:`frames_in_chunks`; pickled
elsewhere it keeps them); :meth:`save_frames` writes the
frames added since the last checkpoint to a chunk file of their own and :meth:`load_frames` rebuilds the ring from
the chunks, so a checkpoint writes what is new, not the whole buffer.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer
from stable_baselines3.common.type_aliases import ReplayBufferSamples
from stable_baselines3.common.vec_env import VecNormalize

__all__ = ["FrameReplayBuffer", "frame_buffer_bytes", "stacked_samples", "FRAME_SLACK", "FRAMES_ON"]

FRAME_SLACK = 0.05
#: where a frame buffer keeps its frames
FRAMES_ON = ("host", "device")


def _frame_layout(observation_space: spaces.Space, frame_stack: int | None) -> tuple[int, tuple[int, ...]]:
    """``(frame_stack, frame_shape)`` of a channel-first stack ``(frame_stack * c, H, W)``; ValueError otherwise."""
    shape = getattr(observation_space, "shape", None)
    if not isinstance(observation_space, spaces.Box) or shape is None or len(shape) != 3:
        raise ValueError(f"FrameReplayBuffer stores stacks of image frames: the observation space must be a "
                         f"channel-first Box (stack * channels, H, W), got {observation_space}")
    k = shape[0] if frame_stack is None else int(frame_stack)
    if k < 1 or shape[0] % k:
        raise ValueError(f"FrameReplayBuffer: frame_stack={k} does not divide the {shape[0]} channels of {shape}")
    return k, (shape[0] // k, *shape[1:])


def frame_buffer_bytes(buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                       n_envs: int = 1, frame_stack: int | None = None, frame_slack: float = FRAME_SLACK,
                       frames_only: bool = False) -> int:
    """Bytes a :class:`FrameReplayBuffer` of these arguments allocates (frames, chains and transitions; with
    ``frames_only``, the frames alone: what ``frames_on="device"`` places on the device)."""
    k, frame_shape = _frame_layout(observation_space, frame_stack)
    rows = max(buffer_size // n_envs, 1)
    n_frames = math.ceil(rows * n_envs * (1 + frame_slack)) + k * n_envs
    itemsize = np.dtype(observation_space.dtype).itemsize
    if frames_only:
        return n_frames * int(np.prod(frame_shape)) * itemsize
    action_bytes = int(np.prod(action_space.shape or (1,))) * np.dtype(
        np.float32 if action_space.dtype == np.float64 else action_space.dtype).itemsize
    per_env = 8 + 8 + 4 + 4 + 4 + action_bytes  # obs_head, next_head, reward, done, timeout, action
    return n_frames * (int(np.prod(frame_shape)) * itemsize + 8) + rows * (8 + n_envs * per_env) + n_envs * 8


class FrameReplayBuffer(BaseBuffer):
    """SB3's replay buffer interface (``add``, ``sample``, ``_get_samples``, ``size``) over frames stored once.

    buffer_size: transitions held (split over ``n_envs`` like SB3's buffers); n_steps, gamma: n-step returns as
    SB3's ``NStepReplayBuffer`` (1: its ``ReplayBuffer``); frame_stack: frames per observation (default: all
    channels, one channel per frame); frame_slack: extra ring slots, a fraction of ``buffer_size`` (module docstring);
    frames_on: ``"host"`` (a numpy ring in host memory) or ``"device"`` (a torch ring on ``device``: a sample's
    stacks are gathered there, and only the frame indices cross from the host; the chains and transitions stay on
    the host either way; the samples are the same). ``optimize_memory_usage`` is refused (frames are already stored
    once).
    """

    def __init__(self, buffer_size: int, observation_space: spaces.Space, action_space: spaces.Space,
                 device: th.device | str = "auto", n_envs: int = 1, optimize_memory_usage: bool = False,
                 handle_timeout_termination: bool = True, n_steps: int = 1, gamma: float = 0.99,
                 frame_stack: int | None = None, frame_slack: float = FRAME_SLACK, frames_on: str = "host") -> None:
        super().__init__(buffer_size, observation_space, action_space, device, n_envs=n_envs)
        if optimize_memory_usage:
            raise ValueError("FrameReplayBuffer stores each frame once already; optimize_memory_usage is not needed")
        if n_steps < 1:
            raise ValueError(f"n_steps must be >= 1, got {n_steps}")
        if frame_slack < 0:
            raise ValueError(f"frame_slack must be >= 0, got {frame_slack}")
        if frames_on not in FRAMES_ON:
            raise ValueError(f"frames_on must be one of {FRAMES_ON}, got {frames_on!r}")
        self.k, self.frame_shape = _frame_layout(observation_space, frame_stack)
        self.c = self.frame_shape[0]
        self.buffer_size = max(buffer_size // n_envs, 1)
        self.n_steps, self.gamma = int(n_steps), float(gamma)
        self.handle_timeout_termination = handle_timeout_termination
        self.optimize_memory_usage = False
        self.frame_slack = float(frame_slack)
        self.n_frames = math.ceil(self.buffer_size * n_envs * (1 + frame_slack)) + self.k * n_envs
        self.frames_on = frames_on
        self.frames: np.ndarray | th.Tensor | None = self._empty_frames()
        self.prev = np.full(self.n_frames, -1, dtype=np.int64)
        self.frames_written = 0  # serial of the next frame
        shape = (self.buffer_size, n_envs)
        self.obs_head = np.zeros(shape, dtype=np.int64)
        self.next_head = np.zeros(shape, dtype=np.int64)
        self.row_min = np.zeros(self.buffer_size, dtype=np.int64)  # oldest frame serial a row's stacks reach
        self.actions = np.zeros((*shape, self.action_dim), dtype=np.float32 if action_space.dtype == np.float64
                                else action_space.dtype)
        self.rewards = np.zeros(shape, dtype=np.float32)
        self.dones = np.zeros(shape, dtype=np.float32)
        self.timeouts = np.zeros(shape, dtype=np.float32)
        self.rows_written = 0  # serial of the next row
        self.first_row = 0  # serial of the oldest row whose frames are all held
        self.evicted = 0  # rows dropped early because the ring overwrote their frames
        self._last_next: list[np.ndarray | None] = [None] * n_envs  # each env's last next observation ...
        self._last_next_head = np.full(n_envs, -1, dtype=np.int64)  # ... and the serial of its newest frame
        self._saved_upto = 0  # frames below this serial are in chunk files (save_frames)
        self._chunked = False  # pickling leaves the frames out (frames_in_chunks)

    def _empty_frames(self) -> np.ndarray | th.Tensor:
        shape, dtype = (self.n_frames, *self.frame_shape), np.dtype(self.observation_space.dtype)
        if self.frames_on == "device":
            return th.zeros(shape, dtype=th.from_numpy(np.zeros(0, dtype)).dtype, device=self.device)
        return np.zeros(shape, dtype=dtype)

    def place_frames(self, frames_on: str) -> None:
        """Keep the frames in host memory (``"host"``) or on the buffer's device (``"device"``) from now on."""
        if frames_on not in FRAMES_ON:
            raise ValueError(f"frames_on must be one of {FRAMES_ON}, got {frames_on!r}")
        if frames_on != self.frames_on and self.frames is not None:
            self.frames = th.as_tensor(self.frames, device=self.device) if frames_on == "device" else \
                self.frames.cpu().numpy()
        self.frames_on = frames_on

    def _host_frames(self, slots: np.ndarray) -> np.ndarray:
        """The frames in ``slots`` as a host array."""
        if isinstance(self.frames, th.Tensor):
            return self.frames[th.as_tensor(slots, device=self.device)].cpu().numpy()
        return self.frames[slots]

    # --- writing ----------------------------------------------------------------------------------------

    def _write_frame(self, frame: np.ndarray, prev: int) -> int:
        serial = self.frames_written
        slot = serial % self.n_frames
        self.frames[slot] = th.as_tensor(frame) if isinstance(self.frames, th.Tensor) else frame
        self.prev[slot] = prev
        self.frames_written += 1
        return serial

    def _write_chain(self, stack: np.ndarray) -> int:
        """Write a whole stack ``(k * c, H, W)`` as a new chain (leading all-zero frames left out); its head."""
        frames = stack.reshape(self.k, *self.frame_shape)
        first = 0
        while first < self.k - 1 and not frames[first].any():
            first += 1
        head = -1
        for frame in frames[first:]:
            head = self._write_frame(frame, head)
        return head

    def _chain_end(self, head: int) -> int:
        """The oldest frame serial a stack with newest frame ``head`` reads."""
        oldest = head
        for _ in range(self.k - 1):
            before = int(self.prev[oldest % self.n_frames])
            if before < 0:
                break
            oldest = before
        return oldest

    def add(self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: np.ndarray, done: np.ndarray,
            infos: list[dict[str, Any]]) -> None:
        """Add one transition per env (SB3's ``ReplayBuffer.add`` arguments; observations ``(n_envs, k*c, H, W)``)."""
        obs, next_obs = np.asarray(obs), np.asarray(next_obs)
        expected = (self.n_envs, *self.obs_shape)
        if obs.shape != expected or next_obs.shape != expected:
            raise ValueError(f"FrameReplayBuffer.add: observations must have shape {expected}, got {obs.shape} and "
                             f"{next_obs.shape}")
        row = self.pos
        oldest = np.iinfo(np.int64).max
        for e in range(self.n_envs):
            last = self._last_next[e]
            head = int(self._last_next_head[e]) if last is not None and np.array_equal(obs[e], last) \
                else self._write_chain(obs[e])
            if np.array_equal(next_obs[e, :-self.c], obs[e, self.c:]):
                nxt = self._write_frame(next_obs[e, -self.c:], head)
            else:
                nxt = self._write_chain(next_obs[e])
            self.obs_head[row, e], self.next_head[row, e] = head, nxt
            self._last_next[e], self._last_next_head[e] = next_obs[e].copy(), nxt
            oldest = min(oldest, self._chain_end(head))
        self.row_min[row] = oldest
        self.actions[row] = np.asarray(action).reshape((self.n_envs, self.action_dim))
        self.rewards[row] = np.asarray(reward)
        self.dones[row] = np.asarray(done)
        if self.handle_timeout_termination:
            self.timeouts[row] = np.array([info.get("TimeLimit.truncated", False) for info in infos])
        self.rows_written += 1
        self.pos = self.rows_written % self.buffer_size
        self.full = self.full or self.rows_written >= self.buffer_size
        self._evict()

    def _evict(self) -> None:
        """Drop the oldest rows whose stacks reach frames the ring has overwritten (rows of a row's own add and
        later ones are intact: the ring holds more than one add's frames)."""
        alive_from = self.frames_written - self.n_frames  # the oldest frame serial still in the ring
        start = max(self.first_row, self.rows_written - self.buffer_size)
        dropped = []
        while start < self.rows_written and self.row_min[start % self.buffer_size] < alive_from:
            dropped.append(start % self.buffer_size)
            start += 1
        if dropped:
            if self.first_row > self.rows_written - self.buffer_size or start > self.rows_written - self.buffer_size:
                self.evicted += len(dropped)
            self._dropped(np.array(dropped))
        self.first_row = start

    def _dropped(self, rows: np.ndarray) -> None:
        """Hook: ``rows`` (positions) left the buffer early (the prioritized buffer zeroes their priorities)."""

    # --- reading ----------------------------------------------------------------------------------------

    def size(self) -> int:
        """Transitions (rows) that can be sampled."""
        return self.rows_written - max(self.first_row, self.rows_written - self.buffer_size)

    def rows(self, u: np.ndarray) -> np.ndarray:
        """Positions of the valid rows numbered ``u`` in ``[0, size())``: ``u`` itself unless rows were evicted
        (then counted from the oldest valid row), so sampling draws as SB3's buffers draw."""
        start = max(self.first_row, self.rows_written - self.buffer_size)
        if start == max(0, self.rows_written - self.buffer_size):
            return np.asarray(u)
        return (start + np.asarray(u)) % self.buffer_size

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> ReplayBufferSamples:
        """``batch_size`` transitions drawn uniformly from the valid rows."""
        return self._get_samples(self.rows(np.random.randint(0, self.size(), size=batch_size)), env=env)

    def slots(self, heads: np.ndarray) -> np.ndarray:
        """The ring slots ``(N, k)`` of the stacks whose newest frames have serials ``heads`` ``(N,)``, oldest frame
        first; -1 where a stack has no frame (zeros)."""
        heads = np.asarray(heads, dtype=np.int64)
        out = np.full((heads.size, self.k), -1, dtype=np.int64)
        cur, alive_from = heads.copy(), self.frames_written - self.n_frames
        for j in range(self.k - 1, -1, -1):
            ok = cur >= 0
            if not ok.any():
                break
            if cur[ok].min() < alive_from:
                raise RuntimeError("FrameReplayBuffer: a stack reaches a frame the ring has overwritten (a bug: "
                                   "evicted rows must not be sampled)")
            out[ok, j] = cur[ok] % self.n_frames
            cur[ok] = self.prev[out[ok, j]]
        return out

    def stacks(self, heads: np.ndarray) -> np.ndarray | th.Tensor:
        """The stacks ``(N, k*c, H, W)`` whose newest frames have serials ``heads`` ``(N,)``: a host array, or a
        tensor on the device where the frames are (``frames_on="device"``)."""
        if self.frames is None:
            raise RuntimeError("FrameReplayBuffer: its frames are in a checkpoint's chunk files; load_frames first")
        slots = self.slots(heads)
        n = len(slots)
        if isinstance(self.frames, th.Tensor):
            index = th.as_tensor(slots, device=self.device)
            out = self.frames[index.clamp(min=0)]  # (slot -1: any frame, zeroed below)
            out *= (index >= 0).view(n, self.k, *([1] * len(self.frame_shape))).to(out.dtype)
            return out.reshape(n, *self.obs_shape)
        out = np.zeros((n, self.k, *self.frame_shape), dtype=self.frames.dtype)
        ok = slots >= 0
        out[ok] = self.frames[slots[ok]]
        return out.reshape(n, *self.obs_shape)

    def to_torch(self, array: np.ndarray | th.Tensor, copy: bool = True) -> th.Tensor:
        """SB3's ``to_torch``; a stack gathered on the device already is returned as it is."""
        if isinstance(array, th.Tensor):
            return array.to(self.device)
        return super().to_torch(array, copy)

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> ReplayBufferSamples:
        obs, actions, nxt, dones, rewards, discounts = self.sample_arrays(batch_inds, env)
        obs, nxt = (self._normalize_obs(self.stacks(heads), env) for heads in (obs, nxt))
        return ReplayBufferSamples(observations=self.to_torch(obs), actions=self.to_torch(actions),
                                   next_observations=self.to_torch(nxt), dones=self.to_torch(dones),
                                   rewards=self.to_torch(rewards),
                                   **({} if discounts is None else {"discounts": self.to_torch(discounts)}))

    def sample_arrays(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> tuple[np.ndarray, ...]:
        """What :meth:`_get_samples` returns for the rows ``batch_inds``, as host arrays and with the observations
        as the serials of their newest frames (for :meth:`stacks`): ``(obs heads (N,), actions (N, 1), next obs heads
        (N,), dones (N, 1), rewards (N, 1), discounts (N, 1) or None)``; n-step returns and discounts as SB3's
        ``NStepReplayBuffer``'s (``n_steps`` > 1), else SB3's ``ReplayBuffer``'s one-step ones (discounts None)."""
        env_indices = np.random.randint(0, self.n_envs, size=np.shape(batch_inds))
        obs = self.obs_head[batch_inds, env_indices]
        actions = self.actions[batch_inds, env_indices]
        if self.n_steps == 1:  # SB3's ReplayBuffer
            dones = (self.dones[batch_inds, env_indices] * (1 - self.timeouts[batch_inds, env_indices])).reshape(-1, 1)
            rewards = self._normalize_reward(self.rewards[batch_inds, env_indices].reshape(-1, 1), env)
            return obs, actions, self.next_head[batch_inds, env_indices], dones, rewards, None
        # SB3's NStepReplayBuffer: windows of n rows, cut at the first done or truncation, and at the newest row
        # (counted as truncated unless it is done: its next row belongs to another time)
        newest = (self.pos - 1) % self.buffer_size
        steps = np.arange(self.n_steps)[None, :]
        index = (batch_inds[:, None] + steps) % self.buffer_size
        envs = env_indices[:, None]
        cut = np.logical_or(self.timeouts[newest], np.logical_not(self.dones[newest])).astype(np.float32)
        timeouts = np.where(index == newest, cut[envs], self.timeouts[index, envs])
        rewards_seq = self._normalize_reward(self.rewards[index, envs], env)
        ends = np.logical_or(self.dones[index, envs], timeouts)
        last = np.where(ends.any(axis=1), ends.argmax(axis=1), self.n_steps - 1)
        mask = steps <= last[:, None]
        discounts = self.gamma ** mask.sum(axis=1, keepdims=True).astype(np.float32)
        returns = (rewards_seq * (self.gamma ** np.arange(self.n_steps, dtype=np.float32))[None, :] * mask).sum(
            axis=1, keepdims=True)
        last_rows = (batch_inds + last) % self.buffer_size
        last_dones = self.dones[last_rows, env_indices][:, None].astype(np.float32)
        last_timeouts = timeouts[np.arange(len(last)), last][:, None].astype(np.float32)
        return (obs, actions, self.next_head[last_rows, env_indices], last_dones * (1.0 - last_timeouts), returns,
                discounts)

    # --- checkpoints ------------------------------------------------------------------------------------

    def nbytes(self) -> int:
        """Bytes of the arrays allocated (what :func:`frame_buffer_bytes` predicts)."""
        return sum(v.nbytes for v in vars(self).values() if isinstance(v, np.ndarray)) + \
            sum(v.numel() * v.element_size() for v in vars(self).values() if isinstance(v, th.Tensor))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        if self._chunked:
            state["frames"] = None  # the frames travel in chunk files (save_frames / load_frames)
        state["_chunked"] = False
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"frames_on": "host", **state})  # (checkpoints written before frames_on: the host)

    @contextlib.contextmanager
    def frames_in_chunks(self) -> Iterator[None]:
        """Pickle without the frames inside this block (a checkpoint that names its chunk files); elsewhere the
        buffer pickles whole (SB3's ``save_replay_buffer``)."""
        self._chunked = True
        try:
            yield
        finally:
            self._chunked = False

    def save_frames(self, folder: str | os.PathLike) -> list[str]:
        """Write the frames added since the last call to a new chunk file in ``folder`` (atomically); return the
        chunk files (names) that hold the frames the ring holds now, oldest first: what :meth:`load_frames` needs."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        alive_from = max(0, self.frames_written - self.n_frames)
        first = max(self._saved_upto, alive_from)
        if self.frames_written > first:
            name = f"frames-{first:012d}-{self.frames_written:012d}.npy"
            slots = np.arange(first, self.frames_written) % self.n_frames
            tmp = folder / (name + ".tmp")
            try:
                with open(tmp, "wb") as f:
                    _write_npy(f, self._host_frames(slots))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, folder / name)
            except BaseException:  # (a full disk: no torn chunk left behind; the last checkpoint's chunks stand)
                tmp.unlink(missing_ok=True)
                raise
            self._saved_upto = self.frames_written
        return [n for n, (lo, hi) in _chunks(folder) if hi > alive_from and lo < self.frames_written]

    def load_frames(self, folder: str | os.PathLike, chunks: Sequence[str]) -> None:
        """Rebuild the frame ring from the chunk files ``chunks`` in ``folder`` (after unpickling)."""
        folder = Path(folder)
        self.frames = self._empty_frames()  # (where the buffer keeps them: each chunk is copied there)
        alive_from = max(0, self.frames_written - self.n_frames)
        covered = alive_from
        for name in chunks:
            lo, hi = _chunk_range(name)
            path = folder / name
            try:
                data = np.load(path, mmap_mode="r")
            except (OSError, ValueError) as err:
                raise OSError(f"{path}: cannot read this replay chunk ({err})") from err
            if data.shape != (hi - lo, *self.frame_shape):
                raise OSError(f"{path}: holds {data.shape}, expected {(hi - lo, *self.frame_shape)}")
            lo_alive, hi = max(lo, alive_from), min(hi, self.frames_written)  # (a chunk of a killed attempt may
            if lo_alive > covered:  # reach past this buffer's frames: those slots hold live frames)
                break
            if hi > lo_alive:
                slots, frames = np.arange(lo_alive, hi) % self.n_frames, data[lo_alive - lo:hi - lo]
                if isinstance(self.frames, th.Tensor):
                    slots, frames = th.as_tensor(slots, device=self.device), th.as_tensor(np.asarray(frames))
                self.frames[slots] = frames
            covered = max(covered, hi)
        if covered < self.frames_written:
            raise OSError(f"{folder}: the replay chunks cover frames up to {covered}, the buffer needs "
                          f"{alive_from}..{self.frames_written}")


def stacked_samples(buffers: Sequence[FrameReplayBuffer], parts: Sequence[tuple[np.ndarray, ...]],
                    device: th.device | str, gamma: float) -> tuple[th.Tensor, ...]:
    """The samples ``parts`` (:meth:`FrameReplayBuffer.sample_arrays`, one per buffer) of several buffers stacked on
    a member axis and copied to ``device`` once per field (stacks gathered there where the frames are):
    ``(obs (P, N, k*c, H, W), actions (P, N) int64, next obs, rewards (P, N), dones (P, N), discounts (P, N))``,
    discounts ``gamma`` where the buffers take one-step returns."""
    def stacks(i: int) -> th.Tensor:
        got = [buf.stacks(p[i]) for buf, p in zip(buffers, parts)]
        return th.stack(got) if isinstance(got[0], th.Tensor) else th.from_numpy(np.stack(got)).to(device)

    def column(i: int) -> th.Tensor:
        return th.from_numpy(np.stack([p[i][:, 0] for p in parts])).to(device)

    rewards = column(4)
    discounts = column(5) if parts[0][5] is not None else th.full_like(rewards, gamma)
    return stacks(0), column(1).long(), stacks(2), rewards, column(3), discounts


def _write_npy(f: Any, array: np.ndarray) -> None:
    """``np.save(f, array)`` through the file object's own ``write``: a full disk then raises ``OSError`` with its
    errno (``np.save`` writes a real file with C's ``fwrite`` and reports only a short count)."""
    array = np.ascontiguousarray(array)
    np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
    f.write(array.data)


def _chunk_range(name: str) -> tuple[int, int]:
    lo, hi = name.removesuffix(".npy").split("-")[1:]
    return int(lo), int(hi)


def _chunks(folder: Path) -> list[tuple[str, tuple[int, int]]]:
    """The chunk files in ``folder``, oldest first."""
    return sorted(((p.name, _chunk_range(p.name)) for p in folder.glob("frames-*-*.npy")), key=lambda t: t[1])


def prune_chunks(folder: str | os.PathLike, keep: Mapping[str, Any] | Sequence[str]) -> None:
    """Delete the chunk files in ``folder`` not in ``keep`` (after a checkpoint naming ``keep`` is in place)."""
    folder = Path(folder)
    for name, _ in _chunks(folder):
        if name not in keep:
            (folder / name).unlink(missing_ok=True)
    for tmp in folder.glob("*.tmp"):
        tmp.unlink(missing_ok=True)
