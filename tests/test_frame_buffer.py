"""The frame-deduplicated replay buffer against its slow twins: SB3's ReplayBuffer / NStepReplayBuffer holding whole
stacks, fed the same transitions (recorded Atari episodes with life losses, game overs and truncations, and
hypothesis-generated streams), sampled at the same indices with the same random state."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from stable_baselines3.common.buffers import NStepReplayBuffer, ReplayBuffer
from stable_baselines3.common.vec_env import VecTransposeImage

from agents.rl.envs import make_env
from agents.rl.frame_buffer import FrameReplayBuffer, frame_buffer_bytes
from agents.rl.rainbow import PrioritizedFrameReplayBuffer, PrioritizedReplayBuffer

ATARI = "ALE/Breakout-v5"


def record(env_id: str, steps: int, n_envs: int = 1, seed: int = 0, max_episode_steps: int | None = None) -> dict:
    """Transitions as SB3's off-policy loop stores them (terminal observations as next observations), random
    actions; ``seen``: the observations the agent was shown, in order."""
    env = VecTransposeImage(make_env(env_id, n_envs=n_envs, seed=seed, max_episode_steps=max_episode_steps))
    env.action_space.seed(seed)
    obs = env.reset()
    out = []
    for _ in range(steps):
        action = np.array([env.action_space.sample() for _ in range(n_envs)])
        new_obs, reward, done, infos = env.step(action)
        next_obs = new_obs.copy()
        for i, d in enumerate(done):
            if d:
                next_obs[i] = infos[i]["terminal_observation"]
        out.append((obs.copy(), next_obs, action, reward, done, infos))
        obs = new_obs
    env.close()
    return {"transitions": out, "space": env.observation_space, "actions": env.action_space}


@pytest.fixture(scope="module")
def breakout() -> dict:
    return record(ATARI, 700, max_episode_steps=600)  # lives lost, a game over, truncations (600 frames = 150 steps)


@pytest.fixture(scope="module")
def breakout2() -> dict:
    return record(ATARI, 300, n_envs=2, seed=1, max_episode_steps=400)


def fill(rec: dict, size: int, n_steps: int, n_envs: int = 1, prioritized: bool = False, **frame_kwargs):
    """The frame buffer and its naive twin, fed ``rec``."""
    kwargs = dict(n_envs=n_envs, device="cpu")
    if prioritized:
        fast = PrioritizedFrameReplayBuffer(size, rec["space"], rec["actions"], n_steps=n_steps, **kwargs,
                                            **frame_kwargs)
        slow = PrioritizedReplayBuffer(size, rec["space"], rec["actions"], n_steps=n_steps, **kwargs)
    else:
        fast = FrameReplayBuffer(size, rec["space"], rec["actions"], n_steps=n_steps, **kwargs, **frame_kwargs)
        slow = (NStepReplayBuffer(size, rec["space"], rec["actions"], n_steps=n_steps, **kwargs) if n_steps > 1
                else ReplayBuffer(size, rec["space"], rec["actions"], **kwargs))
    for t in rec["transitions"]:
        fast.add(*t)
        slow.add(*t)
    return fast, slow


def samples_equal(fast, slow, index: np.ndarray, seed: int = 0) -> None:
    np.random.seed(seed)
    a = fast._get_samples(index)
    np.random.seed(seed)
    b = slow._get_samples(index)
    for name in a._fields:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape, name
            assert torch.equal(x, y), f"{name} differs"


def test_recording_has_what_the_buffer_must_handle(breakout):
    dones = [bool(t[4][0]) for t in breakout["transitions"]]
    truncated = [t[5][0].get("TimeLimit.truncated", False) for t in breakout["transitions"]]
    lives = [t[5][0].get("lives") for t in breakout["transitions"]]
    assert sum(dones) >= 5 and any(truncated) and any(d and not tr for d, tr in zip(dones, truncated))
    assert len(set(lives)) > 1  # life losses (episodic life: each one a done)


@pytest.mark.parametrize("frames_on", ["host", "device"])  # (the device: torch's ring on the buffer's device)
@pytest.mark.parametrize("n_steps", [1, 3])
@pytest.mark.parametrize("size", [100, 1000])  # wrapped many times over / never full
def test_samples_equal_naive_buffer_on_atari(breakout, n_steps, size, frames_on):
    fast, slow = fill(breakout, size, n_steps, frame_slack=0.5, frames_on=frames_on)  # (lives of ~30 steps: 5 %
    assert isinstance(fast.frames, torch.Tensor) == (frames_on == "device")  # slack evicts at 100)
    assert fast.size() == slow.size() and fast.pos == slow.pos and fast.full == slow.full and fast.evicted == 0
    rows = np.arange(fast.size())
    samples_equal(fast, slow, rows)
    samples_equal(fast, slow, np.random.default_rng(0).integers(0, fast.size(), 64), seed=3)
    np.random.seed(5)
    a = fast.sample(32)
    np.random.seed(5)
    b = slow.sample(32)
    assert torch.equal(a.observations, b.observations) and torch.equal(a.rewards, b.rewards)


@pytest.mark.parametrize("n_steps", [1, 3])
def test_samples_equal_naive_buffer_two_envs(breakout2, n_steps):
    fast, slow = fill(breakout2, 120, n_steps, n_envs=2)
    for seed in range(4):
        samples_equal(fast, slow, np.arange(fast.size()), seed=seed)


def test_stacks_are_what_the_agent_saw(breakout):
    fast, _ = fill(breakout, 1000, 3)
    seen = np.stack([t[0][0] for t in breakout["transitions"]])
    assert np.array_equal(fast.stacks(fast.obs_head[: len(seen), 0]), seen)
    starts = [i for i, t in enumerate(breakout["transitions"][:-1]) if t[4][0]]
    first = seen[starts[0] + 1]  # an episode's first stack: VecFrameStack's zero padding, kept as it was
    assert not first[:3].any() and first[3].any()


@pytest.mark.parametrize("frames_on", ["host", "device"])
def test_prioritized_frame_buffer_draws_as_the_full_one(breakout, frames_on):
    fast, slow = fill(breakout, 200, 3, prioritized=True, frames_on=frames_on)
    rng = np.random.default_rng(0)
    for step in range(5):
        np.random.seed(step)
        a, slots_a, w_a = fast.sample_prioritized(32, 0.4)
        np.random.seed(step)
        b, slots_b, w_b = slow.sample_prioritized(32, 0.4)
        assert np.array_equal(slots_a, slots_b) and np.array_equal(w_a, w_b)
        assert torch.equal(a.observations, b.observations) and torch.equal(a.next_observations, b.next_observations)
        losses = rng.random(32)
        fast.update_priorities(slots_a, losses)
        slow.update_priorities(slots_b, losses)


def test_bytes_per_transition_at_atari_scale():
    space = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    buf = FrameReplayBuffer(1000, space, spaces.Discrete(18), device="cpu")
    assert buf.nbytes() == frame_buffer_bytes(1000, space, spaces.Discrete(18))
    per = frame_buffer_bytes(10 ** 6, space, spaces.Discrete(18)) / 10 ** 6
    assert per < 8000  # 1e6 transitions in < 8 GB (SB3's ReplayBuffer: 2 x 28,224 B of observations each)
    with pytest.raises(ValueError, match="channel-first Box"):
        FrameReplayBuffer(10, spaces.Box(0, 1, (4,)), spaces.Discrete(2))
    with pytest.raises(ValueError, match="does not divide"):
        FrameReplayBuffer(10, space, spaces.Discrete(2), frame_stack=3)


@pytest.mark.parametrize("frames_on", ["host", "device"])
def test_checkpoint_chunks_round_trip(breakout, tmp_path, frames_on):
    transitions = breakout["transitions"]
    fast = FrameReplayBuffer(150, breakout["space"], breakout["actions"], n_steps=3, device="cpu", frames_on=frames_on)
    for t in transitions[:300]:
        fast.add(*t)
    first = fast.save_frames(tmp_path)
    for t in transitions[300:360]:
        fast.add(*t)
    chunks = fast.save_frames(tmp_path)
    sizes = [np.load(tmp_path / name, mmap_mode="r").shape[0] for name in chunks]
    assert sizes[-1] <= 61 + 4 * 3  # the second checkpoint wrote the frames added since the first, not the ring
    for t in transitions[360:520]:
        fast.add(*t)
    chunks = fast.save_frames(tmp_path)
    assert first[0] not in chunks  # a chunk of overwritten frames is no longer needed
    with fast.frames_in_chunks():
        blob = pickle.dumps(fast)
    copy = pickle.loads(blob)
    assert copy.frames is None and len(blob) < fast.frames.nbytes
    with pytest.raises(RuntimeError, match="load_frames first"):
        copy.sample(4)
    copy.load_frames(tmp_path, chunks)
    assert isinstance(copy.frames, torch.Tensor) == (frames_on == "device")
    samples_equal(copy, fast, np.arange(fast.size()))
    copy.place_frames("host" if frames_on == "device" else "device")  # (a resume may place them elsewhere)
    samples_equal(copy, fast, np.arange(fast.size()))
    whole = pickle.loads(pickle.dumps(fast))  # pickled elsewhere (SB3's save_replay_buffer): frames included
    samples_equal(whole, fast, np.arange(fast.size()))
    (tmp_path / chunks[-1]).unlink()
    with pytest.raises(OSError, match="cannot read|cover"):
        copy.load_frames(tmp_path, chunks)


def test_a_chunk_of_a_killed_attempt_does_not_overwrite_live_frames(breakout, tmp_path):
    """An attempt resumed from a checkpoint, killed after writing a chunk but before its checkpoint landed, leaves a
    chunk reaching past the checkpoint's frames. The next attempt, resumed from the same checkpoint, checkpoints at
    fewer frames (a stop signal, another interval): its listing skips chunks that begin past its frames, and loading
    clips the stale chunk to its frames, so the ring's wrapped slots keep their live frames."""
    transitions = breakout["transitions"]
    buf = FrameReplayBuffer(150, breakout["space"], breakout["actions"], n_steps=3, device="cpu")
    for t in transitions[:200]:
        buf.add(*t)
    buf.save_frames(tmp_path)
    with buf.frames_in_chunks():
        checkpoint = pickle.dumps(buf)
    killed = pickle.loads(checkpoint)
    killed.load_frames(tmp_path, killed.save_frames(tmp_path))
    for t in transitions[200:320]:  # (less than a ring: its chunk begins where the checkpoint ends)
        killed.add(*t)
    killed.save_frames(tmp_path)  # ... and its checkpoint never landed
    resumed = pickle.loads(checkpoint)
    resumed.load_frames(tmp_path, resumed.save_frames(tmp_path))
    for t in transitions[200:260]:
        resumed.add(*t)
    chunks = resumed.save_frames(tmp_path)
    with resumed.frames_in_chunks():
        again = pickle.loads(pickle.dumps(resumed))
    again.load_frames(tmp_path, chunks)
    uninterrupted = FrameReplayBuffer(150, breakout["space"], breakout["actions"], n_steps=3, device="cpu")
    for t in transitions[:260]:
        uninterrupted.add(*t)
    for buf in (resumed, again):
        samples_equal(buf, uninterrupted, np.arange(uninterrupted.size()))


