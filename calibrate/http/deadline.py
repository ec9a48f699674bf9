"""urllib3 connections whose status line and headers are read against one deadline.

urllib3 sets the socket's timeout once before the headers are read, and ``http.client`` reads
them one line at a time: a server that sends a byte every half second never trips a timeout of
any length, so ``timeout_s`` would bound nothing. Here the headers are read one socket read at a
time, each waiting only for what is left of urllib3's total (the read timeout it computed after
connect and send, i.e. ``timeout_s`` minus what connecting took); past it a ``TimeoutError``,
which urllib3 turns into the ``ReadTimeoutError`` the client reports as ``timeout``. The body is
then read against the same deadline by ``calibrate.http.bodies``.
"""

from __future__ import annotations

import functools
import http.client
import io
import socket
import time
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool


class _DeadlineLines:
    """What ``http.client`` reads the status line and headers from: the response's own buffered
    reader, read at most one socket read at a time, each bounded by the time left."""

    def __init__(self, fp: io.BufferedReader, sock: socket.socket, deadline: float) -> None:
        self._fp = fp
        self._sock = sock
        self._deadline = deadline
        # urllib3 set the socket's timeout to the time left just now; it is lowered as time
        # passes, once it is ahead of the time left by more than the slack (a syscall saved per
        # header line of an answer that arrives at once, as almost every answer does)
        self._timeout = sock.gettimeout() or 0.0
        self._slack = 0.05 * max(0.0, deadline - time.monotonic())

    def readline(self, limit: int = -1) -> bytes:
        parts: list[bytes] = []
        size = 0
        while limit < 0 or size < limit:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the headers did not arrive within the request's deadline")
            if not 0 < self._timeout <= left + self._slack:
                self._sock.settimeout(left)
                self._timeout = left
            ahead = self._fp.peek(1)  # buffered bytes, or one socket read when none are
            if not ahead:
                break
            end = ahead.find(b"\n")
            take = len(ahead) if end < 0 else end + 1
            if limit >= 0:
                take = min(take, limit - size)
            piece = self._fp.read(take)  # from the buffer: no socket read
            parts.append(piece)
            size += len(piece)
            if piece.endswith(b"\n"):
                break
        return b"".join(parts)

    def close(self) -> None:
        self._fp.close()


class DeadlineResponse(http.client.HTTPResponse):
    """An ``http.client`` response whose ``begin()`` (status and headers) keeps a deadline."""

    def __init__(
        self,
        sock: socket.socket,
        debuglevel: int = 0,
        method: str | None = None,
        url: str | None = None,
        *,
        deadline: float | None = None,
    ) -> None:
        super().__init__(sock, debuglevel, method, url)
        self._header_sock = sock
        self._header_deadline = deadline

    def begin(self) -> None:
        fp = self.fp
        if self._header_deadline is None or fp is None:
            super().begin()
            return
        lines: Any = _DeadlineLines(fp, self._header_sock, self._header_deadline)
        self.fp = lines
        try:
            super().begin()
        finally:
            current: Any = self.fp
            if current is lines:  # (closed on a bad status line: left closed)
                self.fp = fp


def _getresponse(conn: Any, parent: Any) -> Any:
    timeout = conn.timeout  # urllib3's time left of the total, set just before this call
    deadline = time.monotonic() + timeout if isinstance(timeout, int | float) else None
    conn.response_class = functools.partial(DeadlineResponse, deadline=deadline)
    return parent.getresponse(conn)


class DeadlineHTTPConnection(HTTPConnection):
    def getresponse(self) -> Any:
        return _getresponse(self, HTTPConnection)


class DeadlineHTTPSConnection(HTTPSConnection):
    def getresponse(self) -> Any:
        return _getresponse(self, HTTPSConnection)


class DeadlineHTTPPool(HTTPConnectionPool):
    ConnectionCls = DeadlineHTTPConnection


class DeadlineHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = DeadlineHTTPSConnection


def deadline_pool(**kwargs: Any) -> urllib3.PoolManager:
    """A ``PoolManager`` whose connections read headers against the request's deadline."""
    pool = urllib3.PoolManager(**kwargs)
    pool.pool_classes_by_scheme = {"http": DeadlineHTTPPool, "https": DeadlineHTTPSPool}
    return pool
