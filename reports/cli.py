"""What the report commands share: reading run logs named on the command line, the output folder, warnings and
step lists."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from runlog import check_logs
from runlog import Run, RunLogError, find_runs, read_run

__all__ = ["OutputDirError", "StudyInputError", "load_runs", "output_dir", "steps_arg", "study_parser", "study_inputs",
           "open_study", "publish_study", "warn"]


class StudyInputError(ValueError):
    """The runs given to a study cannot be reported together (e.g. two configs where the study expects one)."""


class OutputDirError(ValueError):
    """The output folder cannot be created or written to."""


def warn(message: str) -> None:
    """Print ``warning: MESSAGE`` as one line on stderr."""
    print(f"warning: {message}".replace("\n", " "), file=sys.stderr)


def _read(path: str) -> Run:
    """`read_run` of a file `check_logs` passed, with every failure a RunLogError whose message starts with `path`."""
    try:
        return read_run(path, timeout_s=None)
    except RunLogError as err:
        raise RunLogError(str(err) if path in str(err) else f"{path}: {err}") from err
    except OSError as err:
        raise RunLogError(f"{path}: cannot read: {err.strerror or err}") from err


def load_runs(paths: Sequence[str | os.PathLike]) -> list[Run]:
    """Every run log in `paths` (files, or directories searched recursively), each once.

    Every file is first read completely in a child process (:func:`runlog.check_logs`, 5 s per file), so
    a corrupt file cannot hang or crash the report. A run log found in a directory that cannot be read is skipped
    with a warning on stderr naming it and the reason. Raises RunLogError naming the path for a missing path, a
    directory without ``*.h5`` files, a file named in `paths` that is not a readable run log, or when no run log at
    all is readable.
    """
    named: dict[str, bool] = {}  # real path -> named in `paths` (not only found in a directory)
    for arg in paths:
        try:
            here = find_runs(arg)
        except FileNotFoundError:
            raise RunLogError(f"{arg}: no such file or directory") from None
        if not here:
            raise RunLogError(f"{arg}: no *.h5 run logs in this directory")
        for path in here:
            real = os.path.realpath(path)
            named[real] = named.get(real, False) or not os.path.isdir(arg)
    runs, unreadable = [], []
    problems = check_logs(list(named))  # in a child process: a corrupt file cannot hang or crash this one
    for path, strict in named.items():
        try:
            if problems.get(path):
                raise RunLogError(f"{path}: {problems[path]}" if path not in problems[path] else problems[path])
            runs.append(_read(path))
        except RunLogError as err:
            if strict:
                raise
            unreadable.append(str(err))
    if not runs:
        raise RunLogError(unreadable[0] if len(unreadable) == 1
                          else f"none of the {len(unreadable)} run logs is readable; the first: {unreadable[0]}")
    for message in unreadable:
        warn(f"skipping {message}")
    return runs


def output_dir(path: str | os.PathLike) -> Path:
    """`path` as a folder the report can be written into, created (with its parents) if missing.

    Raises OutputDirError naming `path` if it is an existing file, or cannot be created or written to.
    """
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise OutputDirError(f"{out}: output path exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        raise OutputDirError(f"{out}: cannot write the report there: {err.strerror or err}") from None
    return out


def steps_arg(text: str) -> list[int]:
    """argparse type: comma-separated training steps, e.g. ``1000,5000``."""
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not steps:
        raise argparse.ArgumentTypeError("expected at least one step")
    return steps


def study_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The arguments of a study report (``reports.classic``, ``reports.minatar``): run logs or folders, ``-o OUT``."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="run logs or directories of them")
    parser.add_argument("-o", "--out", type=Path, required=True, help="output folder")
    return parser


def study_inputs(runs: Sequence[Run], out: str | os.PathLike,
                 select: Callable[[list[Run]], tuple[list[Any], list[str]]],
                 nothing: str) -> tuple[list[Any], Path]:
    """The items a study's ``select`` makes of `runs` (its warnings printed), and the output folder.

    Raises RunLogError(`nothing`) if there are none, OutputDirError if `out` is unusable.
    """
    items, warnings = select(list(runs))
    for message in warnings:
        warn(message)
    if not items:
        raise RunLogError(nothing)
    return items, output_dir(out)


def open_study(prog: str, description: str, argv: Sequence[str] | None,
               select: Callable[[list[Run]], tuple[list[Any], list[str]]], what: str
               ) -> tuple[list[Run], list[Any], Path] | None:
    """A study report's start: its arguments (:func:`study_parser`), runs and items (:func:`study_inputs`; ``what``
    names the runs it needs in the error when there are none). None, with the error printed, on bad input."""
    args = study_parser(prog, description).parse_args(argv)
    try:
        runs = load_runs(args.paths)
        items, out = study_inputs(runs, args.out, select, f"no {what} under {', '.join(map(str, args.paths))}")
    except (RunLogError, OutputDirError, StudyInputError) as err:
        print(f"error: {err}", file=sys.stderr)
        return None
    return runs, items, out


def publish_study(out: Path, title: str, tables: Sequence[Any], sections: dict[str, list[tuple[str, str]]],
                  notes: Sequence[str], rows: Sequence[Sequence[str]]) -> int:
    """Write a study's ``index.html`` (:func:`reports.html.write_index`), print its table rows and the page's path;
    the exit code (0)."""
    from .html import write_index

    index = write_index(out, title, list(tables), sections, notes=list(notes))
    for row in rows:
        print("  ".join(row))
    print(index)
    return 0
