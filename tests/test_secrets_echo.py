"""A key echoed inside a SUCCESSFUL answer never reaches a file or the terminal (issue 23, 8).

A hostile server answers every request well, but puts the Authorization it received into the
answer: as the served model, in the text (as is, upper-cased, base64, split across a line break
and across two stream chunks), in ``system_fingerprint`` and in ``/v1/models``. After `single`,
`single --stream`, `batch` and `status`, no file under the folder and no stdout/stderr holds the
key, the base-URL password, or any of those forms.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import FAKE_KEY, write_config

PASSWORD = "s3cr3t-pa55word"


def _forms(secret: str) -> list[str]:
    encoded = base64.b64encode(secret.encode()).decode()
    return [secret, secret.upper(), secret.lower(), encoded[:-4], secret[: len(secret) // 2 + 1]]


class Echo(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _EchoHandler)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _EchoHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _secret(self) -> str:
        auth = self.headers.get("Authorization") or ""
        kind, _, value = auth.partition(" ")
        if kind == "Basic":
            return base64.b64decode(value).decode().partition(":")[2] + " " + value
        return value

    def _send(self, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        models = [{"id": "internlm-s2"}, {"id": self._secret()}]
        self._send(json.dumps({"object": "list", "data": models}).encode())

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        key = self._secret()
        half = len(key) // 2
        text = (
            f"ok {key} {key.upper()} {base64.b64encode(key.encode()).decode()} "
            f"{key[:half]}\n{key[half:]} Authorization: {self.headers.get('Authorization')}"
        )
        usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
        if not request.get("stream"):
            body = {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": key,
                "system_fingerprint": key,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
            self._send(json.dumps(body).encode())
            return
        pieces = [text, key[:half], key[half:]]  # the key split across two chunks too
        events = [
            {
                "model": key,
                "system_fingerprint": key,
                "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}],
            }
            for piece in pieces
        ]
        events.append(
            {"model": key, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        )
        events.append({"model": key, "choices": [], "usage": usage})
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        self._send(body.encode(), "text/event-stream")


@pytest.fixture
def echo() -> Iterator[Echo]:
    server = Echo()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def _everything(root: Path, results: list[Any]) -> str:
    files = [p for p in root.rglob("*") if p.is_file() and p.name != "calibrate.toml"]
    text = "\n".join(p.read_bytes().decode("utf-8", errors="replace") for p in files)
    return text + "".join(r.out + r.err for r in results)


@pytest.mark.parametrize("how", ["api key", "base-url password"])
def test_a_secret_echoed_in_a_successful_answer_is_nowhere(
    cli: Any, isolated: Path, echo: Echo, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "api key":
        monkeypatch.setenv("CALIBRATE_API_KEY", FAKE_KEY)
        url, secrets = echo.root + "/v1", [FAKE_KEY]
    else:
        url = echo.root.replace("http://", f"http://bob:{PASSWORD}@") + "/v1"
        basic = base64.b64encode(f"bob:{PASSWORD}".encode()).decode()
        secrets = [PASSWORD, basic]
    write_config(isolated / "calibrate.toml", url)
    (isolated / "in.jsonl").write_text(
        "".join(f'{{"id": {i}, "text": "item {i}"}}\n' for i in range(3)), encoding="utf-8"
    )
    results = [
        cli("single", "--json"),
        cli("single", "--json", "--stream", "--force"),
        cli("batch", "--json", "--input", "in.jsonl", "--out", "out.jsonl", "--retries", "0"),
        cli("batch", "--input", "in.jsonl", "--out", "stream.jsonl", "--stream"),
        cli("status", "--json"),
        cli("status", "--show-config"),
    ]
    assert all("Traceback" not in r.err for r in results)
    assert results[2].code == 0, results[2].err  # the answers were good: the batch passed
    out = (isolated / "out.jsonl").read_text("utf-8")
    assert out.count('"ok":true') == 3 and "[REDACTED]" in out
    everything = _everything(isolated, results)
    for secret in secrets:
        for form in _forms(secret):
            assert form not in everything, f"{form!r} ({how}) was stored or printed"


def _b64_at(offset: int, secret: str) -> str:
    return base64.b64encode(("x" * offset + secret + "yz").encode()).decode()


@pytest.mark.parametrize(
    "form",
    [
        lambda k: k,
        str.upper,
        str.lower,
        str.swapcase,
        lambda k: f"{k[:7]} {k[7:]}",
        lambda k: f"{k[:5]}\n{k[5:12]}\t{k[12:]}",
        lambda k: f"{k[:6]}\u2003{k[6:]}",  # an em space
        lambda k: json.dumps(f"{k[:9]}\n{k[9:]}"),  # a split key as JSON escapes it
        lambda k: _b64_at(0, k),
        lambda k: _b64_at(1, k),
        lambda k: _b64_at(2, k),
        lambda k: base64.urlsafe_b64encode(("?>" + k).encode()).decode(),
        lambda k: urllib.parse.quote(k, safe=""),  # as a query string carries it
    ],
)
def test_every_cheap_form_of_a_remembered_key_is_scrubbed(form: Any) -> None:
    from calibrate import redact

    key = "sk-Echo-0123456789abcdef+/"
    redact.forget_all()
    try:
        redact.remember(key)
        shown = redact.scrub(f"before {form(key)} after")
        assert "[REDACTED]" in shown and shown.startswith("before ") and shown.endswith(" after")
        assert key[4:16] not in shown and key[4:16].upper() not in shown
    finally:
        redact.forget_all()


def test_ordinary_text_and_short_values_are_left_alone() -> None:
    from calibrate import redact

    redact.forget_all()
    try:
        redact.remember("abc", "", None, "sk-Echo-0123456789")
        text = "the bearer of good news, abc, token counts, sk-Echo-01 (a prefix only)"
        assert redact.scrub(text) == text
    finally:
        redact.forget_all()
