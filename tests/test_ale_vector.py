"""Atari on ale-py's C++ vector env with the authors' EnvPool settings (agents.rl.ale_vector): each frame, reward,
life and game end equals its definition computed from the emulator itself (the slow twin below: the ALE stepped
frame by frame, the last two frames max-pooled, resized with OpenCV's INTER_AREA, stacked with the first frame
repeated), in training and test mode; a pickled set of games resumes to the very emulator states."""

from __future__ import annotations

import pickle

import cv2
import numpy as np
import pytest
from ale_py import Action, ALEInterface, roms

from agents.rl.ale_vector import ENVPOOL, AtariGames, game_name

class _Reference:
    """One game of the definition: the ALE stepped frame by frame, as ale-py's C++ documents it (the last two frames
    of a skip max-pooled, into a buffer that keeps them where a game over cuts the skip short)."""

    def __init__(self, game: str, train: bool) -> None:
        self.game, self.train = game, train
        self.ale = ALEInterface()
        self.ale.setFloat("repeat_action_probability", 0.0)
        self.ale.loadROM(roms.get_rom_path(game))
        self.actions = self.ale.getMinimalActionSet()

    def start(self, seed: int | None, frames: int) -> None:
        """The next game: from ``seed`` the ROM reloaded with it (else the emulator goes on), then the reset's
        ``frames`` (FIRE, then no-ops)."""
        if seed is not None:
            self.ale.setInt("random_seed", seed)
            self.ale.loadROM(roms.get_rom_path(self.game))
        self.ale.reset_game()
        fire = Action.FIRE in self.actions
        for k in range(frames):
            self.ale.act(Action.FIRE if fire and k == 0 else Action.NOOP)
        self.raw = [self.ale.getScreenGrayscale(), np.zeros_like(self.ale.getScreenGrayscale())]
        self.stack = [self._frame()] * 4
        self.lives = self.ale.lives()

    def _frame(self) -> np.ndarray:
        self.raw[0] = np.maximum(self.raw[0], self.raw[1])
        return cv2.resize(self.raw[0], (84, 84), interpolation=cv2.INTER_AREA)

    def step(self, a: int) -> tuple[int, bool, bool]:
        """(raw score change, terminated, game over) after four frames of action ``a``."""
        raw = 0
        for skip in range(4, 0, -1):
            raw += self.ale.act(self.actions[a])
            if self.ale.game_over():
                break
            if skip <= 2:
                self.raw[skip - 1] = self.ale.getScreenGrayscale()
        self.stack = [*self.stack[1:], self._frame()]
        lives = self.ale.lives()
        life_lost = self.train and 0 < lives < self.lives
        self.lives = lives
        over = self.ale.game_over()
        return raw, over or life_lost, over


@pytest.mark.parametrize("game, train, steps, ends", [("breakout", True, 700, 2), ("breakout", False, 700, 2),
                                                     ("freeway", True, 300, 0)])  # (Freeway: no FIRE, no lives)
def test_each_step_is_its_definition_from_the_emulator(game, train, steps, ends):
    """Games seeded at their env's first game and at the first game of each 250 steps (the ROM reloaded), the other
    games begun by a plain reset of the emulator as it stands."""
    games = AtariGames(game, [3, 4], train=train, num_threads=1, reseed_every=250)
    refs = [_Reference(game, train) for _ in range(2)]
    began = {"seeded": 0, "plain": 0}

    def start(i: int) -> None:
        seeded = games.seeded_game[i] == games.games[i]
        began["seeded" if seeded else "plain"] += 1
        refs[i].start(games.game_seed(i) if seeded else None, int(games.reset_frames[i]))

    for i in range(2):
        start(i)
    assert np.array_equal(games.observation(), np.stack([np.stack(r.stack) for r in refs]))
    rng = np.random.default_rng(0)
    over_seen = 0
    for t in range(steps):
        actions = rng.integers(0, games.n_actions, size=2)
        step = games.step(actions)
        for i, r in enumerate(refs):
            raw, terminated, over = r.step(int(actions[i]))
            assert step.score[i] == raw and step.terminated[i] == terminated and step.game_over[i] == over, (t, i)
            assert step.reward[i] == (np.sign(raw) if train else raw)
            if over:
                assert np.array_equal(step.final_obs[i], np.stack(r.stack)), (t, i)
                start(i)
                over_seen += 1
            assert np.array_equal(step.obs[i], np.stack(r.stack)), (t, i)
    assert over_seen >= ends
    if ends:
        assert began["seeded"] > 2 and began["plain"] > 0, began


