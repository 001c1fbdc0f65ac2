"""One declaration for a learner with its own training loop: its settings (a typed dataclass) and its loop.

:class:`Algorithm` turns that declaration into an ``agents.train`` subcommand and a grid-runner command (the
:class:`agents.commands.Command` protocol): one flag per setting, typed validation of flags, grid entries and
``--config`` files alike, one run folder per configuration (and seed). Register it with
:func:`agents.commands.register_command` (from a plugin module: ``--import MODULE``)::

    @dataclass
    class ToyConfig:
        seed: int = 0
        steps: int = field(default=100, metadata={"help": "updates"})
        lr: float = 0.1

        def __post_init__(self):       # optional further checks: raise ValueError
            if self.lr <= 0: raise ValueError("lr must be > 0")

    def train(run: RunFolder, cfg: ToyConfig) -> dict: ...  # writes run.path / "run.h5" (a probes.ProbeRunner log)

    register_command(Algorithm("toy", "a toy learner", ToyConfig, train, folder=("lr",)))

Conventions a settings dataclass may follow (the streaming and class-incremental learners do):

* ``seed: int`` — one run per seed (``--seeds 0-4`` trains five run folders); or ``seeds: tuple[int, ...]`` — the
  seeds train side by side in one run folder (a grid entry's ``seed`` is a one-seed ``seeds``).
* ``probe: list[str]`` — probe names, checked against the registry; the help lists the registered probes.
* ``activation="act"`` (an argument of :class:`Algorithm`) with an ``act_kwargs: dict`` field — the activation's
  arguments are flags and config keys of their own (``--k 2``, ``slope: 0.5``); those that are settings of their
  own (e.g. ``d``, ``a``, ``h`` with the paper's values) stay settings, the others go to ``act_kwargs``.
* ``metadata``: ``help`` (the flag's help; ``default_text`` in place of a default the settings derive),
  ``choices`` (a list, or a function returning one), ``flag: False`` (a
  config key without a flag), ``applies`` (``settings -> bool``, with ``applies_text``): a setting changed from its
  default where it does not apply is refused, as is an activation argument the chosen activation does not take.

The run's folder, its ``config.yaml``, ``summary.json`` (the summary ``train`` returns), ``DONE.json``, its lock
and exit statuses are :mod:`agents.lifecycle`'s: ``train`` writes its own files into ``run.path`` (its log, weights)
and returns the summary. SB3's algorithms are declared in :mod:`agents.rl.algos`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .inputs import parse_seeds, read_yaml
from .lifecycle import RunFolder

__all__ = ["Algorithm"]

#: keys of the CLI and the grid that no activation argument may take over
_CLI_KEYS = frozenset({"config", "seed", "seed_list", "command", "out", "import", "help", "resume"})


def _coerce(name: str, kind: Any, value: Any) -> Any:
    """``value`` as the field type ``kind`` (bool, int, float, str, tuple/list of those, or Optional of one)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        if value is None:
            return None
        kind = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (tuple, list):
        items = [v for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        if not isinstance(items, Sequence):
            raise ConfigError(f"{name} must be a list, got {value!r}")
        return [_coerce(name, args[0] if args else str, v) for v in items]
    if kind is bool:
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        return value
    if kind in (int, float):
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number) or (kind is int and number != int(number)):
            raise ConfigError(f"{name} must be {'an integer' if kind is int else 'a finite number'}, got {value!r}")
        return kind(number)
    if kind is str:
        return str(value)
    raise ConfigError(f"{name}: settings of type {kind!r} are not supported (use bool, int, float, str or lists)")


def _choices(f: dataclasses.Field) -> list[Any] | None:
    choices = f.metadata.get("choices")
    return list(choices() if callable(choices) else choices) if choices is not None else None


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


