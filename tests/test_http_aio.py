"""The asyncio transport (calibrate.http.aio): its parser fed a byte at a time, and the client over
it against servers that send exactly the bytes a test gives (framing the mock never uses)."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from calibrate.errors import RequestError
from calibrate.http.aio.wire import Answer
from calibrate.http.client import OpenAIClient
from calibrate.http.models import SamplingParams
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
def raw_server(reply: bytes, *, hold_s: float = 0.0) -> Iterator[str]:
    """Answers every request with ``reply``, then keeps the connection ``hold_s`` and closes it."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            conn.sendall(reply)
            stop.wait(hold_s)

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_a_stream_ending_at_done_without_its_last_chunk_returns_at_once() -> None:
    with raw_server(SSE_HEAD + _sse(CHUNK, LAST, b"[DONE]"), hold_s=10) as url:
        client = OpenAIClient(url, timeout_s=5, io="asyncio")
        start = time.monotonic()
        answer = client.chat("m", "hi", PARAMS, stream=True)
        client.close()
    assert time.monotonic() - start < 2.5
    assert answer.choices[0].text == "hi!" and answer.ttft_s is not None


def test_a_body_that_ends_when_the_server_closes() -> None:
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
    with raw_server(reply + PLAIN) as url:
        client = OpenAIClient(url, timeout_s=5, io="asyncio")
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
        client = OpenAIClient(url, timeout_s=5, io="asyncio")
        with pytest.raises(RequestError) as caught:
            client.chat("m", "hi", PARAMS)
        client.close()
    assert caught.value.kind == kind


def test_a_gzip_body_sent_unasked_is_decoded() -> None:
    body = gzip.compress(PLAIN)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
    answer = _fed(head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body), lines=True)
    assert answer.body() == PLAIN


@pytest.mark.parametrize("io", ["asyncio", "urllib3"])
def test_no_server_is_connect(io: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = OpenAIClient(f"http://127.0.0.1:{port}/v1", timeout_s=5, io=io)  # type: ignore[arg-type]
    with pytest.raises(RequestError) as caught:
        client.chat("m", "hi", PARAMS)
    assert caught.value.kind == "connect" and "connection refused" in caught.value.info.message


def test_both_transports_read_the_same_answers() -> None:
    with start_mock(ttft_s=0.01, per_token_s=0.001) as mock:
        got = []
        for io in ("asyncio", "urllib3"):
            client = OpenAIClient(mock.base_url, timeout_s=10, io=io)  # type: ignore[arg-type]
            plain = client.chat("internlm-s2", "hi", PARAMS)
            streamed = client.chat("internlm-s2", "hi", PARAMS, stream=True)
            client.close()
            assert streamed.ttft_s is not None and 0 < streamed.ttft_s <= streamed.elapsed_s
            got.append((plain.choices, plain.usage, streamed.choices, streamed.usage))
    assert got[0] == got[1]
