"""Command line: ``python -m reports RUN.h5 [RUN2.h5 ... | DIR ...] -o OUT/ [--steps 1000,5000]``.

Reads the run logs (directories: every ``*.h5`` under them; an unreadable one found there is skipped with a
warning), writes the figures and ``OUT/index.html``, prints the path of ``index.html``. A path that is missing or
not a run log, no readable run log, or an output path that cannot be written is reported on one line; exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from runlog import RunLogError

from .build import build_report
from .cli import OutputDirError, load_runs, output_dir, steps_arg


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with `argv` (default ``sys.argv[1:]``); returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m reports",
                                     description="Figures and index.html from run logs (HDF5).")
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run log (.h5) or directory of run logs")
    parser.add_argument("-o", "--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--steps", type=steps_arg, default=None,
                        help="comma-separated training steps of the heatmap/NTK panels "
                             "(nearest records; default: midpoint and end of training)")
    parser.add_argument("--window", type=int, default=1,
                        help="episodes averaged (trailing) before the learning curves (default 1)")
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error("--window must be >= 1")
    try:
        runs = load_runs(args.runs)
        out = output_dir(args.out)
    except (RunLogError, OutputDirError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(build_report(runs, out, steps=args.steps, window=args.window))
    return 0


if __name__ == "__main__":
    sys.exit(main())