class Algorithm:
    """A learner declared once: ``name``, one-line ``help``, its settings dataclass ``config`` (field types, defaults
    and metadata make the flags; the module docstring lists the conventions), its loop ``train(run, settings) ->
    summary`` (``run``: the :class:`agents.lifecycle.RunFolder`, started) and its run folder under ``OUT/<name>``:
    ``folder`` names the settings that name it (``<field>=<value>/.../seed<seed>``), or is a function
    ``config -> relative path``.

    ``defaults``: ``values -> settings`` overriding the dataclass's defaults (e.g. a YAML file's entry for the chosen
    dataset). ``activation``: the field naming the activation whose arguments the settings take;
    ``fixed_arguments``: those of its arguments the learner keeps at their defaults (no flag, refused as keys).
    ``key``: the config key naming the learner."""

    def __init__(self, name: str, help: str, config: type, train: Callable[[RunFolder, Any], dict[str, Any]], *,
                 folder: Sequence[str] | Callable[[Mapping[str, Any]], str | Path] = (),
                 defaults: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
                 activation: str | None = None, fixed_arguments: Sequence[str] = (), key: str = "algo") -> None:
        if not dataclasses.is_dataclass(config):
            raise TypeError(f"Algorithm {name!r}: config must be a dataclass, got {config!r}")
        self.name, self.help, self.config_class, self.loop = name, help, config, train
        self.folder, self.defaults, self.activation, self.key = folder, defaults, activation, key
        self.fixed_arguments = frozenset(fixed_arguments)
        self.types = typing.get_type_hints(config)
        self.fields = {f.name: f for f in dataclasses.fields(config) if f.init and f.name != "act_kwargs"}
        self.side_by_side = "seeds" in self.fields
        needed = [*([] if self.side_by_side else ["seed"]), *([] if callable(folder) else folder),
                  *([activation] if activation else [])]
        missing = [k for k in needed if k not in self.fields]
        if activation and not any(f.name == "act_kwargs" for f in dataclasses.fields(config)):
            missing.append("act_kwargs")
        if missing:
            raise TypeError(f"Algorithm {name!r}: config has no fields {missing}")

    # -- flags ----------------------------------------------------------------------------------------------------
    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        S = argparse.SUPPRESS  # unset flags stay out of the values: the defaults fill them
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
        parser.add_argument("--config", default=S, metavar="FILE", help="YAML file of settings (a run's config.yaml)")
        if not self.side_by_side:
            parser.add_argument("--seeds", dest="seed_list", default=S, metavar="SEEDS",
                                help="several runs, one per seed (e.g. 0-4 or 0,2,5), each in its own run folder, "
                                     "one after another")
        for name, f in self.fields.items():
            if f.metadata.get("flag", True) is False:
                continue
            group = parser
            if name == "probe":
                from .commands import probe_list

                group = parser.add_argument_group(
                    "probes (logged to each seed's run log)",
                    f"probes for --probe (--import MODULE adds a plugin's):\n{probe_list()}")
            kind = self.types[name]
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            if isinstance(default, (list, tuple)):
                default = ",".join(map(str, default))
            text = f"{f.metadata.get('help', name)} (default: {f.metadata.get('default_text', default)})"
            flag = f"--{name.replace('_', '-')}"
            metavar = "NAMES" if name == "probe" else name.upper()
            if kind is bool or kind == bool | None:
                group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=S, help=text)
            else:
                group.add_argument(flag, dest=name, default=S, metavar=None if _choices(f) else metavar,
                                   choices=_choices(f), help=text)
        if self.activation:
            from .commands import add_activation_flags

            add_activation_flags(parser, self._reserved())

    def _reserved(self) -> set[str]:
        return set(self.fields) | _CLI_KEYS | self.fixed_arguments | {self.key, "act_kwargs"}

    def _activation_keys(self) -> set[str]:
        """Config keys of the registered activations' arguments that are not settings of their own."""
        from interference.activation_spec import activation_names, activation_spec

        return {a for n in activation_names() for a in activation_spec(n).arguments} - self._reserved()

    # -- config -------------------------------------------------------------------------------------------------
    def make_config(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The complete config (``{key: name, **settings}``, the activation's other arguments as keys of their
        own) of flag values, a grid entry or a ``--config`` file; :class:`ConfigError` naming what is wrong."""
        values = dict(values)
        if "config" in values:
            saved = read_yaml(values.pop("config"), "config") or {}
            if not isinstance(saved, dict) or saved.pop(self.key, self.name) != self.name:
                raise ConfigError(f"the config file is not a {self.name} config")
            values = {**saved, **values}
        if self.side_by_side and "seed" in values:
            seed = values.pop("seed")
            values.setdefault("seeds", seed)
        act_values = {k: values.pop(k) for k in self._activation_keys() & set(values)} if self.activation else {}
        unknown = sorted(set(values) - set(self.fields))
        if unknown:
            raise ConfigError(f"{self.name} does not take {', '.join(unknown)}; it takes {', '.join(self.fields)}")
        base = {k: f.default for k, f in self.fields.items() if f.default is not dataclasses.MISSING}
        base.update({k: f.default_factory() for k, f in self.fields.items()
                     if f.default_factory is not dataclasses.MISSING})
        if self.defaults is not None:
            base.update({k: v for k, v in self.defaults(values).items() if k in self.fields})
        typed = {k: parse_seeds(v) if k == "seeds" else _coerce(k, self.types[k], v) for k, v in values.items()}
        changed = {k for k, v in typed.items() if k not in base or _plain(v) != _plain(base[k])}
        merged = {**base, **typed}
        extra: dict[str, Any] = {}
        if self.activation:
            extra["act_kwargs"] = self._activation_arguments(merged, act_values, changed)
        if "probe" in merged:
            from probes import PROBES  # (imports torch)

            unknown = [p for p in merged["probe"] if p not in PROBES]
            if unknown:
                raise ConfigError(f"unknown probe {unknown[0]!r}; choose from {', '.join(sorted(PROBES))}")
        for k in sorted(changed):
            f = self.fields[k]
            choices = _choices(f)
            if choices is not None and merged[k] not in choices:
                raise ConfigError(f"{k} must be one of {', '.join(map(str, choices))}, got {merged[k]!r}")
        try:
            cfg = self.config_class(**merged, **extra)
        except ConfigError:
            raise
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{self.name}: {err}") from None
        ignored = [k for k in sorted(changed) if "applies" in self.fields[k].metadata
                   and not self.fields[k].metadata["applies"](cfg)]
        if ignored:
            raise ConfigError(f"{', '.join(ignored)} would be ignored here ("
                              + "; ".join(f"{k} is for {self.fields[k].metadata.get('applies_text', '?')}"
                                          for k in ignored) + ")")
        return {self.key: self.name, **self.config_dict(cfg)}

    def _activation_arguments(self, merged: dict[str, Any], given: dict[str, Any], changed: set[str]) -> dict:
        """The chosen activation's arguments in ``given`` (checked by its spec); ConfigError for an unknown activation
        or an argument it does not take (a setting of its own only where changed from its default)."""
        from interference.activation_spec import activation_names, activation_spec

        act = merged.get(self.activation)
        if act not in activation_names():
            raise ConfigError(f"unknown activation {act!r}; choose from {', '.join(activation_names())}")
        spec = activation_spec(act)
        all_arguments = {a for n in activation_names() for a in activation_spec(n).arguments}
        ignored = sorted(k for k in changed if k in all_arguments and k not in spec.arguments)
        if ignored:
            raise ConfigError(f"{', '.join(ignored)} would be ignored here ({act} takes "
                              f"{', '.join(spec.arguments) or 'no arguments'})")
        try:
            return spec.parse_arguments(given)
        except ValueError as err:
            raise ConfigError(str(err)) from None

    def config_dict(self, cfg: Any) -> dict[str, Any]:
        """``cfg`` as a flat config: fields in their order, ``act_kwargs``'s arguments as keys of their own in its
        place, tuples as lists."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(cfg):
            if f.name == "act_kwargs" and self.activation:
                out.update(getattr(cfg, f.name))
            elif f.name in self.fields:
                out[f.name] = _plain(getattr(cfg, f.name))
        return out

    def settings(self, config: Mapping[str, Any]) -> Any:
        """The settings dataclass of a config :meth:`make_config` made."""
        own = {k: v for k, v in config.items() if k in self.fields}
        if self.side_by_side:
            own["seeds"] = tuple(own["seeds"])
        extra = {}
        if self.activation:
            extra["act_kwargs"] = {k: v for k, v in config.items() if k not in self.fields and k != self.key}
        return self.config_class(**own, **extra)

    def run_dir(self, config: Mapping[str, Any], out: Path) -> Path:
        path = Path(out) / self.name
        if callable(self.folder):
            return path / self.folder(config)
        for key in self.folder:
            path = path / f"{key}={config[key]}"
        return path if self.side_by_side else path / f"seed{config['seed']}"

    def train(self, run: RunFolder) -> dict[str, Any]:
        cfg = self.settings(run.config)
        run.start()
        return run.finish(self.loop(run, cfg))
