"""Pure-numpy Gymnasium ports of PyGame Learning Environment games.

Importing this package registers ``Catcher-PLE-v0`` (2000-step limit) and
``Pixelcopter-PLE-v0`` (500-step limit) with Gymnasium.
"""

from __future__ import annotations

import gymnasium as gym

from agents.envs.catcher import CatcherEnv
from agents.envs.pixelcopter import PixelcopterEnv

__all__ = ["CatcherEnv", "PixelcopterEnv", "register_envs"]

_ENV_SPECS: dict[str, tuple[str, int]] = {
    "Catcher-PLE-v0": ("agents.envs.catcher:CatcherEnv", 2000),
    "Pixelcopter-PLE-v0": ("agents.envs.pixelcopter:PixelcopterEnv", 500),
}


def register_envs() -> None:
    """Register the PLE ports with Gymnasium; ids already registered are left untouched."""
    for env_id, (entry_point, max_episode_steps) in _ENV_SPECS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, max_episode_steps=max_episode_steps)


register_envs()
