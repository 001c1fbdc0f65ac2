"""The RL config schema: every setting a config may hold, typed, checked and explained, as dataclasses.

:class:`Common` holds the settings of every algorithm; each algorithm declares its own in a subclass
(:class:`DQNSettings`, :class:`RainbowSettings`, :class:`PPOSettings`, :class:`SACSettings`, named by :mod:`agents.rl.algos`). A field's type
annotation is the value's type, its ``metadata`` the check (:mod:`agents.rl.checks`) and a help line. Fields have
no defaults here: a config holds the keys its YAML layers, file and flags set (defaults live in
``agents/hyperparams/<algo>.yml``), and resolution (:mod:`agents.rl.config`) checks each one against the schema.

Dataclasses rather than a validation library (pydantic, attrs): no new dependency, configs stay plain dicts whose
absent keys stay absent (so saved ``config.yaml`` files and finished grid runs compare equal), and the checks keep
their messages ("learning_rate must be a number > 0, got -1").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from . import checks as c

__all__ = ["OPTIMIZERS", "Common", "DQNSettings", "RainbowSettings", "PPOSettings", "SACSettings", "OffPolicy", "checks", "describe"]

OPTIMIZERS = {"adam": torch.optim.Adam, "rmsprop": torch.optim.RMSprop, "sgd": torch.optim.SGD}


def _s(check: c.Check, help: str) -> Any:
    """A setting: no default (absent unless set), its check and help line."""
    return field(metadata={"check": check, "help": help})


_ACT_LAYERS = "hidden layers carrying the activation: all, or the last only (Linear -> ReLU before it)"


@dataclass
class Common:
    """Settings of every RL algorithm."""

    env: str = _s(str, "Gymnasium id, Catcher-PLE-v0 / Pixelcopter-PLE-v0, or an ALE id")
    seed: int = _s(c.integer(0, hi=2**32 - 1), "random seed")
    device: str = _s(c.device, "cpu, cuda, cuda:N or auto")
    n_timesteps: int = _s(c.integer(1, hi=10**13), "env steps to train")
    act: str = _s(str, "hidden activation (a registered activation spec)")
    act_kwargs: dict = _s(c.mapping, "the activation's arguments")
    sigma_bias: float | None = _s(c.real(0.0, optional=True), "spread of the hidden biases; null: zero biases")
    layer_norm: bool | None = _s(c.boolean(True), "LayerNorm before the activation; null: the activation's default")
    net_arch: list | dict = _s(c.net_arch, "hidden Linear widths: a list, or per role (pi, vf, qf)")
    match_width: bool = _s(c.boolean(), "match the parameter count of the Elephant network of net_arch widths")
    features_dim: int = _s(c.integer(1), "width of the Nature CNN's hidden layer (image observations)")
    activations: dict = _s(c.mapping, "per-activation defaults {act: {argument: value, sigma_bias, layer_norm, "
                                      "net_arch, match_width, act_layers}}")
    learning_rate: float = _s(c.real(0.0, open_lo=True), "learning rate")
    lr_schedule: str = _s(c.choice("constant", "linear"), "constant, or linear decay to 0")
    optimizer: str = _s(c.choice(*OPTIMIZERS), "adam, rmsprop or sgd")
    optimizer_kwargs: dict = _s(c.mapping, "the optimizer's arguments")
    gamma: float = _s(c.real(0.0, 1.0), "discount")
    batch_size: int = _s(c.integer(1), "minibatch size")
    max_grad_norm: float | None = _s(c.real(0.0, open_lo=True, optional=True), "gradient clipping; null: none")
    n_envs: int = _s(c.integer(1), "parallel environments")
    max_episode_steps: int | None = _s(c.integer(1, optional=True), "episode step limit; null: the env's")
    env_kwargs: dict = _s(c.env_kwargs, "arguments of gymnasium.make (no render_mode)")
    frame_stack: int = _s(c.integer(1), "frames stacked (image observations)")
    atari_wrapper_kwargs: dict = _s(c.mapping, "arguments of SB3's AtariWrapper")
    atari_env: str = _s(c.choice("sb3", "ale-vector"), "Atari's env: sb3 (Gymnasium's ALE env in SB3's AtariWrapper and "
                                                       "VecFrameStack) or ale-vector (ale-py's C++ vector env with the "
                                                       "authors' EnvPool settings, agents.rl.ale_vector)")
    policy_kwargs: dict = _s(c.mapping, "further arguments of the policy class")
    normalize_obs: bool = _s(c.boolean(), "normalise observations by running mean and std (SB3's VecNormalize; the "
                                          "authors' PPO and SAC on MuJoCo)")
    normalize_reward: bool = _s(c.boolean(), "scale rewards by the running std of the discounted return (VecNormalize; "
                                             "the authors' PPO on MuJoCo)")
    eval_every: int | None = _s(c.integer(1, optional=True), "env steps between evaluations (greedy episodes on an "
                                "env without Atari's episodic life and reward clipping, logged as eval_return); "
                                "null: none")
    eval_episodes: int = _s(c.integer(1), "episodes per evaluation")
    probe: list = _s(c.names, "probes to run")
    probe_every: int | None = _s(c.integer(0, optional=True), "env steps between probe records; null: a tenth of the "
                                                              "run; 0: only at each probe's chosen steps (at)")
    probe_kwargs: dict = _s(c.mapping, "per-probe arguments {probe: {argument: value}}, e.g. at: [steps]")
    scale_probe_at: bool | int | None = _s(c.scale_at, "the run length the probes' at-steps are written for (true: "
                                                       "the env's default length): they are scaled to n_timesteps")
    probe_inputs: int = _s(c.integer(1), "fixed probe inputs")
    torch_threads: int | None = _s(c.integer(1, optional=True), "torch threads; null: 1 for MLPs")
    progress: bool | None = _s(c.boolean(True), "progress bar; null: when stderr is a terminal")
    checkpoint_every: int | None = _s(c.integer(0, optional=True),
                                      "env steps between checkpoints for --resume; null: a tenth of the run; 0: none")
    sb3_log: list = _s(c.sb3_formats, "also write SB3's standard logger outputs to RUN_DIR/sb3 (csv, tensorboard, "
                                      "json, log, stdout), e.g. [csv, tensorboard]")


@dataclass
class OffPolicy(Common):
    """Settings of replay-buffer algorithms."""

    buffer_size: int = _s(c.integer(1), "replay buffer size in transitions")
    learning_starts: int = _s(c.integer(0), "env steps before the first update")
    train_freq: int = _s(c.integer(1), "env steps between updates")
    gradient_steps: int = _s(c.integer(1), "gradient steps per update")
    target_update_interval: int = _s(c.integer(1), "env steps between target network updates")
    tau: float = _s(c.real(0.0, 1.0, open_lo=True), "target network update rate (1: copy)")


@dataclass
class DQNSettings(OffPolicy):
    exploration_initial_eps: float = _s(c.real(0.0, 1.0), "initial epsilon")
    exploration_final_eps: float = _s(c.real(0.0, 1.0), "final epsilon")
    exploration_steps: int | None = _s(c.integer(0, optional=True), "env steps of the epsilon decay (absolute)")
    exploration_fraction: float = _s(c.real(0.0, 1.0, open_lo=True), "fraction of the run the epsilon decay takes")
    td_loss: str = _s(c.choice("mse", "huber"), "TD loss")
    n_steps: int = _s(c.integer(1), "n-step returns")
    replay: str = _s(c.choice("full", "frames"), "replay storage: full (SB3's buffers, whole observations) or frames "
                                                 "(stacked pixel frames stored once; Atari at 1e6 transitions)")
    frames_on: str = _s(c.choice("host", "device"), "where replay: frames keeps the frames: host memory, or the run's "
                                                    "device (a GPU: samples are gathered there; the same samples)")
    population_engine: str = _s(c.choice("auto", "exact", "device", "device-compiled"),
                                "how --seeds and population grids train: exact or auto (numpy draws: a member is "
                                "SB3's run of its seed), device or device-compiled (the device step on the run's "
                                "device, counter draws)")


@dataclass
class RainbowSettings(DQNSettings):
    noisy: bool = _s(c.boolean(), "factorised noisy linear layers in the heads")
    noisy_std: float = _s(c.real(0.0), "initial noise scale of the noisy layers (sigma_0)")
    distributional: bool = _s(c.boolean(), "C51 return distributions (false: Q-values with td_loss)")
    n_atoms: int = _s(c.integer(2), "atoms of the return distribution")
    v_min: float = _s(c.real(), "smallest atom")
    v_max: float = _s(c.real(), "largest atom")
    dueling: bool = _s(c.boolean(), "dueling value and advantage streams")
    double_q: bool = _s(c.boolean(), "double-Q target selection (online network picks, target evaluates)")
    prioritized: bool = _s(c.boolean(), "proportional prioritized replay (one env)")
    per_alpha: float = _s(c.real(0.0), "priority exponent alpha")
    per_beta0: float = _s(c.real(0.0, 1.0), "initial importance-sampling exponent beta (annealed to 1)")
    per_beta_steps: int = _s(c.integer(1), "env steps over which beta reaches 1")
    per_eps: float = _s(c.real(0.0, open_lo=True), "added to the loss before it becomes a priority")
    probe_noise: str = _s(c.choice("mean", "fixed"), "what probes see of noisy layers: the mean weights, or one "
                                                       "fixed noise sample per run")


@dataclass
class PPOSettings(Common):
    n_steps: int = _s(c.integer(2), "env steps per rollout and env")
    n_epochs: int = _s(c.integer(1), "epochs per rollout")
    gae_lambda: float = _s(c.real(0.0, 1.0), "GAE lambda")
    clip_range: float = _s(c.real(0.0, open_lo=True), "PPO clip range")
    ent_coef: float = _s(c.real(), "entropy coefficient")
    vf_coef: float = _s(c.real(0.0), "value loss coefficient")
    normalize_advantage: bool = _s(c.boolean(), "normalise advantages per minibatch")
    target_kl: float | None = _s(c.real(0.0, open_lo=True, optional=True), "early-stopping KL; null: none")
    act_layers: str = _s(c.choice("all", "last"), _ACT_LAYERS)


@dataclass
class SACSettings(OffPolicy):
    ent_coef: str | float = _s(c.ent_coef, "entropy coefficient, or auto / auto_X (learned, starting at X)")
    target_entropy: str | float = _s(c.target_entropy, "target entropy, or auto")
    act_layers: str = _s(c.choice("all", "last"), _ACT_LAYERS)


def checks(schema: type) -> dict[str, c.Check]:
    """``{key: check}`` of a settings dataclass."""
    return {f.name: f.metadata["check"] for f in dataclasses.fields(schema)}


def describe(schema: type) -> str:
    """One line per setting: ``key (type): help``, for ``--help``."""
    return "\n".join(f"  {f.name} ({f.type}): {f.metadata['help']}" for f in dataclasses.fields(schema))
