"""The errors a run can end with and the exit statuses the CLIs give them: the bottom floor of ``agents``, imported
by the learners, the run lifecycle and the CLIs alike (never the other way round).

======  ===========================================================================================
status  meaning
======  ===========================================================================================
0       the run (or every run of a grid) finished
1       an unexpected error (a bug: the traceback is printed)
2       bad input: a flag, config value, config or grid file, or a run folder that cannot be resumed (its
        log corrupt, truncated or missing: :class:`runlog.RunLogError`)
3       another process writes into the run folder, or holds its run log open (:class:`RunFolderBusy`,
        :class:`runlog.RunLogBusy`)
4       a file of the run could not be written (full disk, I/O error, file size limit)
130     stopped by SIGINT (Ctrl-C); 143: by SIGTERM (the run saved what it had; ``--resume`` continues it)
======  ===========================================================================================
"""

from __future__ import annotations

from runlog import RunLogBusy, RunLogError, RunLogWriteError

__all__ = ["ConfigError", "RunFolderBusy", "RunWriteError", "EXIT_CONFIG", "EXIT_BUSY", "EXIT_IO", "exit_status"]

#: exit status of bad input (argparse's own)
EXIT_CONFIG = 2
#: exit status when another process writes into the run folder
EXIT_BUSY = 3
#: exit status when a file of the run cannot be written (full disk, I/O error, file size limit)
EXIT_IO = 4


class ConfigError(ValueError):
    """A config value a command refuses (unknown activation, negative learning rate, unknown env, ...), or a run
    folder it cannot resume (``agents.train`` exits with status 2)."""


class RunWriteError(OSError):
    """A run cannot write its files (full disk, I/O error, file size limit): it stops (exit status 4)."""


class RunFolderBusy(RuntimeError):
    """Another live process writes into this run folder."""


def exit_status(err: BaseException) -> int | None:
    """The exit status of an error a run ends with (the table above); ``None`` for any other error (a bug)."""
    if isinstance(err, (RunFolderBusy, RunLogBusy)):
        return EXIT_BUSY
    if isinstance(err, (RunLogWriteError, RunWriteError)):
        return EXIT_IO
    if isinstance(err, (ConfigError, RunLogError)):
        return EXIT_CONFIG
    return None
