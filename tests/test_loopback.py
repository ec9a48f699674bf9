"""This machine is one target by any name: a gate a stage opened at http://127.0.0.1:PORT stays
open at http://localhost:PORT (and [::1]); another host is another target."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate.state.identity import url_host
from tests.mockserver import start_mock


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/v1",
        "http://localhost:8000/v1",
        "http://LOCALHOST.:9000/v1",
        "https://user:pw@localhost/v1",
        "http://[::1]:8000/v1",
        "http://127.0.1.1:8000/v1",
        "http://api.localhost:8000/v1",
    ],
)
def test_this_machine_by_any_name_is_one_host(url: str) -> None:
    assert url_host(url) == "127.0.0.1"


@pytest.mark.parametrize(
    ("url", "host"),
    [("http://gpu-box:8000/v1", "gpu-box"), ("http://10.0.0.5:8000/v1", "10.0.0.5")],
)
def test_another_host_keeps_its_name(url: str, host: str) -> None:
    assert url_host(url) == host


def test_a_gate_opened_at_127_0_0_1_is_open_at_localhost(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.001, per_token_s=0.0002) as mock:
        numeric = ("--base-url", mock.base_url, "--model", "internlm-s2")
        named = ("--base-url", mock.base_url.replace("127.0.0.1", "localhost"))
        assert cli("single", *numeric).code == 0
        repro = cli("repro", *named, "--model", "internlm-s2")
    assert repro.code == 0, repro.err  # not exit 3 "a new target"
