"""The signals that stop a run or a grid cleanly, and a context manager that handles them."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["STOP_SIGNALS", "handling", "RECEIVED"]

#: Ctrl-C, and what cluster schedulers send before killing a job; a process they stop exits with 128 + the signal
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: every signal a handler installed by :func:`handling` received in this process, in order: an outer handler (the
#: grid's) learns from it of a signal an inner one (a run finishing its last step) took and did not pass on
RECEIVED: list[int] = []


@contextmanager
def handling(signals: Sequence[int], handler: Callable[[int, Any], Any]) -> Iterator[None]:
    """Handle ``signals`` with ``handler`` inside the block (each one received also goes to :data:`RECEIVED`), then
    restore the previous handlers (a no-op outside the main thread, where Python cannot set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    def recorded(signum: int, frame: Any) -> Any:
        RECEIVED.append(signum)
        return handler(signum, frame)

    previous = {sig: signal.signal(sig, recorded) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
