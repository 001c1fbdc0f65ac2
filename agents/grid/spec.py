"""Grid files: the keys a grid takes, its configurations (the cross product of each sub-grid's lists), ``--axis``
values replacing a key's list, and reading a grid file."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..inputs import int_range, parse_yaml_value, read_yaml


GRID_KEYS = ("command", "fixed", "grids", "import", "engine", "population_size")


def expand(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """All configurations of a grid spec (``fixed`` merged into the cross product of each sub-grid's lists)."""
    if not isinstance(spec, Mapping) or "command" not in spec:
        raise ConfigError("a grid needs a 'command' (e.g. command: stream-sin) and 'grids' (a list of mappings)")
    unknown = set(spec) - set(GRID_KEYS)
    if unknown:
        raise ConfigError(f"unknown grid keys {sorted(unknown)}; allowed: {', '.join(GRID_KEYS)}")
    fixed = spec.get("fixed") or {}
    grids = spec.get("grids") or [{}]
    if not isinstance(fixed, Mapping) or not isinstance(grids, list) or not all(isinstance(g, Mapping) for g in grids):
        raise ConfigError("'fixed' must be a mapping and 'grids' a list of mappings of lists")
    out = []
    for grid in grids:
        keys = list(grid)
        values = [v if isinstance(v, list) else [v] for v in grid.values()]
        for combo in itertools.product(*values):
            out.append({**fixed, **dict(zip(keys, combo))})
    return out


def axis_values(text: str) -> list[Any]:
    """``--axis`` values: comma-separated numbers or words, ``A-B`` an inclusive integer range (``0-9``)."""
    out: list[Any] = []
    for item in (i.strip() for i in text.split(",")):
        span = int_range(item, "--axis")
        if span is not None:
            out.extend(span)
            continue
        for kind in (int, float):
            try:
                out.append(kind(item))
                break
            except ValueError:
                pass
        else:
            out.append(parse_yaml_value(item, "--axis") if item else item)
    return out


def with_axes(spec: Mapping[str, Any], axes: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """``spec`` with each key of ``axes`` taking those values in every sub-grid (replacing the key's list there, or
    its value in ``fixed`` and its ``set`` list; ``lr`` and ``learning_rate`` name one key), sub-grids made identical
    by that dropped: how a grid file scales by flags (``--axis seed=0-9 --axis lr=1e-3,3e-4``) without an edited
    copy."""
    from agents.rl.config import ALIASES

    def same(a: str, b: str) -> bool:
        return ALIASES.get(a, a) == ALIASES.get(b, b)

    fixed = {k: v for k, v in (spec.get("fixed") or {}).items() if not any(same(k, key) for key in axes)}
    if "set" in fixed:  # (KEY=VALUE items)
        items = [fixed["set"]] if isinstance(fixed["set"], str) else list(fixed["set"])
        fixed["set"] = [i for i in items if not any(same(str(i).partition("=")[0].strip(), key) for key in axes)]
    grids: list[dict[str, Any]] = []
    for grid in spec.get("grids") or [{}]:
        grid = {**{k: v for k, v in grid.items() if not any(same(k, key) for key in axes)},
                **{key: list(values) for key, values in axes.items()}}
        if grid not in grids:
            grids.append(grid)
    return {**spec, "fixed": fixed, "grids": grids}


def load_grid(path: str | Path) -> dict[str, Any]:
    """Read a YAML grid file, with errors that name the file."""
    spec = read_yaml(path, "grid")
    if not isinstance(spec, dict):
        raise ConfigError(f"grid file {path} must hold a mapping with 'command' and 'grids'")
    return spec
