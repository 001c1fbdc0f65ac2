"""The SB3 algorithms, declared once each: what the CLI, config resolution, the run loop and the probe adapter read.

An :class:`RLAlgo` names the SB3 class and our policy class, the default env, the action spaces it takes, its own
hyper-parameters with their checks (the settings common to all are in :mod:`agents.rl.config`), the keys passed
to SB3's constructor, the hidden MLPs its policy builds (roles, with their input and output widths), the networks
being trained and the probe adapter that builds its per-sample losses. Its per-env defaults are in
``agents/hyperparams/<name>.yml``.

Rainbow (:mod:`agents.rl.rainbow`) is our own algorithm on SB3's off-policy loop, declared here like the others so
that it shares the run folder, log, signals, divergence handling and resume. DQN names its population engine
(:mod:`agents.population`), which trains many of its runs together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.base_class import BaseAlgorithm
from torch import nn

from probes.sb3 import dqn_context, ppo_context, sac_context

from .dqn import PaperDQN
from .policies import ActActorCriticPolicy, ActDQNPolicy, ActSACPolicy, MinAtarConv
from .rainbow import NatureConv, Rainbow, RainbowPolicy, rainbow_context
from .settings import DQNSettings, PPOSettings, RainbowSettings, SACSettings

__all__ = ["RLAlgo", "ALGOS"]

#: a hidden MLP's (input width, output width) from (features width, number of actions or action dimensions)
Widths = Callable[[int, int], tuple[int, int]]


@dataclass(frozen=True)
class RLAlgo:
    """One SB3 algorithm.

    name, help: the ``agents.train`` subcommand and its one-line description.
    model, policy: the SB3 algorithm class and the policy class with our activation seams.
    default_env: the env when none is given.
    actions, actions_text: the action spaces it takes, and how to say so in an error ("needs discrete actions").
    settings: its config schema (:mod:`agents.rl.settings`): the common settings and its own.
    sb3_keys: config keys passed as they are to ``model(...)``.
    required: settings that may not be null.
    roles: the hidden MLPs its policy builds, with their widths; ``net_arch`` is a list of widths for one role,
        a list or a mapping of roles for several.
    online: the networks being trained (targets excluded), whose parameters a run counts.
    probe_context: ``(model, rng) -> ProbeContext fields`` (model, per-sample losses, sampler; :mod:`probes.sb3`).
    network: ``(config, policy_kwargs) -> policy_kwargs`` where the algorithm builds its network differently from
        the default (hidden MLPs per role; for images a features extractor holding the activation layer).
    check: ``config -> message or None``: settings that do not go together (checked at resolution).
    population: ``"module:name"`` of the engine that trains several runs of it together in one process (the
        :class:`agents.commands.Population` protocol; ``--seeds`` and grids with ``engine: population`` use it),
        or None.
    """

    name: str
    help: str
    model: type[BaseAlgorithm]
    policy: type
    default_env: str
    actions: tuple[type[spaces.Space], ...]
    actions_text: str
    settings: type
    sb3_keys: tuple[str, ...]
    roles: Mapping[str, Widths]
    online: Callable[[Any], list[nn.Module]]
    probe_context: Callable[[Any, np.random.Generator], dict[str, Any]]
    required: tuple[str, ...] = ()
    network: Callable[[Mapping[str, Any], dict[str, Any]], dict[str, Any]] | None = None
    check: Callable[[Mapping[str, Any]], str | None] | None = None
    population: str | None = None


DQN = RLAlgo(
    name="dqn",
    help="DQN (SB3) with a chosen activation; defaults: the paper's classic-control DQN, or its Atari DQN for ALE ids",
    model=PaperDQN, policy=ActDQNPolicy, default_env="MountainCar-v0",
    actions=(spaces.Discrete,), actions_text="needs discrete actions",
    settings=DQNSettings,
    sb3_keys=("buffer_size", "learning_starts", "batch_size", "tau", "gamma", "train_freq", "gradient_steps",
              "n_steps", "target_update_interval", "exploration_fraction", "exploration_initial_eps",
              "exploration_final_eps", "max_grad_norm", "td_loss", "exploration_steps", "replay", "frames_on"),
    roles={"q": lambda f, n: (f, n)},
    online=lambda model: [model.q_net],
    probe_context=dqn_context,
    population="agents.population.run:POPULATION",
)

RAINBOW_KEYS = ("noisy", "noisy_std", "distributional", "n_atoms", "v_min", "v_max", "dueling", "double_q",
                "prioritized", "per_alpha", "per_beta0", "per_beta_steps", "per_eps", "probe_noise")


def _rainbow_network(config: Mapping[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Rainbow's trunk carries no activation layer: for images it is the convolutions alone and each stream gets
    the ``features_dim``-unit layer with the activation (the paper's 512-unit layer of both dueling streams)."""
    derived = config["derived"]
    if derived["cnn"]:
        minatar = derived.get("trunk") == "minatar"
        kwargs = {k: v for k, v in kwargs.items() if k != "features_extractor_kwargs"}
        kwargs["features_extractor_class"] = MinAtarConv if minatar else NatureConv
        kwargs["net_arch"] = [derived["features"]]
    return kwargs


