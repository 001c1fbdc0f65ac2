"""Memory and speed of the frame buffer against SB3's buffer at Atari's 84x84x4, measured in one process.

    python -m agents.rl.bench_replay [--env ALE/Breakout-v5] [--transitions 50000] [--record 2000]

Records ``--record`` transitions of the game with random actions (the training wrappers: episodic life, frame
stack), then fills each buffer (``FrameReplayBuffer`` and SB3's ``NStepReplayBuffer``, n = 3, capacity
``--transitions``) with them, cyclically, until it is full. Reports per buffer: the resident memory the fill added
(``/proc/self/statm``, pages actually touched) per transition, its projection to 1e6 transitions, the allocation
(``nbytes``), and the time of ``add`` and of ``sample(32)``; then the ratios of SB3's buffer to the frame buffer.
Also env steps/s of the recording (the Atari wrappers alone, random actions).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import numpy as np
from stable_baselines3.common.buffers import NStepReplayBuffer
from stable_baselines3.common.vec_env import VecTransposeImage

from .budget import fmt_bytes, rss
from .envs import make_env
from .frame_buffer import FrameReplayBuffer


def record(env_id: str, steps: int, seed: int = 0) -> tuple[list[tuple], float, object, object]:
    """Transitions as SB3's loop stores them, env steps/s, observation and action spaces."""
    env = VecTransposeImage(make_env(env_id, seed=seed))
    env.action_space.seed(seed)
    obs, out = env.reset(), []
    t0 = time.perf_counter()
    for _ in range(steps):
        action = np.array([env.action_space.sample()])
        new, reward, done, infos = env.step(action)
        nxt = new.copy()
        if done[0]:
            nxt[0] = infos[0]["terminal_observation"]
        out.append((obs, nxt, action, reward, done, infos))
        obs = new
    rate = steps / (time.perf_counter() - t0)
    spaces = env.observation_space, env.action_space
    env.close()
    return out, rate, *spaces


def measure(cls: type, transitions: list[tuple], capacity: int, obs_space, act_space) -> dict[str, float]:
    gc.collect()
    before = rss()
    buf = cls(capacity, obs_space, act_space, device="cpu", n_steps=3, gamma=0.99)
    t0 = time.perf_counter()
    for i in range(capacity):
        buf.add(*transitions[i % len(transitions)])
    add_s = (time.perf_counter() - t0) / capacity
    added = rss() - before
    np.random.seed(0)
    t0 = time.perf_counter()
    for _ in range(200):
        buf.sample(32)
    sample_s = (time.perf_counter() - t0) / 200
    nbytes = sum(v.nbytes for v in vars(buf).values() if isinstance(v, np.ndarray))
    del buf
    gc.collect()
    return {"bytes_per_transition": added / capacity, "projected_1e6_bytes": added / capacity * 1e6,
            "allocated_bytes": nbytes, "add_us": add_s * 1e6, "sample32_ms": sample_s * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.rl.bench_replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="ALE/Breakout-v5")
    parser.add_argument("--transitions", type=int, default=50_000, help="buffer capacity, filled once")
    parser.add_argument("--record", type=int, default=2000, help="env steps recorded (replayed cyclically)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    transitions, rate, obs_space, act_space = record(args.env, args.record)
    result = {"env": args.env, "transitions": args.transitions, "env_steps_per_second": rate}
    for cls in (FrameReplayBuffer, NStepReplayBuffer):
        result[cls.__name__] = measure(cls, transitions, args.transitions, obs_space, act_space)
    frames, full = result["FrameReplayBuffer"], result["NStepReplayBuffer"]
    result["ratios_sb3_to_frames"] = {k: full[k] / frames[k] for k in ("bytes_per_transition", "add_us",
                                                                       "sample32_ms")}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{args.env}: {rate:,.0f} env steps/s (Atari wrappers, random actions)")
    for name in ("FrameReplayBuffer", "NStepReplayBuffer"):
        r = result[name]
        print(f"{name:18s} {r['bytes_per_transition']:9,.0f} B/transition measured -> {fmt_bytes(r['projected_1e6_bytes'])}"
              f" at 1e6; add {r['add_us']:6.1f} us, sample(32) {r['sample32_ms']:5.2f} ms")
    ratios = result["ratios_sb3_to_frames"]
    print(f"SB3's buffer / frame buffer: memory {ratios['bytes_per_transition']:.1f}x, add {ratios['add_us']:.2f}x, "
          f"sample {ratios['sample32_ms']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