# --- generated streams: every continuation case, short episodes, evictions --------------------------------------

K = 3  # frames per stack; frames 1x2x2 with values 0..3 (many all-zero frames)


def stream(draw_ops: list[tuple[int, bool, bool, bool]]) -> list[tuple]:
    """Transitions of a frame-stacking agent from ``(frame value seed, done, truncated, break)`` steps: a stack
    zero-padded at each episode start (as VecFrameStack), ``break`` restarts the stack without a done (an
    observation that does not continue the previous next observation)."""
    rng = np.random.default_rng(len(draw_ops))
    frame = lambda: rng.integers(0, 4, (1, 2, 2), dtype=np.uint8) * (rng.random() < 0.8)  # noqa: E731
    stack = np.zeros((K, 2, 2), np.uint8)
    stack[-1] = frame()
    out = []
    for value, done, truncated, brk in draw_ops:
        if brk:
            stack = rng.integers(0, 4, (K, 2, 2), dtype=np.uint8)
        nxt = np.concatenate([stack[1:], frame()])
        infos = [{"TimeLimit.truncated": done and truncated}]
        out.append((stack[None].copy(), nxt[None].copy(), np.array([value % 2]), np.array([value * 0.5], np.float32),
                    np.array([done]), infos))
        stack = nxt
        if done:
            stack = np.zeros((K, 2, 2), np.uint8)
            stack[-1] = frame()
    return out


