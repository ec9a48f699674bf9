"""The mock's hostile answers (issue 10): wrong shapes, echoed headers, lone surrogates, drips,
keep-alive-only streams, huge bodies — each deterministic, each over real HTTP."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from typing import Any

import pytest
import requests

from calibrate.cli import build_parser
from calibrate.cli.mock import settings_from_args
from calibrate.mock.http import WAITING_TIMEOUT_S
from tests.mockserver import start_mock

FAST: dict[str, Any] = {"ttft_s": 0.001, "per_token_s": 0.0001}
CHAT = {"model": "internlm-s2", "messages": [{"role": "user", "content": "What is an array?"}]}
STREAM = CHAT | {"stream": True}


def _shape(reply: dict[str, Any]) -> str:
    """Which wrong shape a reply has (the mock's names)."""
    if "choices" not in reply:
        return "no-choices"
    if "usage" in reply:
        return "huge-usage" if reply["usage"]["completion_tokens"] > 0 else "negative-usage"
    (choice,) = reply["choices"]
    if choice is None:
        return "choices-null"
    if choice == 1:
        return "choices-number"
    message = choice["message"]
    if not isinstance(message, dict):
        return "message-string"
    assert message["content"] == 42
    return "content-number"


def _shapes(seed: int, n: int = 40) -> list[str]:
    with start_mock(**FAST, malformed_rate=1.0, seed=seed) as mock:
        url = f"{mock.base_url}/chat/completions"
        return [_shape(requests.post(url, json=CHAT, timeout=5).json()) for _ in range(n)]


def test_malformed_rate_sends_every_wrong_shape_reproducibly() -> None:
    first = _shapes(seed=3)
    assert set(first) == {
        "no-choices",
        "choices-null",
        "choices-number",
        "message-string",
        "content-number",
        "huge-usage",
        "negative-usage",
    }
    assert _shapes(seed=3) == first  # same seed, same sequence
    with start_mock(**FAST, malformed_rate=0.3, seed=1) as mock:
        url = f"{mock.base_url}/chat/completions"
        replies = [requests.post(url, json=CHAT, timeout=5).json() for _ in range(60)]
    good = [
        r
        for r in replies
        if isinstance((r.get("choices") or [None])[0], dict)
        and isinstance(r["choices"][0].get("message"), dict)
        and isinstance(r["choices"][0]["message"]["content"], str)
    ]
    assert 20 < len(good) < 60  # a rate, not all or nothing


def test_malformed_streams_carry_a_wrong_chunk() -> None:
    with start_mock(**FAST, malformed_rate=1.0) as mock:
        text = requests.post(f"{mock.base_url}/chat/completions", json=STREAM, timeout=5).text
    events = [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) == 2
    chunk = json.loads(events[0])
    assert chunk["object"] == "chat.completion.chunk"
    assert (
        "choices" not in chunk
        or not isinstance(chunk["choices"][0], dict)
        or (
            not isinstance(chunk["choices"][0].get("delta"), dict)
            or not isinstance(chunk["choices"][0]["delta"].get("content"), str)
        )
    )


def test_echo_headers_repeats_the_authorization_header_in_a_500() -> None:
    with start_mock(**FAST, echo_headers_rate=1.0) as mock:
        resp = requests.post(
            f"{mock.base_url}/chat/completions",
            json=CHAT,
            headers={"Authorization": "Bearer sk-echo-me"},
            timeout=5,
        )
    assert resp.status_code == 500
    assert "Authorization: Bearer sk-echo-me" in resp.json()["message"]


def test_lone_surrogate_travels_as_a_json_escape() -> None:
    with start_mock(**FAST, lone_surrogate=True) as mock:
        url = f"{mock.base_url}/chat/completions"
        raw = requests.post(url, json=CHAT, timeout=5).content
        streamed = requests.post(url, json=STREAM, timeout=5).content
    assert b"\\ud800" in raw and json.loads(raw)["choices"][0]["message"]["content"][-1] == "\ud800"
    assert b"\\ud800" in streamed


def test_drip_sends_the_answer_one_byte_at_a_time() -> None:
    with start_mock(**FAST, drip_s=0.002) as mock:
        start = time.monotonic()
        resp = requests.post(f"{mock.base_url}/chat/completions", json=CHAT, timeout=30)
        elapsed = time.monotonic() - start
        health = requests.get(f"{mock.base_url}/models", timeout=5)  # only answers drip
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"]
    assert elapsed >= 0.9 * len(resp.content) * 0.002
    assert health.elapsed.total_seconds() < 0.5


def test_keepalive_only_streams_pings_and_nothing_else_until_its_limit() -> None:
    with start_mock(**FAST, keepalive_only=True, keepalive_limit_s=0.6) as mock:
        start = time.monotonic()
        resp = requests.post(f"{mock.base_url}/chat/completions", json=STREAM, timeout=10)
        elapsed = time.monotonic() - start
    frames = [f for f in resp.text.split("\n\n") if f]
    assert len(frames) >= 2 and set(frames) == {": ping"}
    assert 0.5 <= elapsed < 5


def test_keepalive_only_ends_when_the_client_leaves() -> None:
    with start_mock(**FAST, keepalive_only=True, keepalive_limit_s=30) as mock:
        request = json.dumps(STREAM).encode()
        with socket.create_connection(("127.0.0.1", mock.port), timeout=5) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                b"\r\nContent-Length: %d\r\n\r\n%s" % (len(request), request)
            )
            got = b""
            while b": ping" not in got:
                got += sock.recv(4096) or b"<closed>"
                assert b"<closed>" not in got
        deadline = time.monotonic() + 5
        while mock.model.snapshot().in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mock.model.snapshot().in_flight == 0  # the handler noticed and ended


