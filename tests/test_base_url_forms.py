"""base_url is normalised once, when the configuration is read, into the one form every
transport sends (scheme in lower case, the path percent-encoded as UTF-8, dot segments
resolved); what cannot be a URL is exit 2 before anything is sent, from any source; and a
server that cannot be reached gets the hint that fits why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.canned_server import CannedServer
from tests.helpers import CHAT_REPLY, write_config

PREFIX = "/%E4%B8%AD%E6%96%87/v1"  # /中文/v1
MODELS = {"object": "list", "data": [{"id": "internlm-s2", "object": "model"}]}


def _replies() -> dict[str, tuple[int, dict[str, str], bytes]]:
    return {
        f"{PREFIX}/chat/completions": (200, {}, json.dumps(CHAT_REPLY).encode()),
        f"{PREFIX}/models": (200, {}, json.dumps(MODELS).encode()),
    }


@pytest.mark.parametrize("spelling", ["/中文/v1", "/x/../中文/v1/", "/%e4%b8%ad%e6%96%87/v1"])
def test_a_non_ascii_path_is_sent_the_same_by_every_command(
    cli, isolated: Path, spelling: str
) -> None:
    (isolated / "tasks.jsonl").write_text('{"id": 1, "text": "a"}\n{"id": 2, "text": "b"}\n')
    with CannedServer(_replies()) as server:
        url = server.base_url.removesuffix("/v1").replace("http://", "HTTP://") + spelling
        single = cli("single", "--base-url", url)
        assert single.code == 0, single.err
        batch = cli("batch", "--input", "tasks.jsonl", "--out", "out.jsonl", "--base-url", url)
        assert batch.code == 0, batch.err
        write_config(isolated / "calibrate.toml", url)  # from the file: the same form
        shown = cli("status", "--show-config", "--json").json["config"]["target"]
        assert shown["base_url"] == server.base_url.removesuffix("/v1") + PREFIX
        root = PREFIX.removesuffix("/v1") + "/"  # llama.cpp's /props sits beside /v1
        assert server.hits and all(hit.startswith(root) for hit in server.hits)
        assert any(hit.startswith(PREFIX + "/") for hit in server.hits)
    assert "Traceback" not in single.err + batch.err


BAD_URLS = {
    "a space": "http://127.0.0.1:{port}/a b/v1",
    "a carriage return": "http://127.0.0.1:{port}/v1\r\n/x",
    "a line break": "http://127.0.0.1:{port}/v1\n/x",
    "a tab": "http://127.0.0.1:{port}/\tv1",
    "a full-width space": "http://127.0.0.1:{port}/中文\u3000/v1",
    "the invisible character U+200B": "http://127.0.0.1:{port}/\u200bv1",
    "a byte that is not UTF-8 (0xff)": "http://127.0.0.1:{port}/\udcff/v1",
}


@pytest.mark.parametrize("why", sorted(BAD_URLS))
@pytest.mark.parametrize("source", ["--base-url", "CALIBRATE_BASE_URL", "file", "base_urls"])
def test_what_cannot_be_a_url_is_exit_2_before_anything_is_sent(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch, why: str, source: str
) -> None:
    (isolated / "tasks.jsonl").write_text('{"id": 1, "text": "a"}\n')
    with CannedServer(_replies()) as server:
        url = BAD_URLS[why].format(port=server.base_url.split(":")[2].split("/")[0])
        args = ["batch", "--input", "tasks.jsonl", "--out", "out.jsonl"]
        if source == "--base-url":
            args += ["--base-url", url]
        elif source == "CALIBRATE_BASE_URL":
            monkeypatch.setenv("CALIBRATE_BASE_URL", url)
        else:
            key = "base_url" if source == "file" else "base_urls"
            value = json.dumps(url) if source == "file" else json.dumps([server.base_url, url])
            (isolated / "calibrate.toml").write_text(f"[target]\n{key} = {value}\n", "utf-8")
        for result in (cli(*args), cli("single", *args[5:])):
            assert result.code == 2, result.err
            assert "Traceback" not in result.err
            # a byte that is not UTF-8 is refused as it is read: in argv or the environment
            # as "not UTF-8 text", in a file as TOML cannot hold it
            read_as = "not valid TOML" if source in ("file", "base_urls") else "not UTF-8 text"
            assert f"has {why}" in result.err or ("not UTF-8" in why and read_as in result.err)
        assert server.hits == []
    assert not (isolated / "out.jsonl").exists()


def test_a_server_that_cannot_be_reached_gets_the_hint_that_fits(cli, mock) -> None:
    """https:// to a plain-HTTP server is not "start it: make mock"; nor is a wrong name."""
    plain_as_tls = mock.base_url.replace("http://", "https://")
    cases = [
        (plain_as_tls, "no TLS server", "with http://"),
        ("http://calibrate-no-such-host.invalid:8000/v1", "host name not resolved", "host name"),
        ("http://127.0.0.1:1/v1", "connection refused", "make mock"),
    ]
    for url, said, hint in cases:
        for command in ("single", "batch"):
            args = [command, "--base-url", url]
            if command == "batch":
                Path("tasks.jsonl").write_text('{"id": 1, "text": "a"}\n')
                args += ["--input", "tasks.jsonl", "--out", "out.jsonl", "--retries", "0"]
            result = cli(*args)
            assert result.code == 4, result.err
            assert said in result.err and hint in result.err, result.err
            if hint != "make mock":
                assert "make mock" not in result.err
    assert mock.model.snapshot().requests_total == 0


@pytest.mark.parametrize("command", ["ladder", "sweep", "tune"])
def test_gpu_metrics_url_is_held_to_the_same_rules(cli, isolated: Path, command: str) -> None:
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:9/v1")
    args = [command, "--force", "--gpu-metrics-url"]
    for url, said in (("http://h:9/a b", "has a space"), ("ftp://h/metrics", "is not an http(s)")):
        result = cli(*args, url)
        assert result.code == 2, result.err
        assert f"--gpu-metrics-url '{url}' {said}" in result.err
    assert not (isolated / "runs").exists()


@pytest.mark.parametrize("tail", ["/v1/chat/completions", "/v1/completions/", "/v1/Models"])
@pytest.mark.parametrize("source", ["--base-url", "file", "base_urls"])
def test_a_request_path_pasted_as_base_url_is_exit_2_naming_the_root(
    cli, isolated: Path, mock, tail: str, source: str
) -> None:
    """``…/v1/chat/completions`` copied from a curl line is not the server's root: exit 2 that
    gives the root, not a 404 recorded as a failed single (or a batch of failed items)."""
    (isolated / "tasks.jsonl").write_text('{"id": 1, "text": "a"}\n')
    pasted = mock.base_url.removesuffix("/v1") + tail
    flags: list[str] = []
    if source == "--base-url":
        flags = ["--base-url", pasted]
    else:
        value = json.dumps(pasted) if source == "file" else json.dumps([mock.base_url, pasted])
        key = "base_url" if source == "file" else "base_urls"
        (isolated / "calibrate.toml").write_text(f"[target]\n{key} = {value}\n", "utf-8")
    batch = ["batch", "--input", "tasks.jsonl", "--out", "out.jsonl"]
    for result in (cli("single", *flags), cli(*batch, *flags)):
        assert result.code == 2, result.err
        assert "a request's path" in result.err and f"root, {mock.base_url}" in result.err
        assert "Traceback" not in result.err
    assert not (isolated / "runs").exists() and not (isolated / "out.jsonl").exists()
    assert mock.model.snapshot().requests_total == 0
