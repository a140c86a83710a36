"""Ctrl-C that is never lost: the CLI records SIGINT before Python raises KeyboardInterrupt.

DuckDB's Python client turns a Ctrl-C that arrives during a query into its own error, and a
worker thread's query error is a rank's failure to the collect: the interrupt could end up
swallowed and the collect go on to publish its store (seen once in a full test run: a SIGINT
half-way through a 24-rank collect, exit status 0). `requested()` is checked before anything is
made final, so a Ctrl-C always ends in "interrupted" with nothing half-written kept. Library
callers that never `install()` see no change.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_requested = False


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    global _requested
    _requested = True
    raise KeyboardInterrupt


def install() -> None:
    """In the CLI: remember every SIGINT, then raise as Python does (main thread only: a
    handler cannot be set from another thread, where Python would not deliver it anyway)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)


def requested() -> bool:
    return _requested


def check() -> None:
    """Raise KeyboardInterrupt when a Ctrl-C came, even if something swallowed it since."""
    if _requested:
        raise KeyboardInterrupt
