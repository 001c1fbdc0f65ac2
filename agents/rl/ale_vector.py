"""Atari games stepped in C++ threads (ale-py's ``AtariVectorEnv``) as the authors' EnvPool steps them, resumable
exactly.

The authors train on EnvPool (``envpool.make_gym(game, stack_num=4, episodic_life=True, reward_clip=True)``, test
envs ``episodic_life=False, reward_clip=False``, every other setting EnvPool's default); :class:`AtariGames` sets
ale-py's vector env to the same pre-processing:

============================  =================================  ==============================================
EnvPool (the authors')        here                               difference
============================  =================================  ==============================================
frame_skip 4, max-pool of     ``frameskip=4, maxpool=True``      none
the last two frames
84x84 grey, INTER_AREA        ``img_height=img_width=84``,       none
                              ``grayscale=True``
stack_num 4, the first        ``stack_num=1`` and a stack kept   none (ale-py's own stack starts with zeros)
frame repeated at a reset     here, the first frame repeated
repeat_action_probability 0   ``repeat_action_probability=0``    none
minimal action set            ``full_action_space=False``        none
episodic_life (training)      a life lost (ale-py's lives test)  EnvPool presses no-ops and FIRE after a lost
                              ends the learner's episode, the    life; here the game goes on at once (the agent
                              game goes on                       fires itself)
reward_clip (training)        raw rewards from C++, their sign   none (the raw score is kept as well)
                              for training
noop_max 30, FIRE reset       ``noop_max=30``,                   EnvPool: 0-29 no-ops then FIRE; ale-py: FIRE
                              ``use_fire_reset=True``            then 0-28 no-ops (its order, not settable)
max_episode_steps 108,000     ``max_num_frames_per_episode``     none
agent steps                   = 4 x 108,000
seed + env index              each env seeded at its first game  EnvPool seeds once; the emulators' streams
                              and again at the first game start  differ either way
                              of every ``reseed_every`` steps
============================  =================================  ==============================================

A seeded start reloads the ROM with a seed drawn from ``(seed, game number)`` (ale-py's ``reset(seed=...)``, about
70 ms); the other games begin as the vector env begins them within the step (a plain reset, ~100x cheaper), from
emulators whose state is a pure function of the last seeded start and the actions taken since. Pickling keeps each
env's actions since its last seeded start and unpickling replays them (at most ``reseed_every`` steps plus one game
per env) to the very emulator state: ale-py's vector env cannot save its emulators' states. Life losses do not
start a new game.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from ale_py.vector_env import AtariVectorEnv, AutoresetMode
from gymnasium import spaces
from stable_baselines3.common.vec_env import VecEnv

__all__ = ["AtariGames", "AtariGamesVecEnv", "GamesStep", "ENVPOOL", "game_name"]

#: the authors' EnvPool settings (EnvPool's defaults and their overrides), which :class:`AtariGames` reproduces
ENVPOOL = {"frame_skip": 4, "img_height": 84, "img_width": 84, "gray_scale": True, "stack_num": 4,
           "noop_max": 30, "use_fire_reset": True, "repeat_action_probability": 0.0, "max_episode_steps": 108_000,
           "episodic_life": {"train": True, "test": False}, "reward_clip": {"train": True, "test": False}}


def game_name(env_id: str) -> str:
    """ale-py's ROM name of a Gymnasium Atari id (its registered ``game``): ``ALE/Breakout-v5`` -> ``breakout``."""
    return str(gym.spec(env_id).kwargs["game"])


@dataclass
class GamesStep:
    """One step of every game: ``obs`` ``(N, 4, 84, 84)`` uint8 (a finished game's next game's first stack);
    ``reward`` ``(N,)`` float32, the sign of the score's change when training, else the change; ``score`` the raw
    change; ``terminated`` a life lost (training) or the game over; ``truncated`` the game stopped at its length
    limit; ``game_over`` a game finished (terminated or truncated) and the next one began; ``final_obs`` where
    ``game_over``, the finished game's last stack; ``returns``/``lengths`` where ``game_over``, its raw score and its
    agent steps."""

    obs: np.ndarray
    reward: np.ndarray
    score: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    game_over: np.ndarray
    final_obs: np.ndarray
    returns: np.ndarray
    lengths: np.ndarray