def _rainbow_check(config: Mapping[str, Any]) -> str | None:
    if config.get("population_engine", "auto") != "auto":
        return "population_engine is for dqn: rainbow trains no populations"
    if config.get("prioritized") and config.get("n_envs", 1) > 1:
        return f"prioritized replay takes one env (n_envs=1, got {config['n_envs']}); set prioritized=false for more"
    if config.get("distributional") and not config.get("v_min", -1) < config.get("v_max", 1):
        return f"v_min must be below v_max, got [{config.get('v_min')}, {config.get('v_max')}]"
    return None


RAINBOW = RLAlgo(
    name="rainbow",
    help="our Rainbow (noisy nets, C51, prioritized n-step replay, dueling, double Q; each a setting) with a chosen "
         "activation on both streams' penultimate layer",
    model=Rainbow, policy=RainbowPolicy, default_env="CartPole-v1",
    actions=(spaces.Discrete,), actions_text="needs discrete actions",
    settings=RainbowSettings,
    sb3_keys=(*DQN.sb3_keys, *RAINBOW_KEYS),
    roles={"q": lambda f, n: (f, n)},
    online=lambda model: [model.q_net],
    probe_context=rainbow_context,
    network=_rainbow_network,
    check=_rainbow_check,
    population="agents.population.run:POPULATION",
)

PPO_ALGO = RLAlgo(
    name="ppo",
    help="PPO (SB3) with a chosen activation in the actor and critic MLPs (or the Nature CNN's 512 layer)",
    model=PPO, policy=ActActorCriticPolicy, default_env="CartPole-v1",
    actions=(spaces.Discrete, spaces.Box), actions_text="here supports Discrete and Box actions",
    settings=PPOSettings,
    sb3_keys=("n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "clip_range", "normalize_advantage",
              "ent_coef", "vf_coef", "max_grad_norm", "target_kl"),
    required=("max_grad_norm",),  # PPO clips gradients with max_grad_norm and has no "none"
    roles={"pi": lambda f, n: (f, n), "vf": lambda f, n: (f, 1)},
    online=lambda model: [model.policy],
    probe_context=ppo_context,
)

SAC_ALGO = RLAlgo(
    name="sac",
    help="SAC (SB3) with a chosen activation in the actor and both critics",
    model=SAC, policy=ActSACPolicy, default_env="Pendulum-v1",
    actions=(spaces.Box,), actions_text="needs continuous (Box) actions",
    settings=SACSettings,
    sb3_keys=("buffer_size", "learning_starts", "batch_size", "tau", "gamma", "train_freq", "gradient_steps",
              "ent_coef", "target_update_interval", "target_entropy"),
    roles={"pi": lambda f, n: (f, 2 * n), "qf": lambda f, n: (f + n, 1)},
    online=lambda model: [model.actor, model.critic],
    probe_context=sac_context,
)

ALGOS: dict[str, RLAlgo] = {a.name: a for a in (DQN, RAINBOW, PPO_ALGO, SAC_ALGO)}

