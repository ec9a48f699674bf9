"""A virtual clock: an event loop whose time jumps to its next timer whenever nothing is ready.

Every wait in a simulated run (the server's decode, the open loop's schedule, a deadline) is a
timer on this loop, so a run of minutes takes the milliseconds its Python does, and takes them
the same way on a busy machine as on an idle one: its times are arithmetic, never measured.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import selectors
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _Jumping(selectors.DefaultSelector):
    """A selector that never blocks: asked to wait ``timeout`` s, it moves the time on by that."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError(
                "the simulated run waits for something no timer will bring (calibrate's own bug)"
            )
        if timeout > 0:
            # a nanosecond past the timer: the waiter finds its time come, never a hair short
            # of it (x + (t - x) is not always t in floating point)
            self._clock.advance(timeout + 1e-9)
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        return ready


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        self._virtual = clock
        super().__init__(_Jumping(clock))

    def time(self) -> float:
        return self._virtual.now()


class VirtualClock:
    """A ``Clock`` (``load.transport``) on virtual time, starting at 0."""

    def __init__(self) -> None:
        self._now = 0.0
        self.loop = _VirtualLoop(self)
        weakref.finalize(self, self.loop.close)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(work)

    def start(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """``work`` run to its end on a thread of its own (virtual time needs no other)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def go() -> None:
            try:
                future.set_result(self.run(work))
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)

        threading.Thread(target=go, name="virtual-clock", daemon=True).start()
        return future
