"""A hand-written asyncio HTTP/1.1 keep-alive client: the "raw asyncio" candidate of transports.py.

One ``asyncio.Protocol`` per connection parses the answer as it arrives — status line and
headers (a size limit), a Content-Length or chunked body (a size cap), and for SSE the ``data:``
lines, each event handed to a callback without an ``await`` per event (where aiohttp's
``async for line in r.content`` costs a task switch per line). One total deadline per request,
set before connecting, covers connect, headers and body: ``loop.call_at`` aborts the connection
when it passes, so a server dripping its headers a byte at a time is cut at ``timeout_s``. Idle
connections are kept per client (LIFO) and reused while the server keeps them alive.

calibrate/http/aio/wire.py grew from this parser and shares its shape; it is kept apart on
purpose. This is the reference the transports table measures: one callback per SSE event on
the loop, no clock read per piece, no gzip, error-body cap or read-to-close. Parsing with
wire.py would measure calibrate's parser twice (the ``calibrate`` candidate already runs it)
and leave the recorded ``raw-asyncio`` rows of bench/README.md nothing to be compared with.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEADER_BYTES = 65536
MAX_CHUNK_LINE = 4096


class HttpError(Exception):
    """A transport failure: connect, timeout, a malformed or oversized answer, a lost connection."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes  # b"" when the body went to an event callback