def test_huge_mib_pads_the_answer() -> None:
    with start_mock(**FAST, huge_mib=2) as mock:
        url = f"{mock.base_url}/chat/completions"
        full = requests.post(url, json=CHAT, timeout=10)
        streamed = requests.post(url, json=STREAM, timeout=10)
    assert len(full.json()["choices"][0]["message"]["content"]) >= 2 * 1024 * 1024 - 1
    assert len(streamed.content) > 2 * 1024 * 1024


@pytest.mark.parametrize(
    ("flags", "field", "value"),
    [
        (["--malformed-rate", "0.5"], "malformed_rate", 0.5),
        (["--echo-headers-rate", "1"], "echo_headers_rate", 1.0),
        (["--lone-surrogate"], "lone_surrogate", True),
        (["--drip-s", "0.5"], "drip_s", 0.5),
        (["--keepalive-only", "--keepalive-limit-s", "5"], "keepalive_only", True),
        (["--huge-mib", "3"], "huge_mib", 3.0),
    ],
)
def test_hostile_flags_reach_the_settings(flags: list[str], field: str, value: object) -> None:
    args = build_parser().parse_args(["mock", *flags])
    assert getattr(settings_from_args(args), field) == value


def test_hostile_flags_are_documented(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["mock", "--help"])
    text = capsys.readouterr().out
    for flag in (
        "--malformed-rate",
        "--echo-headers-rate",
        "--lone-surrogate",
        "--drip-s",
        "--keepalive-only",
        "--huge-mib",
    ):
        assert flag in text


# -- the mock against hostile clients (issue 23): bad flags, malformed requests, slowloris ----


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--per-token", "inf"], "--per-token inf"),
        (["--ttft", "nan"], "--ttft nan"),
        (["--drip-s", "inf"], "--drip-s inf"),
        (["--slow-s=-inf"], "--slow-s -inf"),
        (["--keepalive-limit-s", "inf"], "--keepalive-limit-s inf"),
        (["--retry-after", "nan"], "--retry-after nan"),
        (["--port", "70000"], "--port 70000"),
        (["--port=-1"], "--port -1"),
    ],
)
def test_mock_flags_out_of_range_exit_2_with_a_message(
    cli: Any, flags: list[str], says: str
) -> None:
    result = cli("mock", *flags)
    assert result.code == 2, result.err
    assert says in result.err and "Traceback" not in result.err


