"""How Atari's two env paths differ (``atari_env``: ``sb3`` and ``ale-vector``), measured on recorded play.

    python -m agents.rl.bench_atari_envs [--games Amidar,Breakout] [--episodes 10] [--frames 2000] [--seed 0]

Per game:

* **Frames.** The ALE stepped with random actions, four frames per agent step; at each step both paths'
  pre-processing of the same last two frames: SB3's (max-pool of the RGB frames, OpenCV's RGB-to-grey conversion,
  84x84 INTER_AREA) and ale-py's / EnvPool's (max-pool of ALE's grey-palette frames, 84x84 INTER_AREA). Prints
  the share of pixels that differ, their mean absolute difference and the largest one (0-255), over ``--frames``
  agent steps.
* **Returns.** ``--episodes`` whole games (the evaluation envs: no episodic life, raw scores) of uniformly random
  actions on each path, seeded alike: mean score ± standard error and mean length (as each path logs it: SB3's
  ``Monitor`` counts frames, reset no-ops included; ``ale-vector`` counts agent steps). The paths differ
  in their resets (no-op counts and order), their grey frames and where a game is cut (SB3's ``v5`` ids at 108,000
  frames, ``ale-vector`` at 108,000 agent steps), so a random policy's scores estimate the same quantity only where
  no game reaches the cut.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import cv2
import numpy as np
from ale_py import ALEInterface, LoggerMode, roms

from .ale_vector import game_name
from .config import resolve
from .run import build_eval_env

#: the paper's ten Atari games
PAPER_GAMES = ("Amidar", "BattleZone", "Bowling", "DoubleDunk", "Frostbite", "KungFuMaster", "NameThisGame",
               "Phoenix", "Qbert", "Riverraid")


def frame_differences(game: str, steps: int, seed: int) -> dict[str, float]:
    """Both pre-processings of the same frames (module docstring), over ``steps`` agent steps of random play."""
    ALEInterface.setLoggerMode(LoggerMode.Error)
    ale = ALEInterface()
    ale.setFloat("repeat_action_probability", 0.0)
    ale.setInt("random_seed", seed)
    ale.loadROM(roms.get_rom_path(game))
    actions = ale.getMinimalActionSet()
    rng = np.random.default_rng(seed)
    differ, total, largest, pixels = 0, 0.0, 0, 0
    for _ in range(steps):
        a = actions[int(rng.integers(len(actions)))]
        grey, rgb = [], []
        for _ in range(4):
            ale.act(a)
            grey.append(ale.getScreenGrayscale())
            rgb.append(ale.getScreenRGB())
        ours = cv2.resize(np.maximum(grey[-2], grey[-1]), (84, 84), interpolation=cv2.INTER_AREA)
        sb3 = cv2.resize(cv2.cvtColor(np.maximum(rgb[-2], rgb[-1]), cv2.COLOR_RGB2GRAY), (84, 84),
                         interpolation=cv2.INTER_AREA)
        d = np.abs(ours.astype(np.int16) - sb3.astype(np.int16))
        differ += int((d > 0).sum())
        total += float(d.sum())
        largest = max(largest, int(d.max()))
        pixels += d.size
        if ale.game_over():
            ale.reset_game()
    return {"differ": differ / pixels, "mean_abs": total / pixels, "max_abs": largest}


def random_returns(env_id: str, path: str, episodes: int, seed: int) -> tuple[list[float], list[int]]:
    """Scores and lengths of ``episodes`` whole games of random actions on one path's evaluation env."""
    config = resolve("dqn", {"env": env_id, "atari_env": path})
    env = build_eval_env(config, seed)
    rng = np.random.default_rng(seed)
    scores, lengths = [], []
    try:
        env.reset()
        while len(scores) < episodes:
            _, _, dones, infos = env.step(rng.integers(env.action_space.n, size=env.num_envs))
            for done, info in zip(dones, infos):
                if done and "episode" in info:
                    scores.append(float(info["episode"]["r"]))
                    lengths.append(int(info["episode"]["l"]))
    finally:
        env.close()
    return scores, lengths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agents.rl.bench_atari_envs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", default=",".join(PAPER_GAMES), help="comma-separated game names (ALE/<name>-v5)")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--frames", type=int, default=2000, help="agent steps of the frame comparison")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="also print the rows as JSON on stdout")
    args = parser.parse_args(argv)
    rows = []
    for name in [g.strip() for g in args.games.split(",") if g.strip()]:
        env_id = f"ALE/{name}-v5"
        t0 = time.perf_counter()
        row = {"game": name, **frame_differences(game_name(env_id), args.frames, args.seed)}
        for path in ("sb3", "ale-vector"):
            scores, lengths = random_returns(env_id, path, args.episodes, args.seed)
            se = float(np.std(scores, ddof=1) / np.sqrt(len(scores))) if len(scores) > 1 else float("nan")
            row[path] = {"mean": float(np.mean(scores)), "se": se, "length": float(np.mean(lengths))}
        rows.append(row)
        print(f"{name:13s} frames: {100 * row['differ']:5.1f}% of pixels differ, mean |d| {row['mean_abs']:.3f}, "
              f"max {row['max_abs']:3d} | random play: sb3 {row['sb3']['mean']:9.1f} ± {row['sb3']['se']:6.1f} "
              f"({row['sb3']['length']:7.0f} frames), ale-vector {row['ale-vector']['mean']:9.1f} ± "
              f"{row['ale-vector']['se']:6.1f} ({row['ale-vector']['length']:7.0f} steps)  "
              f"[{time.perf_counter() - t0:.0f} s]", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
