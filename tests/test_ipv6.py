"""IPv6: ``calibrate mock --host ::1`` serves (its URL in brackets), and every command and both
transports reach a server at ``http://[::1]:PORT/v1``; a --host that is none of this machine's
addresses is told so (not "pick another --port")."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, write_config
from tests.mockserver import start_mock_process


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")


@needs_ipv6
@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_the_mock_serves_ipv6_and_every_command_reaches_it(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    (isolated / "tasks.jsonl").write_text('{"id": 1, "text": "a"}\n')
    mock = start_mock_process("--host", host, "--ttft", "0.001", "--per-token", "0.0001")
    try:
        assert mock.base_url == f"http://[::1]:{mock.port}/v1"
        write_config(isolated / "calibrate.toml", mock.base_url)
        single = cli("single")
        assert single.code == 0, single.err
        batch = cli("batch", "--input", "tasks.jsonl", "--out", "out.jsonl")
        assert batch.code == 0, batch.err
        assert cli("repro", "--runs", "1").code == 0
    finally:
        assert mock.stop() == 0


def _mock_exit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "calibrate", "mock", *args],
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_host_that_is_not_this_machines_is_told_so() -> None:
    for host in ("calibrate-no-such-host.invalid", "192.0.2.1"):  # TEST-NET-1: never local
        done = _mock_exit("--host", host, "--port", "0")
        assert done.returncode == 2, done.stderr
        assert f"cannot listen on {host}" in done.stderr and "Give --host an address" in done.stderr
        assert "--port" not in done.stderr and "Traceback" not in done.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = _mock_exit("--port", str(taken.getsockname()[1]))
    assert done.returncode == 2 and "Pick another --port" in done.stderr
