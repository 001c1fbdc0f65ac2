"""The derivation step of config resolution: what follows from a checked config and its env (observation and action
spaces, the hidden widths actually built, width matching by parameter count), stored as the config's ``derived``
entry and recomputed on every resolution."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gymnasium import spaces
from stable_baselines3.common.preprocessing import is_image_space

from agents.errors import ConfigError
from interference.activation_spec import activation_spec
from interference.nets import match_width

from .envs import ale_vector_refusal, env_spaces, is_minatar
from .policies import cnn_flat_features, minatar_flat_features

if TYPE_CHECKING:
    from .algos import RLAlgo

__all__ = ["derive", "MATCH_REFERENCE"]

#: the activation whose network --match-width matches (the paper's reference, Elephant)
MATCH_REFERENCE = "elephant"


def _match(act: str, act_kwargs: Mapping[str, Any], layer_norm: bool, in_features: int, out_features: int,
           widths: Sequence[int]) -> list[int]:
    if not widths or act == MATCH_REFERENCE:
        return list(widths)
    if len(set(widths)) != 1:
        raise ConfigError(f"match_width needs equal hidden widths (the {MATCH_REFERENCE} reference), got {list(widths)}")
    try:
        w = match_width(act, in_features, out_features, reference=(MATCH_REFERENCE, widths[0]), depth=len(widths),
                        act_kwargs=act_kwargs, layer_norm=layer_norm)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"match_width for {act!r}: {err}") from None
    return [w] * len(widths)


def derive(spec: RLAlgo, config: dict[str, Any]) -> dict[str, Any]:
    """Spaces and the hidden widths actually built for algorithm ``spec`` (an :class:`agents.rl.algos.RLAlgo`),
    width-matched by parameter count when the config asks; sets ``features_dim`` for image observations (the Nature
    CNN's 512-unit layer; MinAtar: 128 after its 16-channel convolution, ``derived["trunk"] = "minatar"``)."""
    algo = spec.name
    env_kw = {k: config[k] for k in ("env_kwargs", "max_episode_steps", "frame_stack", "atari_wrapper_kwargs",
                                     "atari_env") if k in config}
    if config.get("atari_env", "sb3") == "ale-vector" and (why := ale_vector_refusal(config)):
        raise ConfigError(why)
    try:
        obs_space, action_space = env_spaces(config["env"], **env_kw)
    except Exception as err:  # noqa: BLE001  (gym raises many kinds for bad env kwargs)
        raise ConfigError(f"cannot create {config['env']} with {env_kw}: {type(err).__name__}: {err}") from None
    if not isinstance(action_space, spec.actions):
        raise ConfigError(f"{algo} {spec.actions_text}; {config['env']} has {action_space}")
    minatar = is_minatar(config["env"])  # boolean (H, W, C) grids: MinAtar's own small convolution
    image = is_image_space(obs_space, check_channels=False)
    cnn = minatar or image
    if config.get("replay") == "frames" and not (image and len(obs_space.shape) == 3):
        raise ConfigError(f"replay=frames stores stacks of image frames; {config['env']} observes "
                          f"{tuple(obs_space.shape)} {obs_space.dtype}: use replay=full")
    if config.get("frames_on", "host") != "host" and config.get("replay") != "frames":
        raise ConfigError(f"frames_on={config['frames_on']} places the frames of replay=frames; this run has "
                          f"replay={config.get('replay', 'full')}")
    if config.get("frames_on", "host") != "host" and config.get("normalize_obs"):
        raise ConfigError("frames_on=device gathers samples on the device, where normalize_obs (VecNormalize, on "
                          "the host) cannot reach them: use frames_on=host")
    act, act_kwargs, match = config["act"], config["act_kwargs"], config.get("match_width", False)
    net = (act, act_kwargs, config["layer_norm"])
    n_out = int(action_space.n) if isinstance(action_space, spaces.Discrete) else int(math.prod(action_space.shape))
    arch = config.get("net_arch", [])
    derived: dict[str, Any] = {
        "observation_shape": [int(s) for s in obs_space.shape],
        "action_space": f"Discrete({n_out})" if isinstance(action_space, spaces.Discrete) else f"Box({n_out})",
        "cnn": bool(cnn),
    }
    if minatar:
        derived["trunk"] = "minatar"  # (absent: the Nature CNN for images)
    if cnn:
        features = config.setdefault("features_dim", 128 if minatar else 512)
        n_flat = (minatar_flat_features if minatar else cnn_flat_features)(obs_space.shape)
        feat = _match(*net, n_flat, n_out, [features]) if match else [features]
        derived["features"] = feat[0]
        try:
            feature_out = _out_width(act, act_kwargs, feat[0])
        except ValueError as err:
            raise ConfigError(str(err)) from None
        in_features = feature_out
    else:
        in_features = int(math.prod(obs_space.shape))
    if isinstance(arch, Mapping):
        if len(spec.roles) == 1:
            raise ConfigError(f"{algo} takes net_arch as a list of widths")
        roles = {r: list(arch.get(r, [])) for r in spec.roles}
    else:
        roles = {r: list(arch) for r in spec.roles}
    outs = {r: widths(in_features, n_out) for r, widths in spec.roles.items()}
    last_only = config.get("act_layers", "all") == "last"
    if last_only and match:
        raise ConfigError("match_width matches networks whose hidden layers all carry the activation; with "
                          "act_layers=last give net_arch instead")
    hidden = {}
    for role, widths in roles.items():
        hidden[role] = _match(*net, *outs[role], widths) if match else widths
        try:
            for w in hidden[role][-1:] if last_only else hidden[role]:
                _out_width(act, act_kwargs, w)  # validates the width for the activation (e.g. Maxout's k)
        except ValueError as err:
            raise ConfigError(f"net_arch {hidden[role]} with {act}: {err}") from None
    derived["hidden"] = hidden
    return derived


def _out_width(act: str, act_kwargs: Mapping[str, Any], width: int) -> int:
    spec = activation_spec(act)
    return spec.output_width(spec.build(width, **act_kwargs), width)
