"""Command line: ``python -m reports RUN.h5 [RUN2.h5 ... | DIR ...] -o OUT/ [--steps 1000,5000]``.

Reads the run logs (directories: every ``*.h5`` under them), writes the figures and ``OUT/index.html``, prints
the path of ``index.html``. A path that is missing or not a run log is reported on one line; exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from probes.runlog import Run, RunLogError, find_runs, read_run

from .build import build_report


def _steps(text: str) -> list[int]:
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not steps:
        raise argparse.ArgumentTypeError("expected at least one step")
    return steps


def _read(args: Sequence[str]) -> list[Run]:
    """Run logs of the given files and directories; RunLogError (naming the path) if one cannot be read."""
    paths: list[str] = []
    for arg in args:
        try:
            found = find_runs(arg)
        except FileNotFoundError:
            raise RunLogError(f"{arg}: no such file or directory") from None
        if not found:
            raise RunLogError(f"{arg}: no *.h5 run logs in this directory")
        paths += found
    runs = []
    for path in dict.fromkeys(paths):
        try:
            runs.append(read_run(path))
        except RunLogError as err:
            raise RunLogError(str(err) if path in str(err) else f"{path}: {err}") from err
        except OSError as err:
            raise RunLogError(f"{path}: cannot read: {err.strerror or err}") from err
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with `argv` (default ``sys.argv[1:]``); returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m reports",
                                     description="Figures and index.html from run logs (HDF5).")
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run log (.h5) or directory of run logs")
    parser.add_argument("-o", "--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--steps", type=_steps, default=None,
                        help="comma-separated training steps of the heatmap/NTK panels "
                             "(nearest records; default: midpoint and end of training)")
    parser.add_argument("--window", type=int, default=1,
                        help="episodes averaged (trailing) before the learning curves (default 1)")
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error("--window must be >= 1")
    try:
        runs = _read(args.runs)
    except RunLogError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(build_report(runs, args.out, steps=args.steps, window=args.window))
    return 0


if __name__ == "__main__":
    sys.exit(main())
