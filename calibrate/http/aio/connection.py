"""Keep-alive connections on one event loop, and one request on them under a total deadline.

A request's deadline is set before it connects: ``loop.call_at`` aborts the connection when it
passes, whatever the request is waiting for then — the connection, the status line and headers
(a server dripping them a byte at a time), or the body (a stream sending only keep-alive
comments). Idle connections are kept per origin, last used first, at most ``max_idle`` of them
(as urllib3's pool keeps ``maxsize``; a burst past it opens more, closed after use); one the
server closed is dropped before reuse, and so is one whose close has come in but not yet been
handled (its transport is closing).

One retry, and only one kind: a kept-alive connection the server closed just as it was reused
(llama.cpp and most engines close idle ones after a few seconds) — the answer's first byte never
came and the close arrived within ``STALE_RETRY_S`` of the request — is replaced by a new one
and the request sent once more, within the same deadline. Every other failure is the caller's
to retry or not.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from calibrate.errors import RequestError
from calibrate.http.aio.wire import Answer
from calibrate.http.error_kinds import (
    check_descriptors,
    connection_error,
    request_error,
)

Origin = tuple[str, str, int]  # scheme, host, port
STALE_RETRY_S = 0.5  # a reused connection closed unanswered this soon was closed idle, not busy
# uvloop's clock and timers count whole milliseconds (its time() truncates, call_at rounds): a
# timer armed for t fired up to 0.8 ms before t was measured. The deadline is armed this much
# late, so a request is never cut before its timeout_s (at most 2 ms after it).
TIMER_GRAIN_S = 0.002


@dataclass(frozen=True)
class Call:
    """One request, as bytes, and how its answer is to be read."""

    origin: Origin
    url: str  # for messages (no userinfo)
    payload: bytes  # request line, headers and body
    left_s: float  # what is left of the total deadline when the call starts
    timeout_s: float  # the caller's total (for messages)
    connect_timeout_s: float
    max_bytes: int
    lines: bool  # a streamed answer: kept as timed lines
    clock: Callable[[], float]


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.answer: Answer | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.lost = False
        self.failure: BaseException | None = None
        self.used = False  # it carried an answer before (kept alive, then reused)
        self.got_bytes = False  # the current request's answer has begun to arrive

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are no asyncio.Transport subclass: not isinstance-checked
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        answer, waiter = self.answer, self.waiter
        if answer is None or waiter is None or waiter.done():
            self.lost = True  # bytes nobody asked for: this connection is not to be trusted
            self.abort()
            return
        self.got_bytes = True
        try:
            answer.feed(data)
        except RequestError as exc:
            self.lost = True
            waiter.set_exception(exc)
            self.abort()
            return
        if answer.done:
            waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        answer, waiter = self.answer, self.waiter
        if answer is None or waiter is None or waiter.done():
            return
        if answer.closed():
            waiter.set_result(None)
        else:
            self.failure = exc or ConnectionResetError("the server closed the connection")
            waiter.set_exception(self.failure)

    def closing(self) -> bool:
        """Its transport is closed or closing: the close came (the server's FIN read, or our own
        abort) but ``connection_lost`` has not run yet — writing to it would raise."""
        return self.transport is None or self.transport.is_closing()

    def write(self, payload: bytes) -> None:
        """Send the request; a transport closed under us (a reset that came in after the
        connection was made or kept) is a dropped connection: uvloop raised RuntimeError there
        (an item's ``internal`` failure), the default loop dropped the bytes and the request
        waited out its deadline."""
        if self.closing():
            raise ConnectionResetError("the connection was closed before the request was sent")
        assert self.transport is not None
        try:
            self.transport.write(payload)
        except RuntimeError as exc:  # uvloop: "unable to perform operation on <TCPTransport…>"
            raise ConnectionResetError(f"the connection was closed: {exc}") from exc

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Connections:
    """The idle connections of one event loop, per origin."""

    def __init__(self, max_idle: int = 64) -> None:
        self._idle: dict[Origin, list[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None
        self.max_idle = max(1, max_idle)

    def _kept(self, origin: Origin) -> _Connection | None:
        """An idle connection to ``origin`` still open, last used first; None if none is."""
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()
            if not conn.lost and not conn.closing():
                return conn
        return None

    async def _connect(
        self,
        call: Call,
        deadline: float,
        *,
        reuse: bool = True,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> _Connection:
        kept = self._kept(call.origin) if reuse else None
        if kept is not None:
            return kept
        loop = loop or asyncio.get_running_loop()
        scheme, host, port = call.origin
        tls = None
        if scheme == "https":
            tls = self._tls = self._tls or ssl.create_default_context()
        wait_s = max(0.0, min(call.connect_timeout_s, deadline - loop.time()))
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Connection, host, port, ssl=tls), wait_s
            )
        except TimeoutError as exc:
            raise request_error(
                "connect",
                f"connection to {call.url} timed out after {call.connect_timeout_s:g} s",
                exc,
            ) from exc
        except ConnectionRefusedError as exc:
            message = f"no server at {call.url} (connection refused)"
            raise request_error("connect", message, exc) from exc
        except OSError as exc:
            check_descriptors(exc)
            raise connection_error(call.url, exc) from exc
        return conn

    async def exchange(self, call: Call) -> Answer:
        """Send ``call`` and read its whole answer (streamed lines too) before the deadline."""
        # the loop is looked up once and handed on: each lookup is a getpid() (CPython 3.11)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + call.left_s + TIMER_GRAIN_S
        conn = self._kept(call.origin)  # the common case: no coroutine to reuse one
        if conn is None:
            conn = await self._connect(call, deadline, reuse=False, loop=loop)
        try:
            if conn.used:
                sent_at = loop.time()
                try:
                    return await self._exchange(conn, call, deadline, loop)
                except OSError:
                    if conn.got_bytes or loop.time() - sent_at > STALE_RETRY_S:
                        raise
                # closed idle as it was reused: once more, on a new connection
                conn = await self._connect(call, deadline, reuse=False, loop=loop)
            return await self._exchange(conn, call, deadline, loop)
        except OSError as exc:
            raise connection_error(call.url, exc) from exc

    async def _exchange(
        self,
        conn: _Connection,
        call: Call,
        deadline: float,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Answer:
        loop = loop or asyncio.get_running_loop()
        answer = conn.answer = Answer(max_bytes=call.max_bytes, lines=call.lines, clock=call.clock)
        waiter = conn.waiter = loop.create_future()
        conn.got_bytes = False
        timer = loop.call_at(deadline, _expire, conn)
        whole = False
        try:
            conn.write(call.payload)
            await waiter
            whole = True
        except TimeoutError as exc:
            if answer.head_done:
                message = f"{call.url} still answering after {call.timeout_s:g} s (timeout_s)"
            else:
                message = f"no answer from {call.url} within {call.timeout_s:g} s"
            raise request_error("timeout", message, exc) from exc
        finally:
            timer.cancel()
            conn.answer = conn.waiter = None
            conn.used = True
            idle = self._idle.setdefault(call.origin, [])
            if whole and answer.reusable and not conn.lost and len(idle) < self.max_idle:
                idle.append(conn)
            else:  # failed, cancelled, or not to be kept: never handed out again
                conn.lost = True
                if whole:
                    conn.close()
                else:
                    conn.abort()
        return answer

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.abort()
        self._idle.clear()


def _expire(conn: _Connection) -> None:
    waiter = conn.waiter
    if waiter is not None and not waiter.done():
        waiter.set_exception(TimeoutError("the request's deadline passed"))
    conn.lost = True
    conn.abort()
