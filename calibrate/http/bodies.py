"""Reading an HTTP answer within the request's deadline and the answer-size cap.

A body is read one socket read at a time (``read1``), the socket's timeout set to the time left,
so a server that drips a byte a second is cut at the deadline, and an answer over the cap is
refused after reading at most the cap, never buffered whole (the control plane's answers:
completions are read by ``calibrate.http.aio.wire``). Plain (unencoded) bodies are read straight
from the ``http.client`` response under urllib3's.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Callable

import urllib3
from urllib3.exceptions import HTTPError, ReadTimeoutError

from calibrate.errors import RequestError
from calibrate.http.error_kinds import connection_error, invalid, request_error

READ_BYTES = 65536  # at most one socket read: the deadline is checked between reads
MIB = 1024 * 1024


class BodyReader:
    """The body of one response, read against ``deadline`` (a ``clock`` time) and ``max_bytes``."""

    def __init__(
        self,
        response: urllib3.BaseHTTPResponse,
        *,
        url: str,
        deadline: float,
        timeout_s: float,
        max_bytes: int,
        clock: Callable[[], float],
    ) -> None:
        self.response = response
        self.url = url
        self.deadline = deadline
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.size = 0
        self._clock = clock
        self._sock: socket.socket | None = getattr(response.connection, "sock", None)
        self._sock_timeout = float("inf")
        raw = getattr(response, "_fp", None)
        plain = not response.headers.get("Content-Encoding")
        self._raw = raw if plain and isinstance(raw, http.client.HTTPResponse) else None

    @property
    def announced(self) -> int | None:
        """Bytes still to come by Content-Length (None: chunked or unknown)."""
        return self._raw.length if self._raw is not None else self.response.length_remaining

    def read1(self) -> bytes:
        """At most one socket read, waiting no longer than the time left; b"" at the end."""
        left = self.deadline - self._clock()
        if left <= 0:
            raise self._timeout(None)
        # Lower the socket's timeout to the time left; re-set only when it moved noticeably
        # (a syscall per SSE frame would cost more than the frame's parsing).
        if self._sock is not None and self._sock_timeout > left + 0.05 * self.timeout_s:
            self._sock.settimeout(left)
            self._sock_timeout = left
        try:
            if self._raw is not None:
                piece = self._raw.read1(READ_BYTES)
            else:
                piece = self.response.read1(READ_BYTES)
        except (TimeoutError, ReadTimeoutError) as exc:
            raise self._timeout(exc) from exc
        except (http.client.HTTPException, HTTPError, OSError, ValueError) as exc:
            raise connection_error(self.url, exc) from exc
        self.size += len(piece)
        if self.size > self.max_bytes:
            raise too_large(self.max_bytes)
        if self._raw is not None and self._raw.length == 0:
            # The announced body is all read: close the response as http.client does at the end
            # of its own reads, or the kept-alive connection still has a response "in progress"
            # and the next request on it fails with ResponseNotReady (seen on uvicorn servers).
            self._raw.close()
        return piece

    def read_all(self) -> bytes:
        """The whole body (refused up front when its announced length is over the cap)."""
        announced = self.announced
        if announced is not None and self.size + announced > self.max_bytes:
            raise too_large(self.max_bytes)
        parts: list[bytes] = []
        # Stop at the announced length without one more read (the common, small answer).
        while self.announced != 0 and (piece := self.read1()):
            parts.append(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read_some(self, limit: int) -> tuple[bytes, bool]:
        """Up to ``limit`` bytes, and whether that was the whole body (error answers)."""
        parts: list[bytes] = []
        size = 0
        while size < limit:
            piece = self.read1() if self.announced != 0 else b""
            if not piece:
                return b"".join(parts), True
            parts.append(piece)
            size += len(piece)
        return b"".join(parts)[:limit], False

    def _timeout(self, exc: BaseException | None) -> RequestError:
        return request_error(
            "timeout", f"{self.url} still answering after {self.timeout_s:g} s (timeout_s)", exc
        )


def too_large(max_bytes: int) -> RequestError:
    return invalid(
        f"answer larger than {max_bytes / MIB:g} MiB (max_response_mib): "
        "raise [target].max_response_mib if such answers are expected"
    )
