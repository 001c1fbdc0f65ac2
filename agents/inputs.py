"""Reading what users give: YAML files (config, grid and hyper-parameter files) and seed lists, each failure a
:class:`agents.errors.ConfigError` of one line naming the input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

__all__ = ["MAX_SEED", "int_list", "int_range", "parse_seeds", "parse_yaml_value", "read_yaml", "yaml_error"]


#: the largest seed: NumPy, Gymnasium and torch take seeds below 2**32
MAX_SEED = 2**32 - 1


def parse_seeds(value: Any) -> tuple[int, ...]:
    """Seeds from a flag or config value (``3``, ``"0,1,2"`` or a list): distinct integers from 0 to
    :data:`MAX_SEED`, else a :class:`ConfigError` naming the value."""
    if isinstance(value, int):
        value = [value]
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    try:
        seeds = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"seeds must be integers, e.g. 0,1,2; got {value!r}") from None
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0 or max(seeds) > MAX_SEED:
        raise ConfigError(f"seeds must be distinct integers from 0 to {MAX_SEED}, got {value!r}")
    return seeds


def int_range(item: str, what: str) -> range | None:
    """``"A-B"`` as the inclusive range of integers from A to B (``None`` if ``item`` is not of that form);
    ConfigError naming ``what`` for a range whose end comes before its start."""
    lo, dash, hi = item.strip().partition("-")
    if not (dash and lo.isdigit() and hi.isdigit()):
        return None
    if int(hi) < int(lo):
        raise ConfigError(f"{what}: the range {item.strip()!r} is empty (its end comes before its start)")
    return range(int(lo), int(hi) + 1)


def int_list(text: str, what: str) -> list[int]:
    """Comma-separated integers and inclusive ranges (``"0-4"``, ``"0,2,5"``) from a flag; ConfigError naming the
    flag ``what`` and the bad item."""
    out: list[int] = []
    for item in (i.strip() for i in str(text).split(",")):
        span = int_range(item, what)
        if span is not None:
            out.extend(span)
            continue
        try:
            out.append(int(item))
        except ValueError:
            raise ConfigError(f"{what} takes integers and ranges, e.g. 0-4 or 0,2,5; got {item!r}") from None
    return out


def yaml_error(err: yaml.YAMLError) -> str:
    """A YAML parser's error in one line: what is wrong and where (line and column, 1-based)."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    context = getattr(err, "context", None)
    return f"{problem}{where}" + (f" ({context})" if context else "")


def parse_yaml_value(text: str, what: str) -> Any:
    """``text`` as a YAML value (``--set KEY=VALUE``, ``--axis KEY=V1,V2``); ConfigError naming ``what`` and the
    problem in one line."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{what}: {text!r} is not a valid YAML value: {yaml_error(err)}") from None


def read_yaml(path: str | Path, what: str) -> Any:
    """The YAML document in ``path``; ConfigError naming the file (as a ``what`` file) in one line if it is missing,
    not a regular file (a FIFO would block for ever), not UTF-8 text or not valid YAML."""
    path = Path(path)
    try:
        if not path.is_file():
            raise ConfigError(f"{what} file {path}: " + ("not a regular file" if path.exists() else "no such file"))
        return yaml.safe_load(path.read_bytes().decode("utf-8"))
    except OSError as err:
        raise ConfigError(f"cannot read {what} file {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{what} file {path} is not UTF-8 text (byte {err.start}: {err.reason})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{what} file {path} is not valid YAML: {yaml_error(err)}") from None