@pytest.mark.parametrize("reseed_every", [10_000, 200])
def test_pickled_games_resume_to_the_same_emulators(reseed_every):
    """Replayed from the first games (several games since) or from later seeded starts."""
    games = AtariGames("breakout", [0, 1, 2], train=True, num_threads=1, reseed_every=reseed_every)
    rng = np.random.default_rng(1)
    for _ in range(450):  # past some games' ends
        games.step(rng.integers(0, games.n_actions, size=3))
    assert (games.games > 1).any() and (games.seeded_game > 1).any() == (reseed_every < 450)
    copy = pickle.loads(pickle.dumps(games))
    assert np.array_equal(copy.observation(), games.observation())
    for _ in range(300):
        actions = rng.integers(0, games.n_actions, size=3)
        a, b = games.step(actions), copy.step(actions)
        for field in ("obs", "reward", "score", "terminated", "truncated", "game_over", "returns", "lengths"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), field


def test_games_pickled_as_one_of_them_begins_resume_to_the_same_emulators():
    """A checkpoint right after one env's game was seeded (no actions since) while another is mid-game."""
    games = AtariGames("breakout", [0, 1], train=False, num_threads=1, reseed_every=1)
    rng = np.random.default_rng(2)
    for _ in range(3000):
        games.step(rng.integers(0, games.n_actions, size=2))
        lengths = [len(h) for h in games.history]
        if min(lengths) == 0 < max(lengths):
            break
    assert min(lengths) == 0 < max(lengths)
    copy = pickle.loads(pickle.dumps(games))
    assert np.array_equal(copy.observation(), games.observation())
    for _ in range(200):
        actions = rng.integers(0, games.n_actions, size=2)
        a, b = games.step(actions), copy.step(actions)
        assert np.array_equal(a.obs, b.obs) and np.array_equal(a.score, b.score)


def test_bad_actions_and_seeds_are_refused_in_one_line():
    games = AtariGames("breakout", [0, 1], train=True, num_threads=1)
    for bad in ([0], [0, 4], [0, -1], [0.5, 1.0]):
        with pytest.raises(ValueError, match=r"actions must be 2 integers in \[0, 4\) \(one per game\)"):
            games.step(np.array(bad))
    with pytest.raises(ValueError, match="needs a list of at least one seed"):
        AtariGames("breakout", [], train=True)
    with pytest.raises(ValueError, match="reseed_every must be at least 1 step, got 0"):
        AtariGames("breakout", [0], train=True, reseed_every=0)


def test_the_settings_are_the_authors_envpool_settings():
    assert ENVPOOL["max_episode_steps"] == 108_000 and ENVPOOL["noop_max"] == 30
    games = AtariGames("breakout", [0], train=True, num_threads=1, max_episode_steps=5)
    ends = [games.step(np.array([0])) for _ in range(5)]
    assert [bool(s.truncated[0]) for s in ends] == [False] * 4 + [True]  # 5 agent steps = 20 frames
    assert [game_name(e) for e in ("ALE/Breakout-v5", "ALE/KungFuMaster-v5", "NameThisGameNoFrameskip-v4",
                                   "ALE/TicTacToe3D-v5")] == ["breakout", "kung_fu_master", "name_this_game",
                                                              "tic_tac_toe_3d"]
