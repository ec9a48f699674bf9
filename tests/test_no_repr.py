"""What a user reads carries no Python `None`, no repr and no runpy warning; one warning style."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from calibrate.server import process
from tests.fakes import free_port, managed_config, mock_command, pythonpath_env
from tests.helpers import FAKE_KEY, write_config
from tests.mockserver import start_mock
from tests.workload_helpers import FAST_MOCK, LADDER, calibrated

NONE = re.compile(r"\bNone\b")


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", pythonpath_env())
    monkeypatch.setenv("CALIBRATE_API_KEY", FAKE_KEY)


def _plain_mock_command() -> str:
    """The mock as a managed engine with no batch-size or concurrency placeholder."""
    args = [sys.executable, "-m", "calibrate", "mock", "--ttft", "0.002", "--per-token", "0.0005"]
    return shlex.join(args) + " --port {port}"


@pytest.mark.parametrize(
    ("command", "flags"),
    [(mock_command(), ("--concurrency", "2")), (_plain_mock_command(), ())],
    ids=["with-a-setting", "engine-defaults"],
)
def test_a_managed_server_log_and_status_read_cleanly(
    cli, isolated: Path, command: str, flags: tuple[str, ...]
) -> None:
    managed_config(isolated, free_port(), command)
    try:
        started = cli("server", "start", *flags)
        assert started.code == 0, started.err
        status = cli("server", "status")
        logs = cli("server", "logs", "-n", "50")
    finally:
        cli("server", "stop")
    log = process.log_path(isolated / "runs").read_text(encoding="utf-8", errors="replace")
    assert log.strip(), "the mock wrote nothing to its log: the check is empty"
    for text in (log, logs.out):
        assert "RuntimeWarning" not in text and "<frozen runpy>" not in text, text[:500]
    assert status.code == 0 and "setting:" in status.err
    assert not NONE.search(status.err), status.err
    if not flags:
        assert "no batch size or concurrency given" in status.err


def test_the_html_report_shows_no_none(cli, isolated: Path) -> None:
    """Unset [workload] and [slo] keys (pick, e2e_p99_s, …) are left out, never shown as None."""
    with start_mock(**FAST_MOCK) as mock:
        calibrated(cli, isolated, mock.base_url, LADDER + "batch_sizes = [1, 2]\n")
        ladder = cli("ladder", "--json")
        assert ladder.code == 0, ladder.err
        with_slo = cli("ladder", "--slo", "ttft:5", "--json")
        assert with_slo.code == 0, with_slo.err
    for result in (ladder, with_slo):
        run = isolated / "runs" / result.json["run_id"]
        assert cli("report", str(run), "--html").code == 0
        html = (run / "report.html").read_text(encoding="utf-8")
        assert "ttft p99 ≤ 5 s" in html or result is ladder, "the SLO a run measured is said"
        assert not NONE.search(html), NONE.search(html)
        assert not re.search(r"\b(True|False)\b", html), "booleans read as words, not Python's"


def test_a_library_warning_has_the_one_warning_style(cli, isolated: Path) -> None:
    """A skipped ledger line (a library warning, through logging) reads `warning: …`."""
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:9/v1")
    (isolated / "runs").mkdir()
    (isolated / "runs/ledger.jsonl").write_text("{not json\n", encoding="utf-8")
    result = cli("status")
    assert result.code == 0
    warned = [line for line in result.err.splitlines() if "skipping line 1" in line]
    assert warned and all(line.startswith("warning: ") for line in warned), result.err
    assert "WARNING" not in result.err and "calibrate:" not in result.err


def test_a_failed_single_call_says_what_is_missing_not_none(cli, isolated: Path) -> None:
    """An HTTP 500 has no answer, no finish_reason and no model: the failure is said first, in
    words, with no line of numbers the server never sent."""
    with start_mock(ttft_s=0.002, per_token_s=0.0005, fail_rate=1.0) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        result = cli("single")
    assert result.code != 0
    lines = result.err.splitlines()
    assert lines[0].startswith("single: sending the fixed prompt"), result.err  # the wait said
    first = lines[1]  # then the failure, before any line of numbers
    assert first.startswith("single failed: the request failed (http_5xx): "), result.err
    assert "no finish_reason" not in result.err and "tokens" not in result.err, result.err
    assert not NONE.search(result.err), result.err


def test_a_batch_outage_is_said_once_in_the_one_warning_style(cli, isolated: Path) -> None:
    """The endpoint going down is one `warning: URL: down — …` line, not a log record as well."""
    import signal
    import threading
    import time

    from tests.batch_helpers import write_tasks
    from tests.mockserver import start_mock_process

    tasks = write_tasks(isolated / "tasks.jsonl", 40)
    out = isolated / "out.jsonl"
    mock = start_mock_process("--slots", "4", "--ttft", "0.02", "--per-token", "0.001")
    write_config(isolated / "calibrate.toml", mock.base_url)

    def kill_after_some_lines() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if out.exists() and out.read_bytes().count(b"\n") >= 5:
                break
            time.sleep(0.01)
        mock.stop(signal.SIGKILL)

    killer = threading.Thread(target=kill_after_some_lines, daemon=True)
    killer.start()
    try:
        flags = ("-c", "4", "--retries", "1", "--backoff-s", "0.05", "--outage-after", "3")
        result = cli("batch", "--input", str(tasks), "--out", str(out), *flags, "--outage-s", "1")
        killer.join()
    finally:
        mock.stop()
    assert result.code == 4, result.err
    down = [line for line in result.err.splitlines() if ": down — " in line]
    assert len(down) == 1 and down[0].startswith("warning: "), result.err
    assert "pausing its items" not in result.err and "WARNING" not in result.err
    assert "('" not in down[0] and "Disconnected(" not in down[0], "no Python repr"


def test_a_dropped_connection_is_described_in_words() -> None:
    """requests nests its causes as exception objects; the message is their words, no repr."""
    from http.client import RemoteDisconnected

    import requests
    from urllib3.exceptions import ProtocolError

    from calibrate.http.error_kinds import connection_error

    cause = ProtocolError("Connection aborted.", RemoteDisconnected("Remote end closed connection"))
    error = connection_error("http://h:1/v1/chat/completions", requests.ConnectionError(cause))
    assert error.info.kind == "reset"
    assert error.info.message == (
        "the connection to http://h:1/v1/chat/completions was dropped: "
        "Connection aborted: Remote end closed connection"
    )
    bare = connection_error("http://h:1/v1", requests.ConnectionError())
    assert bare.info.message.endswith("was dropped: ConnectionError")