class AtariGames:
    """``len(seeds)`` games of ``game`` (ale-py's ROM name, :func:`game_name`) with the authors' EnvPool settings
    (module docstring): ``train`` (a lost life ends the learner's episode, rewards clipped to their sign) or not;
    env ``i``'s first game, and its first game to begin at or after each multiple of ``reseed_every`` steps, start
    from a seed drawn from ``(seeds[i], game number)`` (module docstring). ``num_threads`` C++ threads step them
    (0: one per env, at most the machine's cores)."""

    def __init__(self, game: str, seeds: Sequence[int], *, train: bool, max_episode_steps: int = 108_000,
                 noop_max: int = 30, num_threads: int = 0, reseed_every: int = 10_000) -> None:
        self.game, self.train, self.num_threads = game, bool(train), int(num_threads)
        self.max_episode_steps, self.noop_max = int(max_episode_steps), int(noop_max)
        self.reseed_every, self.steps = int(reseed_every), 0  # (steps: of every env, in lockstep)
        self.seeds = np.asarray(seeds, dtype=np.int64)
        self.n = len(self.seeds)
        if self.seeds.ndim != 1 or self.n < 1:
            raise ValueError(f"AtariGames needs a list of at least one seed (one per env), got {seeds!r}")
        if self.reseed_every < 1:
            raise ValueError(f"reseed_every must be at least 1 step, got {reseed_every!r}")
        self.games = np.zeros(self.n, dtype=np.int64)  # games started per env
        self.seeded_game = np.zeros(self.n, dtype=np.int64)  # the number of each env's last seeded game
        self.seeded_window = np.zeros(self.n, dtype=np.int64)  # steps // reseed_every at each env's last seeded start
        self.history: list[bytearray] = [bytearray() for _ in range(self.n)]  # actions since the last seeded start
        self.score = np.zeros(self.n, dtype=np.int64)
        self.length = np.zeros(self.n, dtype=np.int64)
        self._open()
        self._start(np.ones(self.n, dtype=bool))

    def _open(self) -> None:
        self.env = AtariVectorEnv(
            self.game, self.n, num_threads=self.num_threads, batch_size=0, frameskip=4, maxpool=True, img_height=84,
            img_width=84, grayscale=True, stack_num=1, noop_max=self.noop_max, use_fire_reset=True,
            repeat_action_probability=0.0, full_action_space=False, episodic_life=False,
            life_loss_info=False, reward_clipping=False, max_num_frames_per_episode=4 * self.max_episode_steps,
            autoreset_mode=AutoresetMode.SAME_STEP)
        self.n_actions = int(self.env.single_action_space.n)
        self._stack = np.zeros((self.n, 4, 84, 84), dtype=np.uint8)
        self._lives = np.zeros(self.n, dtype=np.int32)
        self.reset_frames = np.zeros(self.n, dtype=np.int64)  # frames each current game's reset took (FIRE, no-ops)

    def game_seed(self, i: int) -> int:
        """The emulator seed of env ``i``'s current game (a function of its seed and the game's number)."""
        return int(np.random.SeedSequence([int(self.seeds[i]), int(self.games[i])]).generate_state(1)[0] >> 1)

    def observation(self) -> np.ndarray:
        """The current stacks ``(N, 4, 84, 84)`` uint8, oldest frame first."""
        return self._stack.copy()

    def _start(self, mask: np.ndarray, count: bool = True) -> None:
        """Start a new game in the envs of ``mask`` (each from its game seed)."""
        if count:
            self.games[mask] += 1
            self.seeded_game[mask] = self.games[mask]
            self.seeded_window[mask] = self.steps // self.reseed_every
            for i in np.flatnonzero(mask):
                self.history[i] = bytearray()
        seeds = np.array([self.game_seed(i) for i in np.flatnonzero(mask)], dtype=np.int64)
        # (a partial reset needs a whole one before it: the constructor's and a replay's first are whole)
        obs, info = self.env.reset(seed=seeds) if mask.all() else \
            self.env.reset(seed=seeds, options={"reset_mask": mask})
        self._stack[mask] = obs[mask][:, -1:]  # the first frame, four times
        self._lives[mask] = info["lives"][mask]
        self.reset_frames[mask] = info["episode_frame_number"][mask]
        self.score[mask], self.length[mask] = 0, 0

    def _advance(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Step every env once: (raw score change, terminated, truncated, game over). A finished game's next one
        began within the step (the vector env's plain reset): the stack shows the finished game's last frame, and
        :meth:`_begin` turns to the next one."""
        obs, score, game_over, truncated, info = self.env.step(actions.astype(np.int32))
        over = game_over | truncated
        lives = info["lives"]  # (a finished game's: the next game's; a life lost, as ale-py's own test)
        life_lost = ~over & (lives > 0) & (lives < self._lives) if self.train else np.zeros(self.n, dtype=bool)
        self._stack[:, :-1] = self._stack[:, 1:]
        self._stack[:, -1] = np.where(over[:, None, None], info["final_obs"][:, -1], obs[:, -1]) if over.any() \
            else obs[:, -1]
        self._lives = lives
        self._next = obs[:, -1], info["episode_frame_number"]
        return score.astype(np.int64), game_over | life_lost, truncated & ~game_over, over

    def _begin(self, mask: np.ndarray) -> None:
        """Turn the envs of ``mask`` to the game the vector env began within the last step."""
        first, frames = self._next
        self._stack[mask] = first[mask][:, None]  # the first frame, four times
        self.reset_frames[mask] = frames[mask]
        self.score[mask], self.length[mask] = 0, 0

    def step(self, actions: np.ndarray) -> GamesStep:
        """Step every game with ``actions`` ``(N,)`` (indices into the minimal action set); finished games are
        followed by the next ones at once."""
        actions = np.asarray(actions)
        if actions.shape != (self.n,) or not np.issubdtype(actions.dtype, np.integer) or \
                actions.min() < 0 or actions.max() >= self.n_actions:
            raise ValueError(f"actions must be {self.n} integers in [0, {self.n_actions}) (one per game), got "
                             f"{actions.tolist() if actions.size <= 8 else actions.shape}")
        for i, a in enumerate(actions.tolist()):
            self.history[i].append(a)
        score, terminated, truncated, over = self._advance(actions)
        self.steps += 1
        self.score += score
        self.length += 1
        final = self._stack.copy()
        returns, lengths = np.where(over, self.score, 0), np.where(over, self.length, 0)
        if over.any():
            reseed = over & (self.steps // self.reseed_every > self.seeded_window)
            self.games[over & ~reseed] += 1
            self._begin(over & ~reseed)
            if reseed.any():
                self._start(reseed)
        reward = (np.sign(score) if self.train else score).astype(np.float32)
        return GamesStep(self.observation(), reward, score, terminated, truncated, over, final, returns, lengths)

    def close(self) -> None:
        self.env.close()

    # --- pickling: the seeds and the actions of each current game, replayed ------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()
                if k not in ("env", "_stack", "_lives", "_next", "reset_frames")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open()
        self._replay()

    def _replay(self) -> None:
        """Bring every env to where it stands: restarted from its last seeded start, its actions since replayed (the
        games that began within them begin again within the same steps), all envs in lockstep (an env with fewer
        actions starts later, stepping no-ops before)."""
        lengths = [len(h) for h in self.history]
        total = max(lengths)
        begin = np.array([total - n for n in lengths])
        score, length, seeded_window = self.score.copy(), self.length.copy(), self.seeded_window.copy()
        games = self.games.copy()
        self.games = self.seeded_game.copy()  # (the seeded games' seeds)
        self._start(np.ones(self.n, dtype=bool), count=False)
        for t in range(total):
            due = (begin == t) & (t > 0)
            if due.any():
                self._start(due, count=False)
            actions = np.array([h[t - b] if t >= b else 0 for h, b in zip(self.history, begin)], dtype=np.int32)
            over = self._advance(actions)[3]
            if (began := over & (t >= begin)).any():
                self._begin(began)
        idle = (begin == total) & (total > 0)  # envs seeded at the last step: no actions to replay
        if idle.any():
            self._start(idle, count=False)
        self.score, self.length, self.seeded_window, self.games = score, length, seeded_window, games


class AtariGamesVecEnv(VecEnv):
    """:class:`AtariGames` as an SB3 ``VecEnv``: observations ``(N, 4, 84, 84)`` uint8 (channel-first), ``dones`` at
    a lost life (training) and at a game's end, each with ``infos[i]["terminal_observation"]`` (a lost life: the
    stack the game goes on from) and ``"TimeLimit.truncated"``; at a game's end ``infos[i]["episode"]`` holds its raw
    score and length as SB3's ``Monitor`` gives them (``r``, ``l``, ``t``). Pickles as :class:`AtariGames` does."""

    render_mode = None

    def __init__(self, games: AtariGames) -> None:
        self.games = games
        super().__init__(games.n, spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(games.n_actions))
        self._actions: np.ndarray | None = None
        self._began = time.time()

    def reset(self) -> np.ndarray:
        """The current stacks (the games run on from where they are: each started at its seed already)."""
        return self.games.observation()

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions).reshape(self.num_envs)

    def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        s = self.games.step(self._actions)
        dones = s.terminated | s.truncated
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        for i in np.flatnonzero(dones):
            infos[i]["terminal_observation"] = s.final_obs[i] if s.game_over[i] else s.obs[i]
            infos[i]["TimeLimit.truncated"] = bool(s.truncated[i] and not s.terminated[i])
            if s.game_over[i]:
                infos[i]["episode"] = {"r": float(s.returns[i]), "l": int(s.lengths[i]),
                                       "t": round(time.time() - self._began, 6)}
        return s.obs, s.reward, dones, infos

    def close(self) -> None:
        self.games.close()

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        return [getattr(self, attr_name)] * len(self._indices(indices))

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        setattr(self, attr_name, value)

    def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
        raise AttributeError(f"the games of AtariGamesVecEnv have no method {method_name!r} of their own")

    def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
        return [False] * len(self._indices(indices))

    def _indices(self, indices: Any) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        return [indices] if isinstance(indices, int) else list(indices)
