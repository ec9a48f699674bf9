"""The asyncio transport (calibrate.http.aio): its parser fed a byte at a time, and the client over
it against servers that send exactly the bytes a test gives (framing the mock never uses)."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from calibrate.errors import RequestError
from calibrate.http.aio.bridge import INLINE_BYTES, AioTransport
from calibrate.http.aio.connection import Connections, _Connection
from calibrate.http.aio.wire import Answer
from calibrate.http.client import OpenAIClient
from calibrate.http.models import Completion, SamplingParams
from calibrate.load.request import Request
from calibrate.load.sender import Sender
from tests.mockserver import start_mock

PARAMS = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=8)
CHUNK = b'{"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}'
LAST = b'{"choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"stop"}]}'
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
PLAIN = json.dumps(
    {"choices": [{"index": 0, "message": {"content": "hello"}, "finish_reason": "stop"}]}
).encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(*events: bytes) -> bytes:
    return b"".join(_chunk(b"data: " + e + b"\n\n") for e in events)


def _fed(raw: bytes, *, lines: bool, step: int = 1, max_bytes: int = 1 << 20) -> Answer:
    answer = Answer(max_bytes=max_bytes, lines=lines, clock=time.perf_counter)
    for i in range(0, len(raw), step):
        answer.feed(raw[i : i + step])
    return answer


def test_a_chunked_stream_fed_a_byte_at_a_time_gives_its_lines_and_ends() -> None:
    raw = SSE_HEAD + _sse(CHUNK, LAST, b"[DONE]") + b"0\r\n\r\n"
    for step in (1, 7, len(raw)):
        answer = _fed(raw, lines=True, step=step)
        # reused only when the closing chunk came with [DONE] (else the stream ended at [DONE])
        assert answer.done and answer.reusable == (step == len(raw))
        assert [line for line, _ in answer.lines if line] == [
            b"data: " + CHUNK,
            b"data: " + LAST,
            b"data: [DONE]",
        ]


def test_a_plain_body_after_an_interim_100_continue() -> None:
    head = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    raw = head + b"Content-Length: %d\r\n\r\n%s" % (len(PLAIN), PLAIN)
    answer = _fed(raw, lines=False, step=3)
    assert answer.done and answer.status == 200 and answer.body() == PLAIN


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70000 + b"\r\n\r\n", "over 64 KiB"),
        (SSE_HEAD + b"zz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n", "larger than"),
        (b"SSH-2.0-OpenSSH\r\n\r\n", "no HTTP/1.x status line"),
    ],
    ids=["huge-headers", "bad-chunk", "over-cap", "not-http"],
)
def test_malformed_answers_are_invalid_response(raw: bytes, words: str) -> None:
    with pytest.raises(RequestError) as caught:
        _fed(raw, lines=True, step=4096)
    assert caught.value.kind == "invalid_response" and words in caught.value.info.message


@contextmanager
def serving(serve: Callable[[socket.socket, int, threading.Event], None]) -> Iterator[str]:
    """A listener on a free port: ``serve(conn, n, stop)`` on a thread for the n-th connection
    (``stop`` is set when the test is over). Yields the base URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        count = 0
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn, count, stop), daemon=True).start()
            count += 1

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


@contextmanager
def raw_server(reply: bytes, *, hold_s: float = 0.0) -> Iterator[str]:
    """Answers every request with ``reply``, then keeps the connection ``hold_s`` and closes it."""

    def serve(conn: socket.socket, _: int, stop: threading.Event) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            conn.sendall(reply)
            stop.wait(hold_s)

    with serving(serve) as url:
        yield url


@contextmanager
def idle_closing_server(close_after_s: float) -> Iterator[tuple[str, list[int]]]:
    """Answers the first request of each connection and keeps it alive; the next request on it
    is read, then, ``close_after_s`` later, the connection is closed unanswered (as an engine
    closing an idle connection just as the client reuses it). Yields the URL and the number of
    requests each connection received."""
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    seen: dict[int, int] = {}

    def serve(conn: socket.socket, index: int, stop: threading.Event) -> None:
        seen[index] = 0
        with conn:
            data = b""
            while seen[index] < 2:
                while b"\r\n\r\n" not in data:
                    got = conn.recv(65536)
                    if not got:
                        return
                    data += got
                head, data = data.split(b"\r\n\r\n", 1)
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                seen[index] += 1
                if seen[index] == 1:
                    conn.sendall(reply % (len(PLAIN), PLAIN))
            stop.wait(close_after_s)

    counts: list[int] = []
    with serving(serve) as url:
        yield url, counts
        counts.extend(seen[n] for n in sorted(seen))


