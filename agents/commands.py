"""The registry of learners: one ``Command`` per ``agents.train`` subcommand, for the CLI and the grid runner.

A command turns flags (or a grid entry) into a validated config dict and runs it into a run directory. The same
validation serves both paths, so a bad grid entry fails the way a bad flag does.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import textwrap
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Protocol

from .errors import ConfigError

__all__ = ["Command", "add_activation_flags", "commands", "first_sentence", "get_command", "probe_list",
           "register_command"]


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

    def run(self, config: Mapping[str, Any], run_dir: Path) -> dict[str, Any]:
        """Train, write the run's files into ``run_dir`` and return a small summary (JSON-able). A command that
        checkpoints sets ``resumable = True`` and takes ``resume=True`` to continue from its checkpoint."""


# subcommand name -> module defining ``COMMAND``; modules are imported on first use (SB3/ALE load slowly).
_MODULES = {
    "stream-sin": "agents.stream.commands",
    "edit": "agents.stream.commands",
    "dqn": "agents.rl.commands",
    "rainbow": "agents.rl.commands",
    "ppo": "agents.rl.commands",
    "sac": "agents.rl.commands",
    "class-inc": "agents.classinc.commands",
}


_REGISTERED: dict[str, Command] = {}  # commands of plugins (register_command)


def register_command(command: Command, *, replace: bool = False) -> Command:
    """Make ``command`` (a learner or algorithm: the :class:`Command` protocol, e.g. an
    :class:`agents.algorithm.Algorithm`) a subcommand of ``agents.train`` and usable in grid files."""
    if command.name in commands() and not replace:
        raise ValueError(f"command {command.name!r} exists already (pass replace=True to redefine it)")
    _REGISTERED[command.name] = command
    return command


def commands() -> list[str]:
    return [*_MODULES, *(n for n in _REGISTERED if n not in _MODULES)]


def get_command(name: str) -> Command:
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in _MODULES:
        raise ConfigError(f"unknown command {name!r}; choose from {', '.join(commands())} (a plugin's command needs "
                          "--import MODULE)")
    return importlib.import_module(_MODULES[name]).COMMANDS[name]
