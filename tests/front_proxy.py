"""A front for the mock: it forwards every request — a gateway that lets at most ``lanes``
completions through at once, as one that limits its upstream's concurrency does, the rest held
until a lane is free — and for the paths it is told sends the answer's status line and headers
back one byte at a time (a slow-header server).

A plain socket server, written by hand so the drip is exactly what a hostile server would do:
each byte its own ``send``, ``drip_s`` apart, the connection kept alive between requests.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Collection
from types import TracebackType
from urllib.parse import urlsplit


class FrontProxy:
    def __init__(
        self,
        upstream: str,
        paths: Collection[str] = (),
        drip_s: float = 0.05,
        *,
        lanes: int | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._paths = tuple(paths)
        self._drip_s = drip_s
        self._lanes = threading.BoundedSemaphore(lanes) if lanes else None
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.dripped: list[str] = []  # the paths answered with dripped headers, in order
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def __enter__(self) -> FrontProxy:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            reader = conn.makefile("rb")
            while not self._stop.is_set():
                head = _read_head(reader)
                if head is None:
                    return
                length = _content_length(head)
                body = reader.read(length) if length else b""
                path = head.split(b" ", 2)[1].decode("latin-1").split("?", 1)[0]
                if self._lanes is not None and head.startswith(b"POST"):
                    with self._lanes:  # a completion waits here for a lane, unseen upstream
                        answer = self._forward(head, body)
                else:
                    answer = self._forward(head, body)
                status_and_headers, sep, rest = answer.partition(b"\r\n\r\n")
                if any(path.endswith(p) for p in self._paths):
                    self.dripped.append(path)
                    for byte in status_and_headers + sep:
                        if self._stop.is_set():
                            return
                        conn.sendall(bytes([byte]))
                        time.sleep(self._drip_s)
                    conn.sendall(rest)
                else:
                    conn.sendall(answer)

    def _forward(self, head: bytes, body: bytes) -> bytes:
        """The upstream's whole answer (asked with Connection: close, read to its end)."""
        request_line, _, headers = head.partition(b"\r\n")
        with socket.create_connection(self._upstream, timeout=30) as up:
            up.sendall(request_line + b"\r\nConnection: close\r\n" + headers + body)
            parts = []
            while piece := up.recv(65536):
                parts.append(piece)
        return b"".join(parts)


def _read_head(reader: object) -> bytes | None:
    lines: list[bytes] = []
    while True:
        line = reader.readline(65537)  # type: ignore[attr-defined]
        if not line:
            return None
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip() or 0)
    return 0
