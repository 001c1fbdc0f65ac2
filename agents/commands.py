"""The registry of learners: one ``Command`` per ``agents.train`` subcommand, for the CLI and the grid runner.

A command turns flags (or a grid entry) into a validated config dict, names its run folder and trains into it
(:mod:`agents.lifecycle` runs it there). The same validation serves both paths, so a bad grid entry fails the way a
bad flag does.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import textwrap
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from .errors import ConfigError
from .lifecycle import RunFolder

__all__ = ["Command", "Population", "add_activation_flags", "commands", "first_sentence", "get_command", "population",
           "probe_list", "register_command"]


_RST = [(re.compile(r":[\w:]+:`~?([^`]+)`"), r"\1"), (re.compile(r"``([^`]+)``"), r"\1"),
        (re.compile(r"`([^`]+)`"), r"\1")]  # roles, literals, references: their text
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "cf.", "vs.", "al.")


def first_sentence(doc: str | None, limit: int = 100) -> str:
    """The first sentence of a docstring, as plain text (reST markup and the final period removed) for a one-line
    help entry.

    A sentence that introduces a list (it ends with ``:``) is followed by the list's items (the names that open the
    ``*`` bullets); one longer than ``limit`` characters is cut at its first ``;``. Empty without a docstring.
    """
    if not doc or not doc.strip():
        return ""
    paragraphs = re.split(r"\n\s*\n", textwrap.dedent(doc).strip())
    text = " ".join(paragraphs[0].split())
    for pattern, plain in _RST:
        text = pattern.sub(plain, text)
    end = len(text)
    for m in re.finditer(r"[.!?](?=\s|$)", text):
        if not text[:m.end()].endswith(_ABBREVIATIONS):
            end = m.end()
            break
    sentence = text[:end]
    if sentence.endswith(":"):
        bullets = re.findall(r"^\s*\*\s+([^:(]*)", textwrap.dedent(doc), flags=re.M)  # each up to ":" or "("
        items = [name for bullet in bullets for name in re.findall(r"``([^`]+)``", bullet)]
        sentence = f"{sentence} {', '.join(items)}" if items else sentence[:-1]
    if len(sentence) > limit and "; " in sentence:
        sentence = sentence[:sentence.index("; ")]
    return sentence.removesuffix(".")


def probe_list(indent: str = "  ", width: int | None = None) -> str:
    """One entry per registered probe (built-in, then plugins' loaded so far): its name and the first sentence of its
    class docstring (:func:`first_sentence`), wrapped under that sentence at ``width`` columns (default: the
    terminal's, as argparse's help)."""
    from probes import PROBES  # (imports torch: only when a parser is built)

    width = shutil.get_terminal_size().columns - 2 if width is None else width
    column = max((len(name) for name in PROBES), default=0) + 2
    lines = []
    for name, cls in PROBES.items():
        text = f"{indent}{name:<{column}}{first_sentence(cls.__doc__) or '(no description)'}"
        lines.extend(textwrap.wrap(text, max(width, 60), subsequent_indent=" " * (len(indent) + column),
                                   break_on_hyphens=False))
    return "\n".join(lines)


def add_activation_flags(parser: argparse.ArgumentParser, reserved: Collection[str]) -> None:
    """A flag for each argument of the registered activations (``--d``, ``--k``, a plugin's own), except the names
    in ``reserved`` (the command's settings): its help names the activations that take it."""
    from interference.activation_spec import activation_names, activation_spec

    takes: dict[str, list[str]] = {}
    for name in activation_names():
        for arg in activation_spec(name).arguments:
            takes.setdefault(arg, []).append(name)
    for arg in sorted(set(takes) - set(reserved)):
        declared = activation_spec(takes[arg][0]).arguments[arg]
        flag, text = f"--{arg.replace('_', '-')}", f"{declared.help} [{', '.join(takes[arg])}]"
        if declared.type is bool:
            parser.add_argument(flag, dest=arg, action=argparse.BooleanOptionalAction, help=text)
        else:
            parser.add_argument(flag, dest=arg, type=declared.type, metavar="N" if declared.type is int else "X",
                                help=text)


class Command(Protocol):
    name: str
    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Declare the subcommand's flags (defaults ``None`` where the config supplies the default)."""

    def make_config(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """A complete, validated config from flag values or a grid entry; raises :class:`ConfigError`."""

    def run_dir(self, config: Mapping[str, Any], out: Path) -> Path:
        """The run's folder under ``out`` (one per configuration and seed)."""

    def train(self, run: RunFolder) -> dict[str, Any]:
        """Train into ``run`` (:class:`agents.lifecycle.RunFolder`: its folder, config and ``resume``), writing the run's
        files through it from :meth:`~agents.lifecycle.RunFolder.start` to :meth:`~agents.lifecycle.RunFolder.finish`, and
        return the summary (JSON-able). A command that checkpoints sets ``resumable = True`` and continues from its
        checkpoint when ``run.resume`` is set."""


class Population(Protocol):
    """A learner's engine for training several of its runs together, in one process (a command that has one sets
    its ``population`` attribute to it; the CLI's ``--seeds`` and grids with ``engine: population`` use it)."""

    def group(self, config: Mapping[str, Any]) -> str:
        """What the runs of one population share: runs whose configs give equal strings may train together (the
        config but the keys its members may differ in)."""

    def refusal(self, configs: Sequence[Mapping[str, Any]]) -> str | None:
        """Why these runs cannot train as one population (a setting or env the engine does not take, configs
        differing beyond what :meth:`group` allows), or None."""

    def train(self, runs: Sequence[RunFolder], out: Path) -> list[dict[str, Any]]:
        """Train ``runs`` (locked; ``resume`` on all or none) as one population whose checkpoint lies under ``out``;
        their summaries, in order."""

    def checkpointed(self, out: Path) -> list[list[Path]]:
        """The run folders of each population under ``out`` that a ``--resume`` can continue from its checkpoint,
        in the checkpoint's order (a grid keeps them together whatever its own grouping)."""

    def capacity(self, configs: Sequence[Mapping[str, Any]], at_once: int = 1) -> int | None:
        """The most runs like these one population should hold on their device while ``at_once`` populations
        train side by side on the machine (``population_size: auto`` grids: its share of the memory, say), or None
        for no limit."""

    def describe(self, configs: Sequence[Mapping[str, Any]]) -> str:
        """A short note on one population of these runs for a grid's plan (its memory and device)."""

    def memory_bytes(self, configs: Sequence[Mapping[str, Any]]) -> int | None:
        """Estimated bytes of one population of these runs on its device (a grid's share of a GPU), or None."""

    def host_bytes(self, configs: Sequence[Mapping[str, Any]]) -> int | None:
        """Estimated bytes one population of these runs holds in host memory beside its device's (replays kept on
        the host: what a Ray task asks its node for), or None."""

    def seconds(self, configs: Sequence[Mapping[str, Any]]) -> float | None:
        """Estimated seconds to train these runs as one population here (a grid's plan), or None where it cannot
        tell (their device is not on this machine)."""


def population(command: Command) -> Population | None:
    """The command's population engine (its ``population`` attribute), or None."""
    return getattr(command, "population", None)


#: the modules of the built-in learners, each defining ``COMMANDS`` (subcommand name -> Command); imported on first
#: use, cheapest first (SB3 and ALE load slowly)
_MODULES = ("agents.stream.commands", "agents.classinc.commands", "agents.rl.commands")


def _built_in() -> Iterator[dict[str, Command]]:
    for module in _MODULES:
        yield importlib.import_module(module).COMMANDS


_REGISTERED: dict[str, Command] = {}  # commands of plugins (register_command)


def register_command(command: Command, *, replace: bool = False) -> Command:
    """Make ``command`` (a learner or algorithm: the :class:`Command` protocol, e.g. an
    :class:`agents.algorithm.Algorithm`) a subcommand of ``agents.train`` and usable in grid files."""
    if command.name in commands() and not replace:
        raise ValueError(f"command {command.name!r} exists already (pass replace=True to redefine it)")
    _REGISTERED[command.name] = command
    return command


def commands() -> list[str]:
    """Every command's name: the built-in learners', then the plugins' (this imports every learner's module)."""
    built_in = [name for table in _built_in() for name in table]
    return [*built_in, *(n for n in _REGISTERED if n not in built_in)]


def get_command(name: str) -> Command:
    if name in _REGISTERED:
        return _REGISTERED[name]
    for table in _built_in():
        if name in table:
            return table[name]
    raise ConfigError(f"unknown command {name!r}; choose from {', '.join(commands())} (a plugin's command needs "
                      "--import MODULE)")