def _raw(port: int, request: bytes, timeout_s: float = 5.0) -> bytes:
    """Send ``request`` as is; the answer's bytes until the server closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(request)
        parts = []
        with contextlib.suppress(TimeoutError):
            while piece := sock.recv(65536):
                parts.append(piece)
                if b"\r\n\r\n" in b"".join(parts) and _complete(b"".join(parts)):
                    break
    return b"".join(parts)


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def _post(body: bytes, length: str | None = None) -> bytes:
    size = str(len(body)) if length is None else length
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {size}\r\n\r\n".encode()
        + body
    )


LONE = b'{"model": "internlm-s2", "messages": [{"role": "user", "content": "a \\ud800 b"}]}'


@pytest.mark.parametrize(
    ("request_bytes", "says"),
    [
        (_post(b"[" * 100_000), b"nested too deeply"),
        (_post(b'{"a": ' * 50_000 + b"1" + b"}" * 50_000), b"nested too deeply"),
        (_post(LONE), b"lone surrogate"),
        (_post(b"{}", "abc"), b"Content-Length"),
        (_post(b"{}", "-1"), b"Content-Length"),
        (_post(b"{}", "1e3"), b"Content-Length"),
        (_post(b"{}", str(2**70)), b"Content-Length"),
    ],
    ids=[
        "nested-array",
        "nested-object",
        "lone-surrogate",
        "cl-abc",
        "cl-minus-1",
        "cl-float",
        "cl-huge",
    ],
)
def test_a_malformed_request_is_answered_400(request_bytes: bytes, says: bytes) -> None:
    with start_mock(**FAST) as mock:
        start = time.monotonic()
        answer = _raw(mock.port, request_bytes)
        elapsed = time.monotonic() - start
        after = requests.post(f"{mock.base_url}/chat/completions", json=CHAT, timeout=5)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert says in answer and elapsed < 3
    assert after.status_code == 200  # and it goes on serving


def test_a_valid_surrogate_pair_is_still_answered() -> None:
    pair = b'{"model": "internlm-s2", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    with start_mock(**FAST) as mock:
        answer = _raw(mock.port, _post(pair))
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


def _slowloris(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(sock)
    return socks


def test_thousands_of_slowloris_connections_do_not_stall_the_mock() -> None:
    from calibrate.mock.http import BackgroundServer
    from calibrate.mock.settings import MockSettings

    server = BackgroundServer(MockSettings(**FAST), max_connections=200)
    port = server.server.port
    socks: list[socket.socket] = []
    try:
        socks = _slowloris(port, 2000)
        start = time.monotonic()
        resp = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=CHAT, timeout=25)
        elapsed = time.monotonic() - start
        # answered once the accept loop reaches it: under 1 s on a quiet machine, and a fresh
        # clone's run beside two CPU burners failed the 5 s once asked here; stalled, it would
        # wait WAITING_TIMEOUT_S (30 s) for a connection to time out and free a slot
        assert resp.status_code == 200 and elapsed < WAITING_TIMEOUT_S / 2
        assert server.server.open_connections() <= 200
    finally:
        for sock in socks:
            sock.close()
        server.stop()


@pytest.mark.parametrize("drip", [b"", b"X-Slow: a"], ids=["idle", "dripping-headers"])
def test_a_connection_waiting_too_long_for_its_request_is_closed(drip: bytes) -> None:
    from calibrate.mock.http import BackgroundServer
    from calibrate.mock.settings import MockSettings

    server = BackgroundServer(MockSettings(**FAST), waiting_timeout_s=1.0)
    try:
        sock = socket.create_connection(("127.0.0.1", server.server.port), timeout=10)
        start = time.monotonic()
        closed = False
        with sock:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\n" if drip else b"")
            for byte in drip * 40:
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    closed = True
                    break
                time.sleep(0.1)
            if not closed:
                try:
                    closed = sock.recv(1) == b""
                except OSError:
                    closed = True
        elapsed = time.monotonic() - start
    finally:
        server.stop()
    assert closed and elapsed < 3.5


@pytest.mark.parametrize("fd_limit", [512, 1024])
def test_the_mock_process_survives_slowloris_under_its_open_file_limit(fd_limit: int) -> None:
    """2000 slow clients against a mock allowed ``fd_limit`` open files (a common default):
    without a bound on connections, accept() would fail for everyone, the real client too."""
    import os
    import resource
    import subprocess
    import sys
    from pathlib import Path

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "calibrate", "mock", "--port", "0", "--ttft", "0.001"],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(repo)),
        preexec_fn=limit,
    )
    socks: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip().rsplit(" ", 1)[-1]
        port = int(base_url.rsplit(":", 1)[1].split("/", 1)[0])
        socks = _slowloris(port, 2000)
        resp = requests.post(f"{base_url}/chat/completions", json=CHAT, timeout=10)
        assert resp.status_code == 200
    finally:
        for sock in socks:
            sock.close()
        proc.terminate()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