ops = st.lists(st.tuples(st.integers(0, 7), st.booleans(), st.booleans(),
                         st.integers(0, 9).map(lambda v: v == 0)), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(ops=ops, size=st.integers(1, 25), n_steps=st.integers(1, 4), slack=st.sampled_from([0.0, 0.05, 1.0]),
       frames_on=st.sampled_from(["host", "device"]))
def test_generated_streams_equal_naive(ops, size, n_steps, slack, frames_on):
    rec = {"transitions": stream(ops), "space": spaces.Box(0, 255, (K, 2, 2), np.uint8),
           "actions": spaces.Discrete(2)}
    fast, slow = fill(rec, size, n_steps, frame_slack=slack, frames_on=frames_on)
    valid = fast.rows(np.arange(fast.size()))
    samples_equal(fast, slow, valid)
    seen = np.stack([t[0][0] for t in rec["transitions"]])
    serials = np.arange(fast.rows_written - fast.size(), fast.rows_written)
    assert np.array_equal(np.asarray(fast.stacks(fast.obs_head[serials % fast.buffer_size, 0])), seen[serials])


def test_short_episodes_evict_oldest_rows_and_never_sample_them():
    ops = [(i, i % 2 == 1, False, i % 3 == 0) for i in range(200)]  # episodes of 2 steps, stacks that break
    rec = {"transitions": stream(ops), "space": spaces.Box(0, 255, (K, 2, 2), np.uint8),
           "actions": spaces.Discrete(2)}
    fast, slow = fill(rec, 50, 3, prioritized=True, frame_slack=0.0)
    assert fast.evicted > 0 and fast.size() < 50
    valid = set(fast.rows(np.arange(fast.size())).tolist())
    np.random.seed(0)
    _, slots, _ = fast.sample_prioritized(256, 0.5)
    assert set(slots.tolist()) <= valid
    np.random.seed(0)
    assert fast.sample(64).observations.shape == (64, K, 2, 2)