class _Reply:
    """The parser of one answer; resolves ``future`` with an ``Answer`` at its end."""

    __slots__ = (
        "buf",
        "chunked",
        "data",
        "done",
        "future",
        "head_done",
        "headers",
        "keep_alive",
        "left",
        "max_bytes",
        "on_event",
        "parts",
        "pending",
        "size",
        "status",
        "trailer",
    )  # fmt: skip

    def __init__(
        self,
        future: asyncio.Future[Answer],
        on_event: Callable[[bytes], None] | None,
        max_bytes: int,
    ) -> None:
        self.future = future
        self.on_event = on_event
        self.max_bytes = max_bytes
        self.buf = bytearray()
        self.head_done = False
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunked = False
        self.left = 0  # plain: body bytes still to come; chunked: this chunk's data + CRLF
        self.trailer = False
        self.parts: list[bytes] = []
        self.size = 0
        self.pending = b""  # SSE: the start of a line still arriving
        self.data: list[bytes] = []  # SSE: the data lines of the event so far
        self.keep_alive = True
        self.done = False

    def feed(self, data: bytes) -> None:
        if self.done:
            raise HttpError("invalid_response", "bytes after the end of the answer")
        if not self.head_done:
            self.buf += data
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEADER_BYTES:
                    raise HttpError("invalid_response", "answer headers over 64 KiB")
                return
            self._head(bytes(self.buf[:end]))
            data = bytes(self.buf[end + 4 :])
            self.buf = bytearray()
            if self.status == 100:  # an interim answer: the real one follows
                self.head_done = False
                self.feed(data)
                return
            if not self.chunked and self.left == 0:
                self._finish()
                return
        if self.chunked:
            self._chunked(data)
        elif data:
            if len(data) > self.left:
                raise HttpError("invalid_response", "more body than Content-Length announced")
            self.left -= len(data)
            self._body(data)
            if self.left == 0:
                self._finish()

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpError("invalid_response", f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        self.status = int(parts[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.headers = headers
        self.head_done = True
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self.keep_alive = (
            headers.get("connection", "").lower() != "close" and parts[0] != "HTTP/1.0"
        )
        if not self.chunked:
            length = headers.get("content-length")
            if length is None or not length.isdigit():
                raise HttpError("invalid_response", "an answer without Content-Length or chunks")
            self.left = int(length)
            if self.left > self.max_bytes:
                raise HttpError("invalid_response", "answer larger than the cap")

    def _chunked(self, data: bytes) -> None:
        if self.buf:  # a chunk-size line that arrived in pieces
            data = bytes(self.buf) + data
            self.buf = bytearray()
        pos, end = 0, len(data)
        while pos < end:
            if self.left > 2:  # chunk data
                take = min(end - pos, self.left - 2)
                self._body(data[pos : pos + take])
                pos += take
                self.left -= take
                continue
            if self.left > 0:  # the CRLF after a chunk's data
                take = min(end - pos, self.left)
                pos += take
                self.left -= take
                continue
            nl = data.find(b"\r\n", pos)
            if nl < 0:
                if end - pos > MAX_CHUNK_LINE:
                    raise HttpError("invalid_response", "a chunk-size line over 4 KiB")
                self.buf = bytearray(data[pos:])
                return
            line = data[pos:nl]
            pos = nl + 2
            if self.trailer:
                if not line:
                    self._finish()
                    return
                continue
            try:
                size = int(line.split(b";", 1)[0], 16)
            except ValueError:
                raise HttpError("invalid_response", f"bad chunk size {line[:40]!r}") from None
            if size == 0:
                self.trailer = True
            else:
                self.left = size + 2

    def _body(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.size > self.max_bytes:
            raise HttpError("invalid_response", "answer larger than the cap")
        if self.on_event is None or self.status != 200:
            self.parts.append(piece)
            return
        if self.pending:
            piece = self.pending + piece
        lines = piece.split(b"\n")
        self.pending = lines.pop()
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self.data:
                    event = self.data[0] if len(self.data) == 1 else b"\n".join(self.data)
                    self.data = []
                    self.on_event(event)
            elif line.startswith(b"data:"):
                self.data.append(line[6:] if line[5:6] == b" " else line[5:])

    def _finish(self) -> None:
        self.done = True
        if not self.future.done():
            body = b"".join(self.parts)
            self.future.set_result(Answer(self.status, self.headers, body))


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reply: _Reply | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's: no asyncio.Transport

    def data_received(self, data: bytes) -> None:
        reply = self.reply
        try:
            if reply is None:
                raise HttpError("invalid_response", "bytes while no request was in flight")
            reply.feed(data)
        except HttpError as exc:
            self.lost = True
            if reply is not None and not reply.future.done():
                reply.future.set_exception(exc)
            assert self.transport is not None
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        reply = self.reply
        if reply is not None and not reply.future.done():
            reply.future.set_exception(HttpError("connect", f"connection lost: {exc or 'closed'}"))


class AioClient:
    """Keep-alive connections to one origin; ``request`` keeps one total deadline."""

    def __init__(
        self, base_url: str, *, max_bytes: int = 64 << 20, connect_timeout_s: float = 10.0
    ):
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.max_bytes = max_bytes
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[_Connection] = []
        self._host_header = f"Host: {self.host}:{self.port}\r\n".encode()

    async def _connect(self, deadline: float) -> _Connection:
        loop = asyncio.get_running_loop()
        while self._idle:
            conn = self._idle.pop()
            if not conn.lost:
                return conn
        left = min(self.connect_timeout_s, deadline - loop.time())
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Connection, self.host, self.port), max(left, 0.0)
            )
        except TimeoutError:
            raise HttpError("connect", f"no connection within {left:.3g} s") from None
        except OSError as exc:
            raise HttpError("connect", f"cannot connect: {exc}") from exc
        return conn

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        *,
        timeout_s: float,
        headers: bytes = b"Content-Type: application/json\r\n",
        on_event: Callable[[bytes], None] | None = None,
    ) -> Answer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        conn = await self._connect(deadline)
        future: asyncio.Future[Answer] = loop.create_future()
        reply = conn.reply = _Reply(future, on_event, self.max_bytes)
        head = f"{method} {self.prefix}{path} HTTP/1.1\r\n".encode() + self._host_header + headers
        assert conn.transport is not None
        conn.transport.write(b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body))
        timer = loop.call_at(deadline, _expire, conn, future, timeout_s)
        try:
            answer = await future
        finally:
            timer.cancel()
            conn.reply = None
        if reply.keep_alive and not conn.lost:
            self._idle.append(conn)
        else:
            conn.transport.close()
        return answer

    def close(self) -> None:
        for conn in self._idle:
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()


def _expire(conn: _Connection, future: asyncio.Future[Answer], timeout_s: float) -> None:
    if not future.done():
        future.set_exception(HttpError("timeout", f"no whole answer within {timeout_s:g} s"))
    conn.lost = True
    if conn.transport is not None:
        conn.transport.abort()
