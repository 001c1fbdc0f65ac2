"""One CLI for every learner: ``python -m agents.train COMMAND [flags]`` (``--help`` on each command)."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from probes.plugins import PluginError, load_plugins
from runlog import RunLogWriteError

from .commands import commands, get_command
from .errors import EXIT_CONFIG, EXIT_IO, ConfigError, exit_status
from .runlock import run_lock

__all__ = ["main", "build_parser"]


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default where it has one; a ``None`` default means "from the hyper-parameter files", which the
    flag's own help says."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The CLI parser; only the ``selected`` command's module is imported (the others list their name)."""
    parser = argparse.ArgumentParser(prog="python -m agents.train", description=__doc__)
    parser.add_argument("--import", dest="plugins", action="append", metavar="MODULE",
                        help="import a plugin module first (its activations, probes, commands); repeatable, "
                             "allowed anywhere on the command line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in commands():
        if name != selected:
            sub.add_parser(name, help=f"see python -m agents.train {name} --help")
            continue
        cmd = get_command(name)
        p = sub.add_parser(name, help=cmd.help, description=cmd.help,
                           formatter_class=_HelpFormatter)
        p.add_argument("--out", type=Path, default=Path("runs"), help="root folder of run directories")
        if getattr(cmd, "resumable", False):
            p.add_argument("--resume", action="store_true",
                           help="continue the run in its folder from its last checkpoint (same flags as the first "
                                "time), exactly as if it had not stopped; a finished run is left as it is, a run "
                                "without a checkpoint starts afresh")
        cmd.add_arguments(p)
        p.set_defaults(command_parser=p)  # main reports unknown flags with this command's usage
    return parser


def unwritable(folder: Path) -> str | None:
    """Why files cannot be created in ``folder`` (a read-only file system, permissions, ...), or None."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as err:
        return err.strerror or str(err)


def split_imports(argv: list[str]) -> tuple[list[str], list[str]]:
    """(modules named by ``--import M`` or ``--import=M``, the other arguments), so that plugins are loaded
    before the parser lists activations, probes and commands."""
    modules, rest, it = [], [], iter(argv)
    for arg in it:
        if arg == "--import":
            modules.append(next(it, ""))
        elif arg.startswith("--import="):
            modules.append(arg.partition("=")[2])
        else:
            rest.append(arg)
    return modules, rest


def _rounded(value: object) -> object:
    """Floats to 6 significant digits, for people (``177.151`` steps/s, not ``177.15101011351862``); the files keep
    full precision."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    modules, argv = split_imports(sys.argv[1:] if argv is None else list(argv))
    try:
        load_plugins(modules)
    except PluginError as err:
        print(f"python -m agents.train: error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    parser = build_parser(next((a for a in argv if a in commands()), None))
    namespace, unknown = parser.parse_known_args(argv)
    args = vars(namespace)
    name, out, resume = args.pop("command"), args.pop("out"), args.pop("resume", False)
    args.pop("plugins", None)
    command_parser = args.pop("command_parser")
    if unknown:  # with the command's usage and the nearest of its flags
        near = difflib.get_close_matches(unknown[0], re.findall(r"--[\w-]+", command_parser.format_usage()), n=1)
        command_parser.error(f"unrecognized arguments: {' '.join(unknown)}"
                             + (f" (did you mean {near[0]}?)" if near else ""))
    cmd = get_command(name)
    try:
        config = cmd.make_config({k: v for k, v in args.items() if v is not None})
    except ConfigError as err:
        parser.exit(EXIT_CONFIG, f"{parser.prog} {name}: error: {err}\n")
    run_dir = cmd.run_dir(config, out)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        parser.exit(EXIT_CONFIG, f"{parser.prog} {name}: error: cannot create the run directory {run_dir}: {err.strerror}\n")
    if (problem := unwritable(run_dir)) is not None:
        parser.exit(EXIT_CONFIG, f"{parser.prog} {name}: error: cannot write in the run directory {run_dir}: {problem}\n")
    print(f"run folder: {run_dir}", file=sys.stderr, flush=True)  # (named by the settings that differ from defaults)
    try:
        with run_lock(run_dir):
            summary = cmd.run(config, run_dir, resume=True) if resume else cmd.run(config, run_dir)
    except Exception as err:  # noqa: BLE001 - the errors a run ends with (agents.errors): one line, their status
        status = exit_status(err)
        if status is None:
            raise
        print(f"{parser.prog} {name}: error: {err}", file=sys.stderr)
        if isinstance(err, RunLogWriteError):
            sys.stdout.flush()
            sys.stderr.flush()
            # HDF5 objects of a file whose writes failed can crash the interpreter when they are freed at exit
            # (segmentation fault): leave at once, with the status that says what happened
            os._exit(EXIT_IO)
        return status
    print(json.dumps(_rounded(summary), indent=1, default=str))
    return 1 if summary.get("status") == "nan" else 0  # a diverged run is a failure for scripts and && chains


if __name__ == "__main__":
    sys.exit(main())
