"""A virtual clock: an event loop whose time jumps to its next timer whenever nothing is ready.

Every wait in a simulated run (the server's decode, the open loop's schedule, a deadline) is a
timer on this loop, so a run of minutes takes the milliseconds its Python does, and takes them
the same way on a busy machine as on an idle one: its times are arithmetic, never measured.
"""

from __future__ import annotations

import asyncio
import selectors
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _Time:
    """The virtual time, shared by a clock and its loop. The loop holds this, never the clock:
    a loop that held its clock was kept by the clock's finalizer (which closes the loop), so
    neither was ever collected, and each clock's loop kept its three descriptors (epoll and a
    socket pair) open until the process ended — over a thousand in a pytest worker."""

    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0


class _Jumping(selectors.DefaultSelector):
    """A selector that never blocks: asked to wait ``timeout`` s, it moves the time on by that."""

    def __init__(self, time: _Time) -> None:
        super().__init__()
        self._time = time

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise RuntimeError(
                "the simulated run waits for something no timer will bring (calibrate's own bug)"
            )
        if timeout > 0:
            # a nanosecond past the timer: the waiter finds its time come, never a hair short
            # of it (x + (t - x) is not always t in floating point)
            self._time.now += timeout + 1e-9
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        return ready


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, time: _Time) -> None:
        self._virtual = time
        super().__init__(_Jumping(time))

    def time(self) -> float:
        return self._virtual.now


class VirtualClock:
    """A ``Clock`` (``load.transport``) on virtual time, starting at 0."""

    def __init__(self) -> None:
        self._time = _Time()
        self.loop = _VirtualLoop(self._time)
        weakref.finalize(self, self.loop.close)  # closed once the clock is gone

    def now(self) -> float:
        return self._time.now

    def advance(self, seconds: float) -> None:
        self._time.now += seconds

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(work)
