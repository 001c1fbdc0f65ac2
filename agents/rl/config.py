"""Resolved, validated configs for the RL commands: per-env YAML hyper-parameters, ``--config`` files and flags.

Resolution, later wins::

    agents/hyperparams/<algo>.yml: `default` <- `atari` (ALE ids) or `minatar` (MinAtar ids) <- the env's entry
    <- --config FILE <- flags (and --set KEY=VALUE)

A resolved config is a flat dict (written to the run's ``config.yaml``; such a file works as ``--config`` again):
the keys of the YAML files (SB3 argument names where SB3 has one; the schema with types, checks and help is
:mod:`agents.rl.settings`), with the chosen activation's defaults folded into ``act_kwargs``, ``sigma_bias`` and
``layer_norm`` (the activation's spec, then the YAML's ``activations`` table, then explicit settings), and a
``derived`` entry (observation shape, action space, the hidden widths actually built: :mod:`agents.rl.derive`)
that is recomputed on every resolution and ignored in ``--config`` files.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import torch

import yaml

from agents.errors import ConfigError
from agents.inputs import parse_yaml_value, read_yaml
from interference.activation_spec import activation_names, activation_spec

from . import checks as c
from .algos import ALGOS
from .derive import derive
from .envs import check_env_id, is_atari, is_minatar
from .settings import OPTIMIZERS, DQNSettings, PPOSettings, RainbowSettings, SACSettings, checks

__all__ = ["ALIASES", "act_args", "probe_arguments", "resolve", "hyperparams", "run_tag", "algo_kwargs", "RUNTIME_KEYS"]


#: flag names -> config keys
ALIASES = {"lr": "learning_rate", "steps": "n_timesteps", "hidden": "net_arch", "ln": "layer_norm",
           "threads": "torch_threads"}
#: activation arguments are settable as flags (--d, --a, --k, ...); they go into ``act_kwargs``
#: flag and setting names an activation argument may not take over (such an argument is set with
#: --set act_kwargs="{name: value}" instead)
RESERVED = frozenset({*ALIASES, *checks(SACSettings), *checks(RainbowSettings), *checks(PPOSettings), "config", "set",
                      "out", "import"})


def act_args() -> tuple[str, ...]:
    """Arguments of every registered activation (plugins' included) that are flags of their own: all but those
    named like a setting or another flag (:data:`RESERVED`)."""
    return tuple(sorted({a for n in activation_names() for a in activation_spec(n).arguments} - RESERVED))



#: keys that do not change what is trained: left out of the run directory name
ACTIVATION_KEYS = ("act_kwargs", "sigma_bias", "layer_norm")  # settings that belong to one activation
RUNTIME_KEYS = ("algo", "env", "act", "seed", "device", "progress", "checkpoint_every", "sb3_log", "torch_threads",
                "probe", "probe_every", "probe_kwargs", "probe_inputs", "derived", "frames_on")


def algo_kwargs(config: Mapping[str, Any]) -> dict[str, Any]:
    """The SB3 constructor arguments of a resolved config."""
    return {k: config[k] for k in ALGOS[config["algo"]].sb3_keys if k in config}


def _checks(algo: str) -> dict[str, c.Check]:
    return checks(ALGOS[algo].settings)


# --- YAML files -----------------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def _hyperparams_text(algo: str) -> str:
    return resources.files("agents").joinpath("hyperparams", f"{algo}.yml").read_text()


def hyperparams(algo: str) -> dict[str, Any]:
    """The per-env hyper-parameter table of ``algo`` (a fresh copy)."""
    table = yaml.safe_load(_hyperparams_text(algo)) or {}
    if not isinstance(table, dict):
        raise ConfigError(f"agents/hyperparams/{algo}.yml must map env ids to settings")
    return table


def _merge(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Later layers win; mappings merge key by key (one level deeper for ``activations``), lists replace; a layer
    that switches ``optimizer`` drops the earlier ``optimizer_kwargs``."""
    out: dict[str, Any] = {}
    for layer in layers:
        if "optimizer" in layer and str(layer["optimizer"]).lower() != str(out.get("optimizer", "")).lower():
            out.pop("optimizer_kwargs", None)  # another optimizer: the previous one's arguments do not apply
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
                if key == "activations":
                    merged = dict(out[key])
                    for act, args in value.items():
                        merged[act] = {**(merged.get(act) or {}), **(args or {})}
                    out[key] = merged
                else:
                    out[key] = {**out[key], **value}
            else:
                out[key] = value
    return out


def _read_config_file(path: str | Path, algo: str) -> dict[str, Any]:
    data = read_yaml(path, "config")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of config keys")
    data = {ALIASES.get(str(k), str(k)): v for k, v in data.items()}
    if data.pop("algo", algo) != algo:
        raise ConfigError(f"config file {path} is for another algorithm than {algo!r}")
    data.pop("derived", None)
    unknown = sorted(set(data) - set(_checks(algo)))
    if unknown:
        raise ConfigError(f"config file {path}: unknown keys {unknown}; {algo} takes {', '.join(sorted(_checks(algo)))}")
    return data


def _split_flags(algo: str, values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """Flag (or grid entry) values -> (config keys, activation arguments, --config path)."""
    config: dict[str, Any] = {}
    activation_kwargs: dict[str, Any] = {}
    path = None
    arg_names = act_args()
    for key, value in values.items():
        key = ALIASES.get(key, key)
        if key == "config":
            path = value
        elif key == "set":
            for item in [value] if isinstance(value, str) else value:
                name, sep, raw = str(item).partition("=")
                if not sep or not name:
                    raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
                name = ALIASES.get(name.strip(), name.strip())
                config[name] = parse_yaml_value(raw, f"--set {name}")
        elif key in arg_names:
            activation_kwargs[key] = value
        else:
            config[key] = value
    for name in list(config):
        if name in arg_names:  # --set d=8
            activation_kwargs[name] = config.pop(name)
    unknown = sorted(set(config) - set(_checks(algo)))
    if unknown:
        raise ConfigError(f"unknown {algo} settings {unknown}; {algo} takes {', '.join(sorted(_checks(algo)))} "
                          f"and the activation arguments {', '.join(arg_names)}")
    return config, activation_kwargs, path


# --- resolution -----------------------------------------------------------------------------------------


def resolve(algo: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """A complete, validated config for ``algo`` from flag values or a grid entry; raises :class:`ConfigError`."""
    if algo not in ALGOS:
        raise ConfigError(f"unknown algorithm {algo!r}; choose from {', '.join(ALGOS)}")
    flags, act_flags, path = _split_flags(algo, values)
    from_file = _read_config_file(path, algo) if path is not None else {}
    if "act" in flags and "act" in from_file and str(flags["act"]).lower() != str(from_file["act"]).lower():
        # a saved run's config reused with another activation: its activation settings belong to the old one
        from_file = {k: v for k, v in from_file.items() if k not in ACTIVATION_KEYS}
    env = str(flags.get("env", from_file.get("env", ALGOS[algo].default_env)))
    if (msg := check_env_id(env)) is not None:
        raise ConfigError(msg)
    table = hyperparams(algo)
    names = ["default", *(["atari"] if is_atari(env) else []), *(["minatar"] if is_minatar(env) else []), env]
    layers = [table.get(name) or {} for name in names]
    for name, layer in zip(names, layers):
        unknown = sorted(set(layer) - set(_checks(algo)))
        if unknown:
            raise ConfigError(f"agents/hyperparams/{algo}.yml entry {name!r}: unknown keys {unknown}")
    merged = _merge(*layers, from_file, flags)
    merged["env"] = env
    for layer in (flags, from_file):  # the most specific source naming an epsilon schedule decides which one
        if "exploration_fraction" in layer and layer.get("exploration_steps") is not None:
            raise ConfigError("set exploration_steps (absolute) or exploration_fraction (of the run), not both; "
                              "exploration_steps=null selects the fraction")
        if "exploration_fraction" in layer:
            merged["exploration_steps"] = None  # an explicit fraction replaces the YAML's absolute schedule
        if "exploration_fraction" in layer or "exploration_steps" in layer:
            break

    checks = _checks(algo)
    config: dict[str, Any] = {}
    for key, value in merged.items():
        try:
            config[key] = checks[key](value)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"{key} must be {err}, got {value!r}") from None
    for key in ALGOS[algo].required:
        if config.get(key) is None:
            raise ConfigError(f"{algo} needs {key}")
    if ALGOS[algo].check is not None and (message := ALGOS[algo].check(config)) is not None:
        raise ConfigError(f"{algo}: {message}")

    _check_policy_kwargs(algo, config.get("policy_kwargs") or {})
    _resolve_activation(config, act_flags, from_file, flags, checks)
    config.pop("activations", None)
    if config.get("scale_probe_at") is True:  # the length the YAML's at-steps were written for
        config["scale_probe_at"] = int(_merge(*layers).get("n_timesteps") or config["n_timesteps"])
    _resolve_probes(config)
    config.setdefault("seed", 0)
    config.setdefault("device", "cpu")
    config.setdefault("probe_inputs", 32)
    config.setdefault("torch_threads", None)
    config.setdefault("progress", None)
    config["optimizer_kwargs"] = _check_optimizer(config)
    config["derived"] = derive(ALGOS[algo], config)
    return _ordered(algo, config)


_SET_BY_US = {"observation_space", "action_space", "lr_schedule"}  # SB3 passes these to every policy
# policy arguments that the config's own keys set (run.policy_kwargs would silently override them)
_FROM_CONFIG = {"activation": "act", "activation_fn": "act", "act_kwargs": "act_kwargs", "layer_norm": "layer_norm",
                "sigma_bias": "sigma_bias", "act_layers": "act_layers", "net_arch": "net_arch", "optimizer_class": "optimizer",
                "optimizer_kwargs": "optimizer_kwargs", "features_extractor_kwargs": "features_dim"}


def _keyword_arguments(cls: type) -> set[str]:
    """Keyword arguments ``cls(...)`` accepts, following ``**kwargs`` up the MRO."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


def _check_policy_kwargs(algo: str, policy_kwargs: Mapping[str, Any]) -> None:
    owned = sorted(set(policy_kwargs) & set(_FROM_CONFIG))
    if owned:
        keys = ", ".join(sorted({_FROM_CONFIG[k] for k in owned}))
        raise ConfigError(f"policy_kwargs {owned} come from the config; set {keys} instead")
    allowed = _keyword_arguments(ALGOS[algo].policy) - _SET_BY_US - set(_FROM_CONFIG)
    unknown = sorted(set(policy_kwargs) - allowed)
    if unknown:
        raise ConfigError(f"policy_kwargs: the {algo} policy does not take {unknown}; it takes "
                          f"{', '.join(sorted(allowed))}")


#: settings an activation's entry in the YAML's ``activations`` table may set besides its arguments
_TABLE_SETTINGS = ("net_arch", "match_width", "act_layers")


def _resolve_activation(config: dict[str, Any], act_flags: Mapping[str, Any], from_file: Mapping[str, Any],
                        flags: Mapping[str, Any], algo_checks: Mapping[str, c.Check]) -> None:
    try:
        spec = activation_spec(config.get("act", "relu"))
    except ValueError as err:
        raise ConfigError(str(err)) from None
    act = spec.name
    table = c.mapping((config.get("activations") or {}).get(act))
    table_sigma, table_ln = table.pop("sigma_bias", None), table.pop("layer_norm", None)
    given = {**from_file, **flags}  # explicit settings beat the activation's table, which beats the YAML entry
    for key in _TABLE_SETTINGS:  # the activation's own network shape (the authors' widths per activation)
        if key not in table:
            continue
        value = table.pop(key)
        if key not in algo_checks:
            raise ConfigError(f"activations.{act}.{key}: this algorithm has no setting {key}")
        if key not in given:
            try:
                config[key] = algo_checks[key](value)
            except (ValueError, TypeError) as err:
                raise ConfigError(f"activations.{act}.{key} must be {err}, got {value!r}") from None
    act_kwargs = {**table, **c.mapping(config.get("act_kwargs")), **act_flags}
    if "num_units" in act_kwargs:
        raise ConfigError("num_units is set from the layer width; leave it out")
    try:
        spec.check_arguments(act_kwargs)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    try:
        spec.build(1, **act_kwargs)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"activation {act!r}: {err}") from None
    sigma = config.get("sigma_bias") if "sigma_bias" in given or table_sigma is None else table_sigma
    if sigma is None:
        sigma = spec.sigma_bias  # the activation's default convention (Elephant: 0.4; the others: none)
    ln = config.get("layer_norm") if "layer_norm" in given or table_ln is None else table_ln
    config["act"] = act
    config["act_kwargs"] = act_kwargs
    config["sigma_bias"] = c.real(0.0, optional=True)(sigma)
    config["layer_norm"] = spec.layer_norm if ln is None else c.boolean()(ln)


def _resolve_probes(config: dict[str, Any]) -> None:
    from probes import PROBES, make_probe

    names = config.get("probe") or []
    unknown = [n for n in names if n not in PROBES]
    if unknown:
        raise ConfigError(f"unknown probe {', '.join(unknown)}; choose from {', '.join(sorted(PROBES))}")
    kwargs = config.get("probe_kwargs") or {}
    extra = sorted(set(kwargs) - set(PROBES))
    if extra:
        raise ConfigError(f"probe_kwargs names unknown probes {extra}; choose from {', '.join(sorted(PROBES))}")
    every = config.get("probe_every")
    if every is None:
        every = max(1, config["n_timesteps"] // 10)  # ten records per run
    config["probe_every"] = every
    config["probe_kwargs"] = {k: c.mapping(v) for k, v in kwargs.items()}
    for name in names:
        try:
            make_probe(name, **probe_arguments(config, name))
        except (ValueError, TypeError) as err:
            raise ConfigError(f"probe {name!r}: {err}") from None
    config["probe"] = names


def probe_arguments(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The arguments probe ``name`` is built with: its ``probe_kwargs``, ``every`` = ``probe_every`` (0: None, only
    at its chosen steps), its ``at`` steps scaled by ``n_timesteps / scale_probe_at`` when ``scale_probe_at`` is set."""
    kwargs = {**c.mapping(config.get("probe_kwargs", {}).get(name)), "every": config["probe_every"] or None}
    of = config.get("scale_probe_at")
    if of and kwargs.get("at"):
        kwargs["at"] = sorted({max(1, round(a * config["n_timesteps"] / of)) for a in kwargs["at"]})
    return kwargs


def _check_optimizer(config: Mapping[str, Any]) -> dict[str, Any]:
    kwargs = c.mapping(config.get("optimizer_kwargs"))
    name = config.get("optimizer", "adam")
    try:
        OPTIMIZERS[name]([torch.zeros(1, requires_grad=True)], lr=1e-3, **kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"optimizer {name!r} with {kwargs}: {err}") from None
    return kwargs


_ORDER = ("algo", "env", "seed", "act", "act_kwargs", "sigma_bias", "layer_norm", "net_arch", "match_width", "act_layers",
          "features_dim", "n_timesteps", "learning_rate", "lr_schedule", "optimizer", "optimizer_kwargs")
_TAIL = ("n_envs", "max_episode_steps", "env_kwargs", "frame_stack", "atari_wrapper_kwargs", "atari_env", "policy_kwargs",
         "probe", "probe_every", "probe_kwargs", "probe_inputs", "device", "torch_threads", "progress",
         "checkpoint_every", "sb3_log", "derived")


def _ordered(algo: str, config: Mapping[str, Any]) -> dict[str, Any]:
    config = {"algo": algo, **config}
    head = [k for k in _ORDER if k in config]
    tail = [k for k in _TAIL if k in config]
    middle = sorted(k for k in config if k not in head and k not in tail)
    return {k: config[k] for k in (*head, *middle, *tail)}


# --- run directory names --------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, float):
        return format(value, "g")
    if isinstance(value, (list, tuple)):
        return "-".join(_fmt(v) for v in value) or "none"
    if isinstance(value, Mapping):
        return "+".join(f"{k}{_fmt(v)}" for k, v in sorted(value.items())) or "none"
    return str(value).replace("/", "-")


@lru_cache(maxsize=256)
def _defaults(algo: str, env: str, act: str) -> dict[str, Any]:
    return resolve(algo, {"env": env, "act": act})


def run_tag(config: Mapping[str, Any]) -> str:
    """The settings of ``config`` that differ from its env's and activation's defaults, as a folder name
    (``""`` for the defaults), e.g. ``buffer_size=1000,learning_rate=0.0003``."""
    defaults = _defaults(config["algo"], config["env"], config["act"])
    parts = []
    for key in sorted(set(config) | set(defaults)):
        if key in RUNTIME_KEYS:
            continue
        mine, theirs = config.get(key), defaults.get(key)
        if mine == theirs:
            continue
        if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
            prefix = "" if key == "act_kwargs" else f"{key}."
            for sub in sorted(set(mine) | set(theirs)):
                if mine.get(sub) != theirs.get(sub):
                    parts.append(f"{prefix}{sub}={_fmt(mine.get(sub))}")
        else:
            parts.append(f"{key}={_fmt(mine)}")
    tag = ",".join(parts)
    if len(tag) > 120:
        import hashlib

        tag = tag[:100] + "," + hashlib.sha1(tag.encode()).hexdigest()[:10]
    return tag