def test_a_kept_alive_connection_closed_as_it_is_reused_is_replaced_once() -> None:
    with idle_closing_server(close_after_s=0.0) as (url, seen):
        client = OpenAIClient(url, timeout_s=5)
        answers = [client.chat("m", "hi", PARAMS) for _ in range(2)]
        client.close()
    assert [a.choices[0].text for a in answers] == ["hello", "hello"]
    assert seen[:2] == [2, 1]  # the second request went once more, on a new connection


def test_a_reused_connection_that_dies_while_the_server_works_is_not_resent() -> None:
    """Closed long after the request arrived: the server had it (an engine that died while
    generating) — the failure is reported, never sent a second time behind the user's back."""
    with idle_closing_server(close_after_s=1.0) as (url, seen):
        client = OpenAIClient(url, timeout_s=5)
        client.chat("m", "hi", PARAMS)
        with pytest.raises(RequestError) as caught:
            client.chat("m", "hi", PARAMS)
        client.close()
    assert caught.value.kind in ("reset", "connect")
    assert seen == [2]


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_a_connection_reset_before_its_request_is_written_is_a_dropped_connection(
    kind: str,
) -> None:
    """A server killed mid-batch resets a connection just made (or kept) before the request is
    written on it: uvloop's write then raised RuntimeError, and batch recorded the item as an
    ``internal`` failure. It is a dropped connection (OSError: ``reset``, or on a reused
    connection one more try on a new one), and an idle one closing is never handed out."""
    loop = pytest.importorskip("uvloop").new_event_loop() if kind == "uvloop" else None
    loop = loop or asyncio.new_event_loop()
    transport = AioTransport(
        connect_timeout_s=2, max_bytes=1 << 20, max_connections=4, clock=time.monotonic
    )

    def holding(conn: socket.socket, _: int, stop: threading.Event) -> None:
        with conn:  # accepts, reads nothing, answers nothing
            stop.wait(5)

    with serving(holding) as url:
        origin = ("http", "127.0.0.1", int(url.rsplit(":", 1)[1].split("/", 1)[0]))
        call = transport.call(
            "POST",
            origin,
            url,
            "/v1/chat/completions",
            time.monotonic() + 5,
            body=b"{}",
            headers={},
            lines=False,
            timeout_s=5,
        )

        async def reset_then_write() -> tuple[bool, bool]:
            connections = Connections(4)
            _, conn = await loop.create_connection(_Connection, "127.0.0.1", origin[2])
            conn.abort()  # the reset: the transport closes at once, connection_lost runs next
            connections._idle[origin] = [conn]
            fresh = await connections._connect(call, loop.time() + 5)
            fresh.abort()
            await asyncio.sleep(0.05)  # connection_lost has run: the transport is closed
            with pytest.raises(ConnectionResetError, match="the connection was closed"):
                await connections._exchange(conn, call, loop.time() + 5)
            await asyncio.sleep(0.05)
            return fresh is conn, conn.lost

        handed_out, lost = loop.run_until_complete(reset_then_write())
    loop.close()
    assert not handed_out, "a connection whose close has come in is not reused"
    assert lost


def test_a_stream_ending_at_done_without_its_last_chunk_returns_at_once() -> None:
    with raw_server(SSE_HEAD + _sse(CHUNK, LAST, b"[DONE]"), hold_s=10) as url:
        client = OpenAIClient(url, timeout_s=5)
        start = time.monotonic()
        answer = client.chat("m", "hi", PARAMS, stream=True)
        client.close()
    assert time.monotonic() - start < 2.5
    assert answer.choices[0].text == "hi!" and answer.ttft_s is not None


def test_a_body_that_ends_when_the_server_closes() -> None:
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
    with raw_server(reply + PLAIN) as url:
        client = OpenAIClient(url, timeout_s=5)
        answer = client.chat("m", "hi", PARAMS)
        client.close()
    assert answer.choices[0].text == "hello"


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\n", "overloaded"),
        (b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere/\r\n", "http_4xx"),
        (b"HTTP/1.1 500 Internal Server Error\r\n", "http_5xx"),
    ],
)
def test_error_answers_keep_their_kind(head: bytes, kind: str) -> None:
    body = b'{"error": {"message": "busy"}}'
    with raw_server(head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)) as url:
        client = OpenAIClient(url, timeout_s=5)
        with pytest.raises(RequestError) as caught:
            client.chat("m", "hi", PARAMS)
        client.close()
    assert caught.value.kind == kind


