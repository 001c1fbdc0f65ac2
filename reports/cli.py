"""What the report commands share: reading run logs named on the command line, and step lists."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from probes.runlog import Run, RunLogError, find_runs, read_run

__all__ = ["load_runs", "steps_arg"]


def load_runs(paths: Sequence[str | os.PathLike]) -> list[Run]:
    """Every run log in `paths` (files, or directories searched recursively), each once.

    Raises RunLogError naming the path for a missing path, a directory without ``*.h5`` files, or a file that is
    not a readable run log.
    """
    found: list[str] = []
    for arg in paths:
        try:
            here = find_runs(arg)
        except FileNotFoundError:
            raise RunLogError(f"{arg}: no such file or directory") from None
        if not here:
            raise RunLogError(f"{arg}: no *.h5 run logs in this directory")
        found += here
    runs = []
    for path in dict.fromkeys(os.path.realpath(p) for p in found):
        try:
            runs.append(read_run(path))
        except RunLogError as err:
            raise RunLogError(str(err) if path in str(err) else f"{path}: {err}") from err
        except OSError as err:
            raise RunLogError(f"{path}: cannot read: {err.strerror or err}") from err
    return runs


def steps_arg(text: str) -> list[int]:
    """argparse type: comma-separated training steps, e.g. ``1000,5000``."""
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not steps:
        raise argparse.ArgumentTypeError("expected at least one step")
    return steps
