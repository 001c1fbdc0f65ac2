"""One declaration for a learner with its own training loop: its settings (a typed dataclass) and its loop.

:class:`Algorithm` turns that declaration into an ``agents.train`` subcommand and a grid-runner command (the
:class:`agents.commands.Command` protocol): one flag per setting, typed validation of flags, grid entries and
``--config`` files alike, one run folder per configuration and seed. Register it with
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
from .inputs import read_yaml
from .lifecycle import RunFolder

__all__ = ["Algorithm"]


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


class Algorithm:
    """A learner declared once: ``name``, one-line ``help``, its settings dataclass ``config`` (field types, defaults
    and ``metadata["help"]`` make the flags), its loop ``train(run, settings) -> summary`` (``run``: the
    :class:`agents.lifecycle.RunFolder`) and the settings that name its run folder:
    ``OUT/<name>/<field>=<value>.../seed<seed>`` (``config`` needs a ``seed`` field)."""

    def __init__(self, name: str, help: str, config: type, train: Callable[[RunFolder, Any], dict[str, Any]], *,
                 folder: Sequence[str] = ()) -> None:
        if not dataclasses.is_dataclass(config):
            raise TypeError(f"Algorithm {name!r}: config must be a dataclass, got {config!r}")
        self.name, self.help, self.config_class, self.loop, self.folder = name, help, config, train, tuple(folder)
        self.types = typing.get_type_hints(config)
        self.fields = {f.name: f for f in dataclasses.fields(config) if f.init}  # field(init=False): derived
        missing = [k for k in ("seed", *self.folder) if k not in self.fields]
        if missing:
            raise TypeError(f"Algorithm {name!r}: config has no fields {missing}")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        S = argparse.SUPPRESS
        parser.add_argument("--config", default=S, metavar="FILE", help="YAML file of settings (a run's config.yaml)")
        parser.add_argument("--seeds", dest="seed_list", default=S, metavar="SEEDS",
                            help="several runs, one per seed (e.g. 0-4 or 0,2,5), each in its own run folder, one "
                                 "after another")
        for name, f in self.fields.items():
            kind = self.types[name]
            default = f.default if f.default is not dataclasses.MISSING else None
            text = f"{f.metadata.get('help', name)} (default: {default})"
            flag = f"--{name.replace('_', '-')}"
            if kind is bool:
                parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=S, help=text)
            else:
                parser.add_argument(flag, dest=name, default=S, metavar=name.upper(), help=text)

    def make_config(self, values: Mapping[str, Any]) -> dict[str, Any]:
        values = dict(values)
        if "config" in values:
            saved = read_yaml(values.pop("config"), "config") or {}
            if not isinstance(saved, dict) or saved.pop("algo", self.name) != self.name:
                raise ConfigError(f"the config file is not a {self.name} config")
            values = {**saved, **values}
        unknown = sorted(set(values) - set(self.fields))
        if unknown:
            raise ConfigError(f"{self.name} does not take {', '.join(unknown)}; it takes {', '.join(self.fields)}")
        typed = {k: _coerce(k, self.types[k], v) for k, v in values.items()}
        try:
            cfg = self.config_class(**typed)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{self.name}: {err}") from None
        return {"algo": self.name, **{k: v for k, v in dataclasses.asdict(cfg).items() if k in self.fields}}

    def run_dir(self, config: Mapping[str, Any], out: Path) -> Path:
        path = Path(out) / self.name
        for key in self.folder:
            path = path / f"{key}={config[key]}"
        return path / f"seed{config['seed']}"

    def train(self, run: RunFolder) -> dict[str, Any]:
        cfg = self.config_class(**{k: v for k, v in run.config.items() if k != "algo"})
        run.start()
        return run.finish(self.loop(run, cfg))