def test_a_gzip_body_sent_unasked_is_decoded() -> None:
    body = gzip.compress(PLAIN)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
    answer = _fed(head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body), lines=True)
    assert answer.body() == PLAIN


def test_a_gzip_stream_is_decoded_as_it_arrives_each_line_at_its_own_time() -> None:
    """A server that gzips its event stream unasked: each event is read when its bytes arrive
    (TTFT and the gaps between tokens are real), not all at the stream's end."""
    ticks = iter(range(1000))
    answer = Answer(max_bytes=1 << 20, lines=True, clock=lambda: float(next(ticks)))
    answer.feed(SSE_HEAD.replace(b"\r\n\r\n", b"\r\nContent-Encoding: gzip\r\n\r\n"))
    packer = zlib.compressobj(wbits=31)
    for event in (CHUNK, LAST, b"[DONE]"):
        piece = packer.compress(b"data: " + event + b"\n\n") + packer.flush(zlib.Z_SYNC_FLUSH)
        answer.feed(_chunk(piece))
    answer.feed(_chunk(packer.flush()) + b"0\r\n\r\n")
    events = [(line, at) for line, at in answer.lines if line]
    assert [line for line, _ in events] == [b"data: " + CHUNK, b"data: " + LAST, b"data: [DONE]"]
    assert len({at for _, at in events}) == 3
    assert answer.done


@pytest.mark.parametrize("status", [b"200 OK", b"500 Internal Server Error"])
def test_a_gzip_bomb_is_cut_at_the_cap_never_inflated_whole(status: bytes) -> None:
    bomb = gzip.compress(b"\0" * (64 << 20))  # 64 MiB of zeros in about 64 KiB
    head = (
        b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
    )
    raw = head + b"Content-Length: %d\r\n\r\n%s" % (len(bomb), bomb)
    if status.startswith(b"200"):
        with pytest.raises(RequestError) as caught:
            _fed(raw, lines=False, step=1 << 16, max_bytes=1 << 20)
        assert caught.value.kind == "invalid_response"
    else:  # an error answer keeps its first 64 KiB, decoded
        answer = _fed(raw, lines=False, step=1 << 16, max_bytes=1 << 20)
        assert answer.done and not answer.reusable
        assert answer.body() == b"\0" * 65536


def test_no_server_is_connect() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = OpenAIClient(f"http://127.0.0.1:{port}/v1", timeout_s=5)
    with pytest.raises(RequestError) as caught:
        client.chat("m", "hi", PARAMS)
    assert caught.value.kind == "connect" and "connection refused" in caught.value.info.message


def _established_to(port: int) -> int:
    """This box's TCP connections to ``port`` that are open (ESTABLISHED), from the client side."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    count += 1
    return count


def test_after_a_burst_at_most_max_connections_stay_open() -> None:
    """16 requests at once on a client of ``max_connections=4``: all are answered (the burst
    is never made to wait for a connection), then no more than 4 stay open to the server."""
    with start_mock(ttft_s=0.05, per_token_s=0.0) as mock:
        client = OpenAIClient(mock.base_url, timeout_s=10, max_connections=4)
        port = int(mock.base_url.rsplit(":", 1)[1].split("/")[0])
        texts: list[str] = []

        def ask() -> None:
            texts.append(client.chat("internlm-s2", "hi", PARAMS).choices[0].text)

        threads = [threading.Thread(target=ask) for _ in range(16)]
        start = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        took_s = time.monotonic() - start
        time.sleep(0.2)
        open_after = _established_to(port)
        client.close()
    assert len(texts) == 16 and all(texts)
    assert took_s < 0.05 * 16 / 2  # not 4 at a time
    assert 1 <= open_after <= 4


def test_a_plain_and_a_streamed_answer_read_the_same() -> None:
    with start_mock(ttft_s=0.01, per_token_s=0.001) as mock:
        client = OpenAIClient(mock.base_url, timeout_s=10)
        plain = client.chat("internlm-s2", "hi", PARAMS)
        streamed = client.chat("internlm-s2", "hi", PARAMS, stream=True)
        client.close()
    assert streamed.ttft_s is not None and 0 < streamed.ttft_s <= streamed.elapsed_s
    assert (plain.choices, plain.usage) == (streamed.choices, streamed.usage)


class _Watching(OpenAIClient):
    """The real client, noting the thread each answer is read (parsed) on."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.read_on: list[str] = []

    def _read(
        self, path: str, body: dict[str, Any], start: float
    ) -> Callable[[Answer], Completion]:
        read = super()._read(path, body, start)

        def watched(answer: Answer) -> Completion:
            self.read_on.append(threading.current_thread().name)
            return read(answer)

        return watched


