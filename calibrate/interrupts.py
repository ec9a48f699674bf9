"""Holding Ctrl-C, SIGTERM and SIGHUP back while an engine's PID is not yet on disk, and while
the commands' modules load; delivering again a Ctrl-C that Python could only report.

Between starting an engine and writing ``runs/server.json`` a signal would leave an engine
nobody knows about; raised inside an import, a Ctrl-C can be cleared by a C extension that
imports a module of its own, and lost. ``deferred()`` notes any of these signals that arrives
inside it and delivers it again, with the command's own handler back in place, once it ends.

Later in a command a Ctrl-C can still land where Python cannot raise it: in a weakref callback
(the import system's module locks have one, so any lazy import), a ``__del__``, a garbage
collection. Python prints "Exception ignored in: …" with a traceback and goes on — a ``server
start`` then waited for its engine as if no Ctrl-C had come. ``never_lost()`` sends such a
Ctrl-C to the main thread again a moment later, where it ends the command.

It imports the standard library only and lives outside ``server/`` (whose package loads the
config, the engines and urllib3) so that the command line can hold signals before it loads anything.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
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


AGAIN_AFTER_S = 0.02  # the callback that swallowed it has returned by then; if not, it comes back


@contextlib.contextmanager
def never_lost() -> Iterator[None]:
    """A KeyboardInterrupt (Ctrl-C, or SIGTERM's ``Terminated``) that Python reports as
    unraisable is sent to the main thread again, as a SIGINT, ``AGAIN_AFTER_S`` later — and
    not printed. Every other unraisable exception goes to the hook that was there before."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = sys.unraisablehook
    main = threading.main_thread().ident
    assert main is not None
    ended = threading.Lock()  # held by the command's end: no Ctrl-C is sent after it
    active = [True]

    def again() -> None:
        """A real signal to the main thread, not a simulated one: it ends a wait in C (a sleep,
        a select) at once, and whatever handler is in place then takes it."""
        with ended:
            if active[0]:
                signal.pthread_kill(main, signal.SIGINT)

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            timer = threading.Timer(AGAIN_AFTER_S, again)
            timer.daemon = True
            timer.start()
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        with ended:
            active[0] = False
        sys.unraisablehook = previous
