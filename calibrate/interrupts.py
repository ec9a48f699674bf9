"""Holding Ctrl-C, SIGTERM and SIGHUP back while an engine's PID is not yet on disk, and while
the commands' modules load.

Between starting an engine and writing ``runs/server.json`` a signal would leave an engine
nobody knows about; raised inside an import, a Ctrl-C can be cleared by a C extension that
imports a module of its own, and lost. ``deferred()`` notes any of these signals that arrives
inside it and delivers it again, with the command's own handler back in place, once it ends.

It imports the standard library only and lives outside ``server/`` (whose package loads the
config, the engines and urllib3) so that the command line can hold signals before it loads anything.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Signals in ``HELD`` that arrive inside are delivered when it ends (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def note(signum: int, frame: FrameType | None) -> None:
        arrived.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in HELD}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if arrived:  # the command's handler (KeyboardInterrupt, Terminated, or the default)
            os.kill(os.getpid(), arrived[0])
