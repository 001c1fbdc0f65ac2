"""Named kill points for fault-injection tests: the process SIGKILLs itself at a chosen dangerous moment.

``INTERFERENCE_KILL_AT=NAME`` (or ``NAME:N``, the N-th time the point is reached) in the environment makes
:func:`kill_point` ``(NAME)`` kill the process there, as a pre-emption, the OOM killer or a power cut would. Without
the variable a kill point costs one dictionary lookup. Points: ``runlog.mid_record`` (a record's values flushed,
its step not yet written), ``checkpoint.mid_write`` (part of a checkpoint's temporary file written),
``checkpoint.before_rename`` (temporary file complete, not yet renamed), ``checkpoint.after_rename`` (the new
checkpoint in place; the log already holds records the old one does not know), ``resume.after_truncate`` (a
resumed run's log cut back to its checkpoint, nothing written yet).
"""

from __future__ import annotations

import os
import signal

__all__ = ["kill_point", "ENV"]

ENV = "INTERFERENCE_KILL_AT"


def _parse(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    name, _, count = value.partition(":")
    return name, int(count) if count else 1


_TARGET = _parse(os.environ.get(ENV))
_seen: dict[str, int] = {}


def kill_point(name: str) -> None:
    """SIGKILL this process if ``INTERFERENCE_KILL_AT`` names this point (and this is the time it counts)."""
    if _TARGET is None or _TARGET[0] != name:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if _seen[name] == _TARGET[1]:
        os.kill(os.getpid(), signal.SIGKILL)
