"""Axis labels with units, from a run's config: what a step counts and what each scalar series measures."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SCALAR_LABELS", "scalar_label", "step_label"]

#: y-axis labels of the scalars, with units
SCALAR_LABELS = {"episode_return": "episode return (sum of rewards)", "episode_length": "episode length (env steps)",
                 "eval_return": "evaluation return (greedy, whole games)", "eval_length": "evaluation length (env steps)",
                 "test_mse": "test MSE", "loss": "training loss", "actor_loss": "actor loss",
                 "critic_loss": "critic loss", "learning_rate": "learning rate"}


def _is_atari(config: Mapping) -> bool:
    env = str(config.get("env", ""))
    return env.startswith("ALE/") or "NoFrameskip" in env


def scalar_label(name: str, config: Mapping) -> str:
    """The y-axis label of a scalar series, with its unit (Atari episode lengths count emulator frames)."""
    if name in ("episode_length", "eval_length") and _is_atari(config):
        skip = (config.get("atari_wrapper_kwargs") or {}).get("frame_skip", 4)
        return f"{'episode' if name == 'episode_length' else 'evaluation'} length (emulator frames, {skip} per agent step)"
    return SCALAR_LABELS.get(name, name.replace("_", " "))


def step_label(config: Mapping) -> str:
    """The x-axis label: env steps (RL agents, whose configs name an ``env``) or samples seen (streaming
    learners)."""
    return "env steps" if "env" in config else "samples seen"
