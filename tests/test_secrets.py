"""Secrets (issue 10, items 6-9): userinfo in base_url redacted everywhere and still used; the key
sent only to the target's own origin; keys echoed by a server scrubbed before anything is stored
or printed; a key with a CRLF stripped, one with control characters refused without printing it.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from calibrate.redact import Scrubber, redact_url
from tests.helpers import CHAT_REPLY, FAKE_KEY, all_files_text, write_config
from tests.mockserver import start_mock
from tests.tier_helpers import WINDOWS, open_gate

FAST: dict[str, Any] = {"ttft_s": 0.001, "per_token_s": 0.0001}
DCGM = 'DCGM_FI_DEV_FB_USED{gpu="0"} 1000\nDCGM_FI_DEV_FB_FREE{gpu="0"} 79000\n'


class Recorder(ThreadingHTTPServer):
    """A tiny OpenAI-ish server that records the headers of every request it gets."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RecordingHandler)
        self.seen: list[tuple[str, dict[str, str]]] = []

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def auth(self, path: str) -> set[str | None]:
        return {headers.get("Authorization") for p, headers in self.seen if p == path}


class _RecordingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Recorder

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _reply(self, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.seen.append((self.path, dict(self.headers.items())))
        if self.path == "/metrics":
            self._reply(DCGM.encode(), "text/plain")
        else:
            self._reply(json.dumps({"object": "list", "data": [{"id": "internlm-s2"}]}).encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append((self.path, dict(self.headers.items())))
        self._reply(json.dumps(CHAT_REPLY).encode())


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def test_userinfo_in_base_url_is_used_as_basic_auth_and_redacted_everywhere(
    cli: Any, isolated: Path, recorder: Recorder
) -> None:
    password = "pa55-w0rd-xyz"
    url = recorder.root.replace("http://", f"http://alice:{password}@") + "/v1"
    write_config(isolated / "calibrate.toml", url)
    single = cli("single", "--json")
    flagged = cli("single", "--json", "--base-url", url)
    shown = cli("status", "--show-config", "--json")
    refused = cli("single", "--base-url", f"http://alice:{password}@127.0.0.1:9/v1")
    assert single.code == 0 and flagged.code == 0, single.err + flagged.err
    expected = "Basic " + base64.b64encode(f"alice:{password}".encode()).decode()
    assert recorder.auth("/v1/chat/completions") == {expected}
    assert (
        shown.json["config"]["target"]["base_url"]
        == f"http://***@127.0.0.1:{recorder.server_address[1]}/v1"
    )
    assert refused.code == 4 and "127.0.0.1:9" in refused.err
    written = all_files_text(isolated / "runs") + all_files_text(isolated / "baselines")
    for text in (written, single.out, single.err, flagged.out, shown.out, shown.err, refused.err):
        assert password not in text and "alice:" not in text


def test_the_key_goes_only_to_the_targets_origin(
    cli: Any, isolated: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALIBRATE_API_KEY", FAKE_KEY)
    flags = ("--json", "--vram-source", "metrics", "--gpu-metrics-url", recorder.root + "/metrics")
    with start_mock(**FAST) as mock:
        open_gate(isolated, mock.base_url, f"[ladder]\n{WINDOWS}batch_sizes = [1]\nrounds = 1\n")
        plain = cli("ladder", *flags)
        assert recorder.auth("/metrics") == {None}  # the DCGM exporter never saw our key
        monkeypatch.setenv("DCGM_KEY", " dcgm-key-123\r\n")
        write_config(
            isolated / "calibrate.toml",
            mock.base_url,
            'gpu_metrics_key_env = "DCGM_KEY"\n[ladder]\nbatch_sizes = [1]\nrounds = 1\n' + WINDOWS,
        )
        keyed = cli("ladder", *flags, "--force")
    assert plain.code == 0 and keyed.code == 0, plain.err + keyed.err
    assert recorder.auth("/metrics") == {None, "Bearer dcgm-key-123"}
    assert "dcgm-key-123" not in all_files_text(isolated)


def test_a_key_echoed_by_the_server_never_reaches_disk_or_the_terminal(
    cli: Any, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALIBRATE_API_KEY", FAKE_KEY)
    (isolated / "in.jsonl").write_text(
        "".join(f'{{"id": {i}, "text": "item {i}"}}\n' for i in range(3)), encoding="utf-8"
    )
    with start_mock(**FAST, echo_headers_rate=1.0) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        single = cli("single", "--json")
        streamed = cli("single", "--json", "--stream")
        batch = cli(
            "batch", "--json", "--input", "in.jsonl", "--out", "out.jsonl", "--retries", "0"
        )
    assert single.code == 1 and streamed.code == 1 and batch.code == 1
    assert "http_5xx" in single.err and "Bearer [REDACTED]" in single.err  # the rest is kept
    everything = all_files_text(isolated) + "".join(
        r.out + r.err for r in (single, streamed, batch)
    )
    assert FAKE_KEY not in everything and FAKE_KEY[-12:] not in everything
    assert (isolated / "out.jsonl").exists() and "REDACTED" in (isolated / "out.jsonl").read_text()


def test_a_key_with_a_trailing_crlf_is_stripped(
    cli: Any, isolated: Path, recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALIBRATE_API_KEY", "sk-abc-123\r\n")
    write_config(isolated / "calibrate.toml", recorder.root + "/v1")
    result = cli("single")
    assert result.code == 0, result.err
    assert recorder.auth("/v1/chat/completions") == {"Bearer sk-abc-123"}


@pytest.mark.parametrize("key", ["sk-abc\x01def", "sk-abc\ndef", "sk-abc\x7fdef", "sk-abcé"])
def test_a_key_with_control_characters_is_refused_without_printing_it(
    cli: Any, isolated: Path, monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", key)
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:9/v1")
    result = cli("single")
    assert result.code == 2
    assert "OPENAI_API_KEY" in result.err and "sk-abc" not in result.err + result.out


def test_the_scrubber_and_redact_url() -> None:
    assert redact_url("https://u:p@host:8/v1") == "https://***@host:8/v1"
    assert redact_url("http://host/v1") == "http://host/v1"
    scrub = Scrubber.of("sk-one", None, "")
    text = "key sk-one, header Authorization: Bearer abc.def-123, url http://a:b@h/x"
    assert scrub(text) == (
        "key [REDACTED], header Authorization: Bearer [REDACTED], url http://***@h/x"
    )
