"""Checks of config values: each takes a value and returns it normalised, or raises ValueError saying what the
value must be ("a finite number", "an integer >= 1", ...); config resolution adds the key and the value."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = ["Check", "number", "integer", "real", "boolean", "choice", "mapping", "widths", "net_arch", "names",
           "device", "ent_coef", "target_entropy"]

Check = Callable[[Any], Any]


def number(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("a number, not a bool")
    if isinstance(value, str):
        try:
            value = float(value)  # PyYAML reads 1e-3 (no dot) as a string
        except ValueError:
            raise ValueError("a finite number") from None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("a finite number")
    return value


def integer(lo: int | None = None, optional: bool = False, hi: int | None = None) -> Callable[[Any], int | None]:
    def check(value: Any) -> int | None:
        if value is None and optional:
            return None
        v = number(value)
        if float(v) != int(v):
            raise ValueError("an integer")
        v = int(v)
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ValueError(f"an integer from {lo} to {hi:,}" if hi is not None else f"an integer >= {lo}")
        return v
    return check


def real(lo: float | None = None, hi: float | None = None, *, open_lo: bool = False,
           optional: bool = False) -> Callable[[Any], float | None]:
    def check(value: Any) -> float | None:
        if value is None and optional:
            return None
        v = float(number(value))
        if lo is not None and (v < lo or (open_lo and v == lo)):
            raise ValueError(f"a number {'>' if open_lo else '>='} {lo:g}")
        if hi is not None and v > hi:
            raise ValueError(f"a number <= {hi:g}")
        return v
    return check


def boolean(optional: bool = False) -> Callable[[Any], bool | None]:
    def check(value: Any) -> bool | None:
        if value is None and optional:
            return None
        if not isinstance(value, bool):
            raise ValueError("true or false")
        return value
    return check


def choice(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if str(value).lower() not in choices:
            raise ValueError(f"one of {', '.join(choices)}")
        return str(value).lower()
    return check


def mapping(value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("a mapping")
    return {str(k): v for k, v in value.items()}


def env_kwargs(value: Any) -> dict:
    kwargs = mapping(value)
    if kwargs.get("render_mode") is not None:
        raise ValueError("arguments of gymnasium.make without render_mode (runs are headless: a window or frames "
                         "rendered at every step would stall training)")
    return kwargs


#: the widest hidden layer accepted, and the most weights between hidden layers: bounds that refuse a typo's
#: billion-unit network before it is built (hundreds of GB) instead of exhausting the memory
MAX_WIDTH = 2**24
MAX_HIDDEN_WEIGHTS = 2**32


def widths(value: Any) -> list[int]:
    if isinstance(value, str):
        value = [v for v in value.replace(" ", "").split(",") if v]
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, Sequence):
        raise ValueError("a list of positive widths, e.g. [1000] or 256,256")
    out = [integer(1, hi=MAX_WIDTH)(v) for v in value]
    if sum(a * b for a, b in zip(out, out[1:])) > MAX_HIDDEN_WEIGHTS:
        raise ValueError(f"hidden layers with at most {MAX_HIDDEN_WEIGHTS:,} weights between them (memory)")
    return out


def net_arch(value: Any) -> list[int] | dict[str, list[int]]:
    if isinstance(value, Mapping):
        return {str(k): widths(v) for k, v in value.items()}
    return widths(value)


def names(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [v for v in value.replace(" ", "").split(",") if v]
    if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise ValueError("a list of names, e.g. gradcov,ntk")
    return list(dict.fromkeys(value))


#: SB3 logger output formats (``stable_baselines3.common.logger.configure``)
SB3_FORMATS = ("stdout", "csv", "tensorboard", "json", "log")


def sb3_formats(value: Any) -> list[str]:
    formats = names(value)
    if unknown := [f for f in formats if f not in SB3_FORMATS]:
        raise ValueError(f"SB3 logger formats from {', '.join(SB3_FORMATS)} (unknown: {', '.join(unknown)})")
    if "tensorboard" in formats:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise ValueError("formats whose package is installed (tensorboard needs pip install -e '.[tensorboard]')")
    return formats


def device(value: Any) -> str:
    value = str(value)
    if value == "auto":
        return value
    try:
        dev = torch.device(value)
    except RuntimeError:
        raise ValueError("cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("a device this machine has (no CUDA device is available)")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError("cpu, cuda, cuda:N or auto")
    return value


def ent_coef(value: Any) -> str | float:
    if isinstance(value, str) and value.startswith("auto"):
        if value != "auto":
            real(0.0, open_lo=True)(value[5:])
        return value
    return real(0.0)(value)


def target_entropy(value: Any) -> str | float:
    return value if value == "auto" else real()(value)


def scale_at(value: Any) -> bool | int | None:
    """``scale_probe_at``: null/false (no scaling), true (resolved to the YAML's run length) or a step count."""
    if value is None or isinstance(value, bool):
        return value
    return integer(1)(value)
