"""One CLI for every learner: ``python -m agents.train COMMAND [flags]`` (``--help`` on each command)."""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path

from probes.plugins import PluginError, load_plugins

from .commands import Command, commands, get_command, population
from .errors import EXIT_CONFIG, ConfigError
from .inputs import int_list, parse_seeds
from .lifecycle import execute, open_runs, report_errors, stopped
from .signals import STOP_SIGNALS, handling

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
    values = {k: v for k, v in args.items() if v is not None}
    try:
        configs = [cmd.make_config(v) for v in _per_seed(values)]
    except ConfigError as err:
        parser.exit(EXIT_CONFIG, f"{parser.prog} {name}: error: {err}\n")
    prog = f"{parser.prog} {name}"
    if len(configs) == 1:
        run_dir = cmd.run_dir(configs[0], out)
        print(f"run folder: {run_dir}", file=sys.stderr, flush=True)  # (named by the settings that differ from defaults)
        status, summary = report_errors(prog, lambda: execute(cmd.train, configs[0], run_dir, resume=resume))
        summaries = None if summary is None else [summary]
    else:
        status, summaries = report_errors(prog, lambda: _train_runs(cmd, configs, out, resume))
    if summaries is None:
        return status
    print(json.dumps(_rounded(summaries[0] if len(summaries) == 1 else summaries), indent=1, default=str))
    # a diverged run is a failure for scripts and && chains
    return 1 if any(s.get("status") == "nan" for s in summaries) else 0


def _per_seed(values: dict) -> list[dict]:
    """The flag values of each run: one per seed of ``--seeds`` (``seed_list``), or the values as they are."""
    if "seed_list" not in values:
        return [values]
    if "seed" in values:
        raise ConfigError("give --seed or --seeds, not both")
    seeds = parse_seeds(int_list(values.pop("seed_list"), "--seeds"))
    return [{**values, "seed": seed} for seed in seeds]


def _train_runs(cmd: Command, configs: list[dict], out: Path, resume: bool) -> list[dict]:
    """Train the runs of ``configs`` (one folder each): as one population where the command has a population engine
    that takes them, else one after another; their summaries."""
    dirs = [cmd.run_dir(config, out) for config in configs]
    engine = population(cmd)
    why = engine.refusal(configs) if engine is not None else None
    if engine is not None and why is None:
        print(f"{len(configs)} runs as one population, run folders: {', '.join(map(str, dirs))}", file=sys.stderr,
              flush=True)
        with handling(STOP_SIGNALS, stopped), open_runs(dirs, configs, resume=resume) as runs:
            return engine.train(runs, out)
    if why is not None:
        print(f"note: {why}; the {len(configs)} runs train one after another", file=sys.stderr)
    summaries = []
    for config, run_dir in zip(configs, dirs):
        print(f"run folder: {run_dir}", file=sys.stderr, flush=True)
        summaries.append(execute(cmd.train, config, run_dir, resume=resume))
    return summaries

if __name__ == "__main__":
    sys.exit(main())
