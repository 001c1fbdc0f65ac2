"""Environments for the RL commands: Gymnasium ids, the PLE ports, MinAtar games and ALE Atari games.

* Gymnasium ids (``MountainCar-v0``, ``CartPole-v1``, ...) and the PLE ports (``Catcher-PLE-v0``,
  ``Pixelcopter-PLE-v0``, registered by :mod:`agents.envs`) are wrapped in SB3's ``Monitor``; ``max_episode_steps``
  replaces the registered time limit.
* MinAtar ids (``MinAtar/Breakout-v1``, ``MinAtar/SpaceInvaders-v1``, ...; the ``minatar`` extra): 10x10 games with
  boolean channel-last observations ``(10, 10, C)``, sticky actions (probability 0.1) and difficulty ramping on (the
  package's defaults, settable with ``env_kwargs``); ``-v1`` ids use the game's minimal action set, ``-v0`` all 6.
  No time limit unless ``max_episode_steps`` sets one. Registered here from the package's own registration.
* ALE ids (``ALE/Amidar-v5``, ``AmidarNoFrameskip-v4``, ...) use ale-py's bundled ROMs and SB3's Atari pre-processing
  (``AtariWrapper``: no-op reset, frame skip 4 with max-pooling, 84x84 grey frames, life loss as episode end,
  reward clipping; OpenCV does the frame warp) plus
  ``VecFrameStack``. v5 ids skip frames themselves, so they are created with
  ``frameskip=1`` and the skipping is left to the wrapper (frames are never skipped twice). Episode returns come
  from the ``Monitor`` under the wrappers, i.e. the unclipped score of a whole game. :class:`PicklableEmulator`,
  outermost, carries the emulator's state through pickling (checkpoints).
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import ale_py
import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.atari_wrappers import AtariWrapper
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.preprocessing import is_image_space, is_image_space_channels_first
from stable_baselines3.common.vec_env import VecEnv, VecFrameStack, VecTransposeImage

import agents.envs  # noqa: F401  (registers Catcher-PLE-v0 and Pixelcopter-PLE-v0)

gym.register_envs(ale_py)

__all__ = ["is_atari", "is_minatar", "is_mujoco", "check_env_id", "make_env", "env_spaces", "ale_vector_refusal", "MINATAR_MISSING"]

MINATAR_MISSING = "MinAtar is not installed: pip install -e '.[minatar]' (PyPI package minatar)"


#: MinAtar's games; their ids are registered here as the package registers them (``minatar.gym.register_envs``),
#: without importing it: it imports seaborn and pandas (~3 s), paid only by runs that make a MinAtar env
MINATAR_GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")


def _register_minatar() -> bool:
    """Register ``MinAtar/<Game>-v0`` (all 6 actions) and ``-v1`` (minimal action set) if the package is installed."""
    if importlib.util.find_spec("minatar") is None:
        return False
    for game in MINATAR_GAMES:
        name = game.title().replace("_", "")
        for version, minimal in (("v0", False), ("v1", True)):
            if f"MinAtar/{name}-{version}" not in gym.registry:
                gym.register(f"MinAtar/{name}-{version}", entry_point="minatar.gym:BaseEnv",
                             kwargs={"game": game, "use_minimal_action_set": minimal})
    return True


HAS_MINATAR = _register_minatar()


def is_minatar(env_id: str) -> bool:
    """Whether ``env_id`` names a MinAtar game (``MinAtar/...``)."""
    return env_id.startswith("MinAtar/")


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` is an ALE game (``ALE/...-v5`` or the legacy ``...-v4`` ids)."""
    spec = gym.registry.get(env_id)
    entry = getattr(spec, "entry_point", None)
    return isinstance(entry, str) and entry.startswith("ale_py")


