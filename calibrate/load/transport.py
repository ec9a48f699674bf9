"""The engine's seams: a ``Transport`` sends one request and hands back its answer (as httpx's
transport does a client's), a ``Clock`` says when it is and runs the engine's loop.

The product's pair is ``HttpTransport`` (the asyncio client of ``calibrate.http``, its I/O on
the process's one event-loop thread, each stream parsed off that loop) on ``LoopClock`` (that
loop, on the monotonic clock every request is stamped with). The tests' pair is the simulated
server of ``calibrate.load.sim`` on a virtual clock. The engine cannot tell them apart.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from calibrate.http.aio.bridge import shared_loop
from calibrate.http.client import OpenAIClient
from calibrate.http.models import Completion, ContextLimit
from calibrate.http.server_context import read_context
from calibrate.load.answers import wants_context
from calibrate.load.request import Request

T = TypeVar("T")


@dataclass(frozen=True)
class Exchange:
    """One request's answer (its own times stamped by the transport as its bytes arrived) or
    its failure: a ``RequestError``, or calibrate's own bug, recorded all the same. ``context``
    is the server's context, read when a forced answer came back cut short."""

    completion: Completion | None
    failure: BaseException | None = None
    context: ContextLimit | None = None


class Transport(Protocol):
    """Sends one request; never raises (a failure is the exchange's)."""

    @property
    def timeout_s(self) -> float:
        """Each request's total deadline: past it (and a grace) the engine calls it stuck."""
        ...

    async def send(self, request: Request) -> Exchange: ...


class Clock(Protocol):
    """The time a run's records are stamped with, and the loop it runs on."""

    def now(self) -> float: ...

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run ``work`` on this clock's loop to its end (from a thread that is not that loop's)."""
        ...


class LoopClock:
    """The process's I/O loop (``http.aio.bridge``) on the monotonic clock of every request's
    stamps (``http.request_times``)."""

    now = staticmethod(time.perf_counter)

    def start(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``work`` on the loop without waiting for it (a batch's caller shows progress
        meanwhile); cancelling the future cancels the work."""
        return asyncio.run_coroutine_threadsafe(work, shared_loop().loop)

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        future = self.start(work)
        try:
            return future.result()
        except BaseException:  # Ctrl-C in the caller: the run stops, its requests with it
            future.cancel()
            raise


class HttpTransport:
    """Completions over the asyncio client (``OpenAIClient.complete``)."""

    def __init__(self, client: OpenAIClient) -> None:
        self.client = client
        self._contexts: dict[str, ContextLimit | None] = {}

    @property
    def timeout_s(self) -> float:
        return self.client.timeout_s

    async def send(self, request: Request) -> Exchange:
        try:
            completion = await self.client.complete(request.path, request.body)
        except Exception as exc:  # a RequestError, or a bug of calibrate's own: recorded
            return Exchange(None, exc)
        context = None
        if wants_context(request, completion):
            context = await self._context(str(request.body.get("model", "")))
        return Exchange(completion, None, context)

    async def _context(self, model: str) -> ContextLimit | None:
        """The server's context, read the first time a forced answer is cut short and kept
        (``http.server_context``; off the loop: it waits on the control plane)."""
        if model not in self._contexts:
            loop = asyncio.get_running_loop()
            self._contexts[model] = await loop.run_in_executor(
                None, read_context, self.client, model
            )
        return self._contexts[model]
