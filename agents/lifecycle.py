"""The life of a run folder, the same for every learner: :class:`RunFolder` and :func:`execute`.

A run folder holds, in the order they are written:

* ``config.yaml``: the resolved config (first: a folder is "begun with" this config);
* the learner's files: ``run.h5`` (the run log) and whatever it saves (``model.zip``, ``q_net.pt``, a checkpoint);
* ``summary.json``: the learner's summary (its ``status``: ``finished``, ``nan`` for a diverged run,
  ``interrupted``), written once every other file of the run is on disk;
* ``DONE.json`` (``{"config", "summary"}``): the folder's "finished", written last, for a run that ended (finished
  or diverged), never for an interrupted one.

:func:`execute` is how the CLI (``agents.train``) and the grid runner run a learner in a folder: it takes the
folder's lock (one writer per folder), hands the learner a :class:`RunFolder`, and turns the errors a run ends with into
the exit statuses of :mod:`agents.errors`. A learner starts the run (:meth:`RunFolder.start` or, resuming,
:meth:`RunFolder.finished` / :meth:`RunFolder.continue_run`), writes its files with :meth:`RunFolder.write` and ends with
:meth:`RunFolder.finish`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any, TypeVar

import yaml

from runlog import RunLogWriteError

from .errors import ConfigError, exit_status
from .runfolder import holds_config, write_run_file
from .runlock import run_lock
from .signals import STOP_SIGNALS, handling

__all__ = ["RunFolder", "execute", "open_runs", "report_errors", "stopped", "CONFIG", "SUMMARY", "DONE", "ERROR",
           "FINISHED", "read_done"]

CONFIG = "config.yaml"
SUMMARY = "summary.json"
#: the folder's "finished": written last, with the config and the summary
DONE = "DONE.json"
#: the traceback of a run that failed (written by the grid runner)
ERROR = "ERROR.txt"
#: the statuses of a run that ended (``DONE.json`` is written): trained to its end, or diverged
FINISHED = ("finished", "nan")


def read_done(folder: Path) -> dict[str, Any] | None:
    """The folder's ``DONE.json`` (``{"config", "summary"}``), or None if it has none or it is unreadable."""
    try:
        done = json.loads((Path(folder) / DONE).read_text())
    except (OSError, ValueError):
        return None
    return done if isinstance(done, dict) else None


class RunFolder:
    """One run folder from its first file to its last (see the module's docstring for the files and their order).

    ``path``: the run folder; ``config``: the resolved config (JSON-able); ``resume``: continue from the folder's
    checkpoint where it has one (``--resume``). Made by :func:`execute` (or :func:`open_runs`) under the folder's
    lock; a learner's ``train(run)`` reads these three and calls the methods below.
    """

    def __init__(self, path: str | Path, config: Mapping[str, Any], *, resume: bool = False) -> None:
        self.path, self.config, self.resume = Path(path), _plain(config), resume

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r}{', resume' if self.resume else ''})"

    # -- starting ---------------------------------------------------------------------------------------------------

    def finished(self, statuses: Sequence[str] = ("finished",)) -> dict[str, Any] | None:
        """The summary of a run that ended in this folder with this config (its ``DONE.json``, or for folders written
        without one its ``summary.json``, with a status in ``statuses``, beside a ``config.yaml`` equal to
        :attr:`config`; such a folder gets its ``DONE.json``); None if it holds none."""
        if not holds_config(self.path, self.config):
            return None
        done = read_done(self.path)
        summary = done.get("summary") if done is not None else self.summary()
        if not isinstance(summary, dict) or summary.get("status") not in statuses:
            return None
        if done is None:  # (a folder written without one: marked as it is)
            self.write(DONE, json.dumps({"config": self.config, "summary": summary}, indent=1, default=str))
        return summary

    def summary(self) -> dict[str, Any] | None:
        """The folder's ``summary.json``, or None."""
        try:
            summary = json.loads((self.path / SUMMARY).read_text())
        except (OSError, ValueError):
            return None
        return summary if isinstance(summary, dict) else None

    def start(self, files: Sequence[str] = (), checkpoint: Sequence[str] = ()) -> None:
        """Start afresh: :meth:`clear`, then :meth:`write_config`."""
        self.clear(files, checkpoint)
        self.write_config()

    def clear(self, files: Sequence[str] = (), checkpoint: Sequence[str] = ()) -> None:
        """Remove the files of an earlier run (the learner's ``files`` and ``checkpoint``, the folder's summary and
        ``DONE.json``), saying so."""
        stale = [name for name in dict.fromkeys((*files, SUMMARY, *checkpoint)) if (self.path / name).exists()]
        if stale:
            hint = (" (--resume continues it from its checkpoint)"
                    if not self.resume and any((self.path / name).exists() for name in checkpoint) else "")
            print(f"{self.path}: replacing the files of an earlier run ({', '.join(stale)}){hint}", file=sys.stderr)
        self.remove(*stale, DONE)

    def write_config(self) -> None:
        """Write ``config.yaml``: the folder is begun with :attr:`config`."""
        self.write(CONFIG, yaml.safe_dump(self.config, sort_keys=False))

    def continue_run(self, final: Sequence[str] = ()) -> None:
        """Continue from the folder's checkpoint: the end of the earlier attempt (its ``final`` files, summary and
        ``DONE.json``) is removed; ``config.yaml`` stays."""
        self.remove(*final, SUMMARY, DONE)

    # -- writing ----------------------------------------------------------------------------------------------------

    def write(self, name: str, content: str | bytes | Callable[[IO[bytes]], Any]) -> None:
        """Write the file ``name`` of the run whole or not at all (:func:`agents.runfolder.write_run_file`:
        :class:`agents.errors.RunWriteError`, exit status 4, if the disk refuses it)."""
        write_run_file(self.path / name, content)

    def remove(self, *names: str) -> None:
        """Remove files or folders of the run (those that exist)."""
        for name in names:
            path = self.path / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)

    # -- ending -----------------------------------------------------------------------------------------------------

    def finish(self, summary: Mapping[str, Any], *, checkpoint: Sequence[str] = ()) -> dict[str, Any]:
        """End the run: ``summary.json``; then for a run that ended (status in :data:`FINISHED`, or no status) its
        ``checkpoint`` files are removed (the other files hold the run) and ``DONE.json`` is written last. Returns
        ``summary``."""
        summary = dict(summary)
        # a stop signal meanwhile is recorded (agents.signals.RECEIVED: a grid stops after this task) but does not cut
        # the writing short: the run is over, and is marked so
        with handling(STOP_SIGNALS, lambda signum, frame: None):
            self.write(SUMMARY, json.dumps(summary, indent=1))
            if summary.get("status", "finished") in FINISHED:
                self.remove(*checkpoint)
                self.write(DONE, json.dumps({"config": self.config, "summary": summary}, indent=1, default=str))
        return summary


