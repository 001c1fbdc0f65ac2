"""The signals that stop a run or a grid cleanly, and a context manager that handles them."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["STOP_SIGNALS", "handling"]

#: Ctrl-C, and what cluster schedulers send before killing a job; a process they stop exits with 128 + the signal
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def handling(signals: Sequence[int], handler: Callable[[int, Any], Any]) -> Iterator[None]:
    """Handle ``signals`` with ``handler`` inside the block, then restore the previous handlers (a no-op outside
    the main thread, where Python cannot set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
