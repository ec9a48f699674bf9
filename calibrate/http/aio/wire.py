"""One HTTP/1.1 answer parsed as its bytes arrive: status line, headers, and the body.

The head is limited (``MAX_HEADER_BYTES``, ``MAX_HEADERS``); the body is read by Content-Length,
by chunks, or up to the connection's close, never past the size cap. A streamed answer is kept
as the runs of whole lines it arrived in, each with the clock time its bytes arrived (the TTFT
and the gaps between chunks are those arrival times, not when a worker thread got to them): a
read's lines are split once, when the answer is parsed. An error answer keeps at most
``ERROR_BODY_BYTES``. Failures raise ``RequestError`` (``invalid_response``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from calibrate.http.bodies import too_large
from calibrate.http.error_kinds import invalid

MAX_HEADER_BYTES = 65536  # the status line and all headers
MAX_HEADERS = 100  # as http.client
MAX_CHUNK_LINE = 4096
ERROR_BODY_BYTES = 65536  # of an error answer, this much is kept
DONE_LINE = b"data: [DONE]"


def _decoder(encoding: str) -> Any:
    """A decoder of a gzip or deflate body (we ask for none: some servers send it anyway)."""
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise invalid(f"the answer is encoded as {encoding[:40]}, which calibrate cannot read")
    return zlib.decompressobj(47 if "gzip" in encoding else 15)  # 47: gzip or zlib header


def _has_done_line(block: bytes) -> bool:
    """``block`` holds the line ``data: [DONE]`` (not just those bytes within a line)."""
    return any(line in (DONE_LINE, DONE_LINE + b"\r") for line in block.split(b"\n"))


class Headers(dict[str, str]):
    """Answer headers by lower-cased name; ``get`` takes any case."""

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return super().get(name.lower(), default)


class Answer:
    """The parser of one answer; ``done`` once it is whole, ``reusable`` if its connection is."""

    def __init__(self, *, max_bytes: int, lines: bool, clock: Callable[[], float]) -> None:
        self.max_bytes = max_bytes
        self.want_lines = lines
        self.clock = clock
        self.status = 0
        self.headers = Headers()
        self.head_done = False
        self.done = False
        self.reusable = True
        self.parts: list[bytes] = []
        # streamed: runs of whole lines (each ending in \n) as they arrived, and when
        self.blocks: list[tuple[bytes, float]] = []
        self.size = 0
        self.finished_at = 0.0
        self._buf = b""  # the head, or a chunk-size line, still arriving
        self._chunked = False
        self._until_close = False
        self._left = 0  # by length: body bytes still to come; chunked: this chunk's + its CRLF
        self._trailer = False
        self._pending = b""  # the start of a line still arriving
        self._capped = False  # an error answer cut at ERROR_BODY_BYTES
        self._saw_done = False  # a streamed answer's [DONE] line arrived
        self._inflate: Any = None  # a zlib decoder of an encoded body, fed as bytes arrive
        self._stream_chunks = False  # a streamed, chunked, plain answer: _one_chunk may take a read

    @property
    def lines(self) -> list[tuple[bytes, float]]:
        """The streamed lines, without their line ends, each with when its bytes arrived."""
        return [
            (line[:-1] if line.endswith(b"\r") else line, arrived)
            for block, arrived in self.blocks
            for line in block.split(b"\n")[:-1]
        ]

    @property
    def event_stream(self) -> bool:
        kind = (self.headers.get("Content-Type") or "").lower()
        return not kind.startswith("application/json")

    def feed(self, data: bytes) -> None:
        if self.done:
            return  # after [DONE] or a capped error body: the connection is not reused
        if not self.head_done:
            data = self._head(data)
            if not self.head_done or self.done:
                return
        if self._chunked:
            if not (self._stream_chunks and self._one_chunk(data)):
                self._chunks(data)
        elif data:
            if not self._until_close:
                if len(data) > self._left:
                    raise invalid("the server sent more body than its Content-Length announced")
                self._left -= len(data)
            self._body(data)
            if not self._until_close and self._left == 0:
                self._finish()
        if self._saw_done and not self.done:
            # [DONE] ends the stream; the framing that should follow did not come with it: the
            # connection is not reused (as a stream cut at [DONE] never was)
            self._finish(reusable=False)

    def closed(self) -> bool:
        """The connection closed: True when that ends the answer (a body read up to the close)."""
        if self.head_done and self._until_close and not self.done:
            self._finish(reusable=False)
            return True
        return self.done

    def _head(self, data: bytes) -> bytes:
        buf = self._buf + data if self._buf else data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEADER_BYTES:
                raise invalid("the answer's headers are over 64 KiB")
            self._buf = buf
            return b""
        self._buf = b""
        if end > MAX_HEADER_BYTES:
            raise invalid("the answer's headers are over 64 KiB")
        lines = buf[:end].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise invalid(f"the server answered with no HTTP/1.x status line: {lines[0][:80]}")
        if len(lines) > MAX_HEADERS + 1:
            raise invalid(f"the answer has more than {MAX_HEADERS} headers")
        status = int(parts[1])
        rest = buf[end + 4 :]
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            return self._head(rest) if rest else b""
        headers = self.headers
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.status = status
        self.head_done = True
        said = dict.get  # the names asked for are lower-case already: no Headers.get per name
        self.reusable = (said(headers, "connection") or "").lower() != "close" and parts[
            0
        ] != "HTTP/1.0"
        encoding = (said(headers, "content-encoding") or "identity").lower()
        if encoding != "identity":
            self._inflate = _decoder(encoding)
        self.want_lines = self.want_lines and self.event_stream and status < 300
        self._chunked = "chunked" in (said(headers, "transfer-encoding") or "").lower()
        self._stream_chunks = self._chunked and self.want_lines and self._inflate is None
        length = said(headers, "content-length")
        if self._chunked:
            pass
        elif status in (204, 304):
            self._finish()
        elif length is not None:
            if not length.isdigit():
                raise invalid(f"the answer's Content-Length is not a number: {length[:40]}")
            self._left = int(length)
            if self._left > self.max_bytes and status < 300:
                raise too_large(self.max_bytes)
            if self._left == 0:
                self._finish()
        else:
            self._until_close = True
            self.reusable = False
        return rest

    def _chunks(self, data: bytes) -> None:
        if self._buf:
            data = self._buf + data
            self._buf = b""
        pos, end = 0, len(data)
        while pos < end and not self.done:
            if self._left > 2:  # chunk data
                take = min(end - pos, self._left - 2)
                self._body(data[pos : pos + take])
                pos += take
                self._left -= take
                continue
            if self._left > 0:  # the CRLF after a chunk's data
                take = min(end - pos, self._left)
                pos += take
                self._left -= take
                continue
            nl = data.find(b"\r\n", pos)
            if nl < 0:
                if end - pos > MAX_CHUNK_LINE:
                    raise invalid("the answer has a chunk-size line over 4 KiB")
                self._buf = data[pos:]
                return
            line = data[pos:nl]
            pos = nl + 2
            if self._trailer:
                if not line:
                    self._finish()
                continue
            try:
                size = int(line.split(b";", 1)[0] if b";" in line else line, 16)
            except ValueError:
                raise invalid(f"the answer has a bad chunk size: {line[:40]!r}") from None
            if size == 0:
                self._trailer = True
            elif size > 0 and end - pos >= size + 2:  # all of it and its CRLF: at once
                self._body(data[pos : pos + size])
                pos += size + 2
            else:
                self._left = size + 2

    def _one_chunk(self, data: bytes) -> bool:
        """Take a read that is one whole chunk of whole lines (a streaming server's every write,
        as it mostly arrives) in one step, as ``_chunks`` and ``_body`` would: True if it was."""
        if self._left or self._buf or self._pending or self._trailer:
            return False  # in the middle of something: the general way
        nl = data.find(b"\r\n", 0, 18)
        if nl <= 0:
            return False
        line = data[:nl]
        if b";" in line:
            return False
        try:
            size = int(line, 16)
        except ValueError:
            return False  # _chunks says what is wrong with it
        stop = nl + 2 + size
        if size <= 0 or len(data) != stop + 2 or data[stop - 1] != 10:  # 10: b"\n"
            return False
        self.size += size
        if self.size > self.max_bytes:
            raise too_large(self.max_bytes)
        piece = data[nl + 2 : stop]
        self.blocks.append((piece, self.clock()))
        if DONE_LINE in piece and _has_done_line(piece):
            self._saw_done = True
        return True

    def _body(self, piece: bytes) -> None:
        if self._inflate is not None:
            piece = self._decoded(piece)
        self.size += len(piece)
        if self.status >= 300:
            if not self._capped:
                self.parts.append(piece)
            if self.size >= ERROR_BODY_BYTES:
                self._capped = True
                self._finish(reusable=False)
            return
        if self.size > self.max_bytes:
            raise too_large(self.max_bytes)
        if not self.want_lines:
            self.parts.append(piece)
            return
        if self._pending:
            piece = self._pending + piece
        cut = piece.rfind(b"\n") + 1  # kept whole: the lines are split once, when parsed
        if cut < len(piece):
            self._pending = piece[cut:]
            if not cut:
                return
            piece = piece[:cut]
        else:
            self._pending = b""
        self.blocks.append((piece, self.clock()))
        if DONE_LINE in piece and _has_done_line(piece):
            self._saw_done = True

    def _decoded(self, raw: bytes) -> bytes:
        """Encoded bytes decoded as they arrive (a gzip stream's lines keep their arrival
        times), never more than one byte past what the cap leaves."""
        cap = ERROR_BODY_BYTES if self.status >= 300 else self.max_bytes
        try:
            return bytes(self._inflate.decompress(raw, max(1, cap - self.size + 1)))
        except zlib.error as exc:
            raise invalid(f"the answer's encoded body does not decode: {exc}") from exc

    def _finish(self, *, reusable: bool = True) -> None:
        inflate, self._inflate = self._inflate, None
        if inflate is not None and not self._capped:
            try:
                rest = inflate.flush()
            except zlib.error as exc:
                raise invalid(f"the answer's encoded body does not decode: {exc}") from exc
            if rest:
                self._body(rest)
            if self.done:  # the decoded rest capped an error body
                return
        if self._pending:
            self.blocks.append((self._pending.rstrip(b"\r") + b"\n", self.clock()))
            self._pending = b""
        self.done = True
        self.reusable = self.reusable and reusable
        self.finished_at = self.clock()

    def body(self) -> bytes:
        raw = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
        return raw[:ERROR_BODY_BYTES] if self.status >= 300 else raw