def _plain(value: Any) -> Any:
    """A JSON/YAML-safe copy (tuples become lists)."""
    return json.loads(json.dumps(value, default=str)) if value is not None else None


def _unwritable(folder: Path) -> str | None:
    """Why files cannot be created in ``folder`` (a read-only file system, permissions, ...), or None."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as err:
        return err.strerror or str(err)


@contextmanager
def open_runs(folders: Sequence[Path], configs: Sequence[Mapping[str, Any]], *, resume: bool = False
              ) -> Iterator[list[RunFolder]]:
    """The runs of ``folders`` with their ``configs``, each folder created and locked for the block
    (:class:`agents.errors.ConfigError` if one cannot be created or written in, :class:`RunFolderBusy` if another
    process writes there)."""
    with ExitStack() as locks:
        runs = []
        for folder, config in zip(folders, configs, strict=True):
            folder = Path(folder)
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise ConfigError(f"cannot create the run directory {folder}: {err.strerror or err}") from None
            if (problem := _unwritable(folder)) is not None:
                raise ConfigError(f"cannot write in the run directory {folder}: {problem}")
            locks.enter_context(run_lock(folder))
            runs.append(RunFolder(folder, config, resume=resume))
        yield runs


def stopped(signum: int, frame: Any) -> None:
    """The stop signals' handler where a learner has none of its own: exit with status 128 + signal (the learner's
    ``finally`` blocks close its files)."""
    raise SystemExit(128 + signum)


def execute(train: Callable[[RunFolder], dict[str, Any]], config: Mapping[str, Any], folder: str | Path, *,
            resume: bool = False) -> dict[str, Any]:
    """``train`` (a command's :meth:`~agents.commands.Command.train`) in ``folder`` with ``config``: the folder
    locked, a stop signal (SIGINT, SIGTERM) exiting with status 128 + signal where the learner does not handle it
    itself; the run's summary."""
    with handling(STOP_SIGNALS, stopped), open_runs([Path(folder)], [config], resume=resume) as [run]:
        return train(run)


T = TypeVar("T")


def report_errors(prog: str, call: Callable[[], T]) -> tuple[int, T | None]:
    """``(0, call())``, or for an error a run ends with (:func:`agents.errors.exit_status`) its status after one line
    on stderr naming it (others propagate: a bug shows its traceback). A failed write of a run log leaves the process
    at once (``os._exit``): HDF5 objects of such a file can crash the interpreter when they are freed at exit."""
    try:
        return 0, call()
    except Exception as err:  # noqa: BLE001 - the errors a run ends with: one line, their status
        status = exit_status(err)
        if status is None:
            raise
        print(f"{prog}: error: {err}", file=sys.stderr)
        if isinstance(err, RunLogWriteError):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        return status, None