@pytest.mark.parametrize(
    ("stream", "min_tokens", "parsed_on"),
    [(True, 0, "calibrate-parse"), (False, 4000, "calibrate-parse"), (False, 0, "calibrate-io")],
    ids=["stream", "large-plain", "small-plain"],
)
def test_streams_and_large_answers_are_parsed_off_the_io_loop_small_whole_ones_on_it(
    stream: bool, min_tokens: int, parsed_on: str
) -> None:
    """The I/O loop sends, reads and stamps: parsing a streamed answer there held every other
    stream's bytes (and their timestamps) back, so streams, and whole answers over
    ``INLINE_BYTES``, go to the one parser thread. A small whole answer is parsed on the loop:
    handing it to that thread and back cost more CPU than its parse (``make bench``)."""
    with start_mock(ttft_s=0.001, per_token_s=0.0) as mock:
        client = _Watching(mock.base_url, timeout_s=10)
        params = SamplingParams(0.0, 4080, 1.0, None)
        body = client.chat_body("internlm-s2", "hi", params, stream=stream)
        if min_tokens:
            body["min_tokens"] = min_tokens  # vLLM's field, the mock's too: a long answer
        requests = [Request("/chat/completions", body, ("hi",), n) for n in range(1, 9)]
        items, _ = Sender.over(client).send(requests, 8, 4080)
        client.close()
    assert all(i.ok for i in items) and len(items) == 8, [i.error for i in items]
    big = [len((i.text or "").encode()) > INLINE_BYTES for i in items]
    assert all(big) if min_tokens else not any(big)  # each on the side the case is about
    assert set(client.read_on) == {parsed_on}


class _ContextReader(OpenAIClient):
    """The real client, noting the thread the server's context is read on (``GET /props``)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.context_read_on: list[str] = []

    def get_text(self, url_or_path: str, *, timeout_s: float = 5.0) -> str:
        if url_or_path == "/props":
            self.context_read_on.append(threading.current_thread().name)
        return super().get_text(url_or_path, timeout_s=timeout_s)


def test_a_forced_answer_cut_short_is_incomplete_and_the_context_is_read_off_the_io_loop() -> None:
    """A forced answer the server cut short is an incomplete item, judged against the server's
    context; that context is read over HTTP (the control plane), never on the I/O loop, where a
    blocking read would stall every other stream's bytes and stamps."""
    with start_mock(ttft_s=0.001, per_token_s=0.0, truncate_rate=1.0) as mock:
        client = _ContextReader(mock.base_url, timeout_s=10)
        params = SamplingParams(0.0, 40, 1.0, None)
        body = {**client.chat_body("internlm-s2", "hi", params, stream=False), "min_tokens": 40}
        requests = [
            Request("/chat/completions", body, ("hi",), n, forced_tokens=40) for n in (1, 2)
        ]
        items, _ = Sender.over(client).send(requests, 2, 40)
        client.close()
    assert [i.ok for i in items] == [False, False]
    assert all(i.error is not None and i.error.kind == "incomplete" for i in items), items
    assert client.context_read_on, "a cut answer is judged against the server's context"
    assert "calibrate-io" not in client.context_read_on, "read on the I/O loop's thread"


def test_a_request_is_never_cut_before_its_timeout_s() -> None:
    """uvloop's clock and timers count whole milliseconds (its time() truncates, call_at
    rounds): a timer armed for the deadline fired up to 0.8 ms before it, and a request cut at
    `timeout_s 1` read 0.999989 s in its record. Against a server that never answers, each of
    many calls started at scattered sub-millisecond offsets takes at least its timeout_s."""
    timeout_s = 0.02
    with raw_server(b"", hold_s=10) as url:
        client = OpenAIClient(url, timeout_s=timeout_s)
        early_s = []
        for i in range(40):
            time.sleep(0.00037 * (i % 7))
            start = time.monotonic()
            with pytest.raises(RequestError) as caught:
                client.chat("m", "hi", PARAMS)
            took_s = time.monotonic() - start
            # the deadline cut the answer's wait, or (a busy machine slow to accept) the connect
            assert caught.value.kind in ("timeout", "connect"), caught.value
            early_s.append(timeout_s - took_s)
        client.close()
    assert max(early_s) <= 0, f"cut up to {max(early_s) * 1e3:.3f} ms before timeout_s"
