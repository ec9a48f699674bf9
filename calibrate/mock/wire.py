"""Bytes on one mock connection: JSON and plain answers, chunked SSE frames, drips and resets."""

from __future__ import annotations

import json
import select
import socket
import struct
import time
from http.server import BaseHTTPRequestHandler

from calibrate.mock.settings import MockSettings

KEEPALIVE_INTERVAL_S = 0.2


class Wire:
    """What a handler writes, the way the settings shape it (``--drip-s``: a byte at a time)."""

    def __init__(self, handler: BaseHTTPRequestHandler, settings: MockSettings) -> None:
        self.handler = handler
        self.settings = settings

    def sse_headers(self) -> None:
        self.handler.send_response(200)
        self.handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.handler.send_header("Cache-Control", "no-cache")
        self.handler.send_header("Transfer-Encoding", "chunked")
        self.handler.end_headers()

    def send_sse(self, frames: list[bytes]) -> None:
        self.sse_headers()
        for frame in frames:
            self.write_chunk(frame)
        self.write(b"0\r\n\r\n")

    def keepalive_only(self) -> None:
        """An SSE stream of ``: ping`` comments and nothing else, until the client leaves."""
        settings = self.settings
        self.sse_headers()
        end = time.monotonic() + settings.keepalive_limit_s
        while time.monotonic() < end:
            self.write_chunk(b": ping\n\n")
            time.sleep(min(KEEPALIVE_INTERVAL_S, max(0.0, end - time.monotonic())))
        self.write(b"0\r\n\r\n")

    def wait_until(self, deadline: float) -> None:
        """Wait until ``deadline`` (``time.monotonic``) as an engine generates: raises
        ConnectionAbortedError the moment the client closes the connection instead. vLLM aborts
        a request whose client left, streamed or not, and its slot is free at once (its engine
        suite measures it); a mock that slept on held the slot for an answer nobody reads."""
        conn = self.handler.connection
        watch = select.poll()
        watch.register(conn, select.POLLIN)
        while (left := deadline - time.monotonic()) > 0:
            if not watch.poll(left * 1000):
                continue  # the time came (or a hair short of it: wait the rest)
            try:
                peeked = conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            if not peeked:
                raise ConnectionAbortedError("the client closed the connection")
            time.sleep(max(0.0, deadline - time.monotonic()))  # its next request, sent early
            return

    def sleep(self, seconds: float) -> None:
        """``wait_until`` ``seconds`` from now."""
        self.wait_until(time.monotonic() + seconds)

    def write_chunk(self, frame: bytes) -> None:
        self.write(b"%x\r\n%s\r\n" % (len(frame), frame))

    def write(self, data: bytes) -> None:
        """Send bytes: at once, or with --drip-s one byte at a time."""
        drip_s = self.settings.drip_s
        if not drip_s:
            self.handler.wfile.write(data)
            return
        for i in range(len(data)):
            self.handler.wfile.write(data[i : i + 1])
            self.handler.wfile.flush()
            time.sleep(drip_s)

    def reset(self) -> None:
        """Drop the connection with a TCP RST: the client sees a reset, not a clean close."""
        self.handler.close_connection = True
        self.handler.connection.setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
        self.handler.connection.close()  # the fd really closes when finish() closes rfile

    def send_json(
        self,
        status: int,
        body: object,
        headers: dict[str, str] | None = None,
        *,
        drip: bool = False,
    ) -> None:
        try:
            data = json.dumps(body, ensure_ascii=False).encode()
        except UnicodeEncodeError:  # a lone surrogate (--lone-surrogate): send it as "\ud800"
            data = json.dumps(body).encode()
        self.send(status, data, "application/json", headers, drip=drip)

    def send(
        self,
        status: int,
        data: bytes,
        ctype: str,
        headers: dict[str, str] | None = None,
        *,
        drip: bool = False,
    ) -> None:
        self.handler.send_response(status)
        self.handler.send_header("Content-Type", ctype)
        self.handler.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.handler.send_header(name, value)
        self.handler.end_headers()
        if drip:
            self.write(data)  # an answer: dripped under --drip-s
        else:
            self.handler.wfile.write(data)
