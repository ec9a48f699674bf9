"""HTTP_PROXY, HTTPS_PROXY and ALL_PROXY (any case) are never used — no request and no key
reaches a proxy, on either transport — and where one would have applied to the target (not a
loopback host, not exempted by NO_PROXY) one line says the target is reached directly."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate.config.proxy import exempted, proxy_note
from tests.canned_server import CannedServer
from tests.helpers import FAKE_KEY, write_config

VARIABLES = ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"]
NOTE = "is set, but calibrate connects to"


def test_no_request_and_no_key_goes_to_a_proxy(
    cli, mock, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CALIBRATE_API_KEY", FAKE_KEY)
    (isolated / "tasks.jsonl").write_text('{"id": 1, "text": "a"}\n')
    write_config(isolated / "calibrate.toml", mock.base_url)
    with CannedServer({}) as proxy:
        for name in VARIABLES:
            monkeypatch.setenv(name, proxy.base_url.removesuffix("/v1"))
        single = cli("single")
        batch = cli("batch", "--input", "tasks.jsonl", "--out", "out.jsonl")
        assert proxy.hits == [], "nothing is sent through a proxy"
    assert single.code == 0 and batch.code == 0, single.err + batch.err
    assert NOTE not in single.err + batch.err, "a loopback target is never proxied: no note"


def test_a_proxy_that_would_apply_is_said_once_and_no_proxy_exempts(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "http://calibrate-proxy-test.invalid:8000/v1"
    with CannedServer({}) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.base_url.removesuffix("/v1"))
        said = cli("single", "--base-url", url)
        assert said.code == 4 and said.err.count(NOTE) == 1, said.err
        assert f"HTTP_PROXY {NOTE} {url} directly" in said.err
        monkeypatch.setenv("NO_PROXY", ".invalid")
        exempt = cli("single", "--base-url", url)
        assert exempt.code == 4 and NOTE not in exempt.err
        assert proxy.hits == []


def test_which_variable_applies_and_what_no_proxy_exempts() -> None:
    proxy = {"HTTP_PROXY": "http://p:3128"}
    assert proxy_note("http://127.0.0.1:8000/v1", proxy) == ""
    assert proxy_note("http://[::1]:8000/v1", proxy) == ""
    assert proxy_note("http://localhost:8000/v1", proxy) == ""
    assert proxy_note("http://gpu:8000/v1", proxy).startswith("HTTP_PROXY is set")
    assert proxy_note("https://gpu:8000/v1", proxy) == "", "HTTP_PROXY is not https's"
    assert proxy_note("https://gpu/v1", {"https_proxy": "x"}).startswith("https_proxy")
    assert proxy_note("https://gpu/v1", {"ALL_PROXY": "socks5://p"}).startswith("ALL_PROXY")
    assert proxy_note("http://user:pw@gpu/v1", proxy).count("pw") == 0, "userinfo masked"
    assert exempted("gpu-box", "gpu-box") and exempted("a.lan", ".lan") and exempted("a.lan", "lan")
    assert exempted("10.1.2.3", "10.0.0.0/8") and not exempted("10.1.2.3", "11.0.0.0/8")
    assert exempted("anything", "*") and exempted("fd00::1", "fd00::/8")
    assert not exempted("xgpu", "gpu") and exempted("gpu", "other, gpu:8000")