def check_env_id(env_id: str) -> str | None:
    """``None`` if ``env_id`` is registered, else a message with close matches."""
    if env_id in gym.registry:
        return None
    if is_minatar(env_id) and not HAS_MINATAR:
        return f"{env_id}: {MINATAR_MISSING}"
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return (f"unknown environment {env_id!r}{hint} (Gymnasium ids such as MountainCar-v0, the PLE ports "
            f"Catcher-PLE-v0 and Pixelcopter-PLE-v0, MinAtar ids such as MinAtar/Breakout-v1, or Atari ids such as "
            f"ALE/Amidar-v5)")


def _atari_env_kwargs(env_id: str, env_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    kwargs = dict(env_kwargs)
    spec = gym.spec(env_id)
    if spec.kwargs.get("frameskip", 1) != 1:  # v5 ids skip 4 frames themselves; AtariWrapper skips instead
        kwargs.setdefault("frameskip", 1)
    if kwargs.get("frameskip", 1) != 1:
        raise ValueError(f"{env_id}: frameskip={kwargs['frameskip']} would skip frames twice; SB3's AtariWrapper "
                         f"skips frames (set atari_wrapper_kwargs.frame_skip instead)")
    return kwargs


class PicklableEmulator(gym.Wrapper):
    """Carries an ALE env's whole state through pickling, for checkpoints: ale-py's ``AtariEnv`` pickles as a new
    env made from its constructor arguments (gymnasium's ``EzPickle``): a freshly started emulator with a fresh
    ``np_random``. This keeps the emulator's state with its RNG (sticky actions) and the env's other attributes
    (``np_random``, which draws the no-op resets, and the spaces' generators). Outermost of the Atari wrappers."""

    def __getstate__(self) -> dict[str, Any]:
        atari = self.unwrapped
        return {**vars(self), "_emulator": atari.clone_state(include_rng=True),
                "_atari": {k: v for k, v in vars(atari).items() if k != "ale"}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        emulator, atari = state.pop("_emulator"), state.pop("_atari")
        vars(self).update(state)
        vars(self.unwrapped).update(atari)
        self.unwrapped.restore_state(emulator)


def _atari_wrappers(env: gym.Env, **kwargs: Any) -> gym.Env:
    return PicklableEmulator(AtariWrapper(env, **kwargs))


class PicklableSimulation(gym.Wrapper):
    """Carries a MuJoCo env's simulation through pickling, for checkpoints: gymnasium's MuJoCo envs pickle as new
    envs made from their constructor arguments (``EzPickle``: a fresh simulation, a fresh ``np_random``). This keeps
    MuJoCo's whole integration state (``mj_getState`` with ``mjSTATE_INTEGRATION``: time, positions, velocities,
    actuator activations, controls, the solver's warm start) and the env's ``np_random`` (which draws the reset
    noise). Outermost of the env's wrappers."""

    def __getstate__(self) -> dict[str, Any]:
        import mujoco

        sim = self.unwrapped
        spec = mujoco.mjtState.mjSTATE_INTEGRATION
        state = np.empty(mujoco.mj_stateSize(sim.model, spec))
        mujoco.mj_getState(sim.model, sim.data, state, spec)
        return {**vars(self), "_simulation": state, "_np_random": sim.np_random}

    def __setstate__(self, state: dict[str, Any]) -> None:
        import mujoco

        state = dict(state)
        simulation, rng = state.pop("_simulation"), state.pop("_np_random")
        vars(self).update(state)
        sim = self.unwrapped
        mujoco.mj_setState(sim.model, sim.data, simulation, mujoco.mjtState.mjSTATE_INTEGRATION)
        sim.np_random = rng


def is_mujoco(env_id: str) -> bool:
    """Whether ``env_id`` is one of gymnasium's MuJoCo envs."""
    try:
        entry = gym.spec(env_id).entry_point
    except gym.error.Error:
        return False
    return isinstance(entry, str) and entry.startswith("gymnasium.envs.mujoco")


def make_env(env_id: str, *, n_envs: int = 1, seed: int | None = None, env_kwargs: Mapping[str, Any] | None = None,
             max_episode_steps: int | None = None, frame_stack: int = 4,
             atari_wrapper_kwargs: Mapping[str, Any] | None = None, atari_env: str = "sb3",
             evaluation: bool = False) -> VecEnv:
    """A monitored ``VecEnv`` of ``n_envs`` copies of ``env_id`` (Atari: pre-processed and frame-stacked; with
    ``atari_env="ale-vector"`` ale-py's C++ vector env, :mod:`agents.rl.ale_vector`, whose ``max_episode_steps``
    counts agent steps, default 108,000; ``evaluation``: whole games and raw scores)."""
    if atari_env == "ale-vector" and is_atari(env_id):
        from .ale_vector import AtariGames, AtariGamesVecEnv, game_name

        base = 0 if seed is None else int(seed)
        return AtariGamesVecEnv(AtariGames(game_name(env_id), [base + i for i in range(n_envs)], train=not evaluation,
                                           max_episode_steps=max_episode_steps or 108_000))
    kwargs = dict(env_kwargs or {})
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = int(max_episode_steps)
    if is_atari(env_id):
        # what SB3's make_atari_env does, with our env kwargs (frameskip=1 for v5 ids)
        venv = make_vec_env(env_id, n_envs=n_envs, seed=seed, env_kwargs=_atari_env_kwargs(env_id, kwargs),
                            wrapper_class=_atari_wrappers, wrapper_kwargs=dict(atari_wrapper_kwargs or {}))
        return VecFrameStack(venv, n_stack=frame_stack) if frame_stack and frame_stack > 1 else venv
    if is_mujoco(env_id):
        return make_vec_env(env_id, n_envs=n_envs, seed=seed, env_kwargs=kwargs, wrapper_class=PicklableSimulation)
    return make_vec_env(env_id, n_envs=n_envs, seed=seed, env_kwargs=kwargs)


def ale_vector_refusal(config: Mapping[str, Any]) -> str | None:
    """Why ``atari_env: ale-vector`` cannot make ``config``'s env (not an Atari id, or settings of the other path)."""
    if not is_atari(config["env"]):
        return f"atari_env: ale-vector is for Atari ids (ALE/...-v5), not {config['env']}"
    extra = {k: v for k, v in dict(config.get("env_kwargs") or {}).items()
             if (k, v) not in (("repeat_action_probability", 0.0), ("full_action_space", False))}
    if extra or config.get("atari_wrapper_kwargs") or config.get("frame_stack", 4) != 4:
        return ("atari_env: ale-vector steps games with the authors' EnvPool settings (4 stacked 84x84 grey frames, "
                "no sticky actions, the minimal action set); leave env_kwargs, atari_wrapper_kwargs and frame_stack "
                f"as they are (got env_kwargs {extra or {}}, atari_wrapper_kwargs "
                f"{dict(config.get('atari_wrapper_kwargs') or {})}, frame_stack {config.get('frame_stack', 4)})")
    return None


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def env_spaces(env_id: str, **kwargs: Any) -> tuple[spaces.Space, spaces.Space]:
    """Observation and action spaces the agent sees (images channel-first, as SB3 transposes them)."""
    return _env_spaces(env_id, _freeze(kwargs))


@lru_cache(maxsize=64)
def _env_spaces(env_id: str, frozen: tuple) -> tuple[spaces.Space, spaces.Space]:
    kwargs = {k: (dict(v) if isinstance(v, tuple) and k.endswith("kwargs") else v) for k, v in frozen}
    venv = make_env(env_id, n_envs=1, **kwargs)
    try:
        obs, act = venv.observation_space, venv.action_space
    finally:
        venv.close()
    if is_image_space(obs, check_channels=False) and not is_image_space_channels_first(obs):
        obs = VecTransposeImage.transpose_space(obs)
    return obs, act
