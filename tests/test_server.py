"""`calibrate server start|stop|status|logs` with the mock (and small fakes) as the managed engine."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from calibrate.engines.builders import LaunchSpec, build
from calibrate.server import process, readiness
from calibrate.state import ledger as ledger_module
from calibrate.state.ledger import LedgerView
from tests.fakes import (
    free_port,
    managed_config,
    mock_command,
    passing_ladder,
    pid_gone,
)
from tests.mockserver import start_mock

pytestmark = pytest.mark.usefixtures("repo_on_pythonpath")


def _record(root: Path) -> dict:
    return json.loads((root / "runs/server.json").read_text("utf-8"))


def test_start_ready_status_logs_stop_pid_gone(cli, isolated: Path) -> None:
    port = free_port()
    managed_config(isolated, port, mock_command())
    result = cli("server", "start", "--concurrency", "2", "--json")
    assert result.code == 0, result.err
    pid = result.json["pid"]
    assert (isolated / "runs/server.pid").read_text() == f"{pid}\n"
    assert _record(isolated)["argv"][-4:] == ["--port", str(port), "--slots", "2"]
    models = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "internlm-s2"
    status = cli("server", "status", "--json")
    assert status.json["state"] == "running" and status.json["ready"] is True
    logs = cli("server", "logs", "-n", "5")
    assert f"mock listening on http://127.0.0.1:{port}/v1" in logs.out
    again = cli("server", "start", "--concurrency", "2")
    assert again.code == 2 and "already manages a server" in again.err

    stop = cli("server", "stop", "--json")
    assert stop.code == 0, stop.err
    assert stop.json["signal"] == "SIGTERM" and stop.json["stopped"] is True
    assert pid_gone(pid), "the managed server's PID must be gone after stop"
    assert not readiness.port_open("127.0.0.1", port)
    assert not (isolated / "runs/server.pid").exists()
    assert cli("server", "status", "--json").json["state"] == "none"


def test_start_at_the_setting_reads_the_ledger_once(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The calibrated setting comes from the one read of the ledger: a bad line is warned of once."""
    managed_config(isolated, free_port(), mock_command())
    passing_ladder(isolated, cli("status", "--json").json["target"], batch_size=2)
    with (isolated / "runs/ledger.jsonl").open("a", encoding="utf-8") as ledger:
        ledger.write("{torn\n")
    reads: list[Path] = []
    real = ledger_module._read

    def counted(path: Path) -> LedgerView:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(ledger_module, "_read", counted)
    result = cli("server", "start")
    assert result.code == 0, result.err
    assert "using the calibrated setting" in result.err
    assert len(reads) == 1 and result.err.count("skipping line") == 1, result.err
    assert cli("server", "stop").code == 0


def test_server_that_exits_at_once_is_exit_4_with_log_tail_and_code(cli, isolated: Path) -> None:
    code = "import sys; print('CUDA error: no kernel image for this GPU', flush=True); sys.exit(3)"
    managed_config(isolated, free_port(), shlex.join([sys.executable, "-c", code]))
    started = time.monotonic()
    result = cli("server", "start")
    assert result.code == 4
    assert "exited with code 3" in result.err
    assert "CUDA error: no kernel image for this GPU" in result.err
    assert "Traceback" not in result.err and time.monotonic() - started < 10
    assert not (isolated / "runs/server.pid").exists()


def test_server_never_ready_is_exit_4_after_deadline_and_is_stopped(cli, isolated: Path) -> None:
    code = "import time; print('loading weights...', flush=True); time.sleep(60)"
    managed_config(
        isolated, free_port(), shlex.join([sys.executable, "-c", code]), ready_timeout_s=1
    )
    started = time.monotonic()
    result = cli("server", "start")
    elapsed = time.monotonic() - started
    assert result.code == 4
    assert "not ready within 1 s" in result.err and "loading weights..." in result.err
    assert 1 <= elapsed < 8
    pid = int(re.search(r"stopped it \(PID (\d+)\)", result.err).group(1))
    assert pid_gone(pid), "a server that never got ready is not left running"


def test_stale_pidfile_of_another_live_program_is_never_signalled(cli, isolated: Path) -> None:
    managed_config(isolated, free_port(), mock_command())
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        runs = isolated / "runs"
        runs.mkdir()
        (runs / "server.pid").write_text(f"{stranger.pid}\n")
        # what calibrate wrote for its own server, long gone: the same PID, another start time
        old = process.ServerRecord(
            pid=stranger.pid,
            start_id="1",
            argv=("vllm", "serve"),
            kind="custom",
            port=8000,
            health_path=None,
            started_at="2026-11-28T10:00:00.000Z",
            log_offset=0,
        )
        process.save(old, runs)
        assert cli("server", "status", "--json").json["state"] == "stranger"
        result = cli("server", "stop", "--json")
        assert result.code == 0
        assert "not signalled" in result.err and result.json["signal"] is None
        time.sleep(0.2)
        assert stranger.poll() is None, "the unrelated process was signalled"
        assert not (runs / "server.pid").exists(), "the stale pidfile is removed"
    finally:
        stranger.kill()
        stranger.wait()


def test_pidfile_without_identity_is_not_trusted(cli, isolated: Path) -> None:
    stranger = subprocess.Popen(["sleep", "30"])
    try:
        (isolated / "runs").mkdir()
        (isolated / "runs/server.pid").write_text(f"{stranger.pid}\n")
        result = cli("server", "stop")
        assert result.code == 0 and "manages no server" in result.err
        time.sleep(0.1)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_busy_port_and_missing_kind_are_usage_errors(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.001, per_token_s=0.0001) as other:
        managed_config(isolated, other.port, mock_command())
        busy = cli("server", "start", "--concurrency", "1")
    assert busy.code == 2 and f"port {other.port} is already in use" in busy.err
    (isolated / "calibrate.toml").write_text("[server]\nport = 8011\n")
    result = cli("server", "start")
    assert result.code == 2 and "--kind" in result.err and "Traceback" not in result.err
    no_value = managed_config(isolated, free_port(), mock_command())
    assert no_value.exists()
    result = cli("server", "start")
    assert result.code == 2 and "{concurrency}" in result.err and "--concurrency" in result.err


def test_missing_engine_binary_is_exit_4(cli, isolated: Path) -> None:
    managed_config(isolated, free_port(), "no-such-engine-binary --port {port}")
    result = cli("server", "start")
    assert result.code == 4 and "no-such-engine-binary" in result.err


def test_health_503_while_loading_is_waited_for(tmp_path: Path) -> None:
    """llama.cpp answers /health with 503 while it loads; 200 means ready."""
    port = free_port()
    script = tmp_path / "loading.py"
    script.write_text(
        "import http.server, sys, time\n"
        "start = time.monotonic()\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        code = 200 if time.monotonic() - start > 0.8 else 503\n"
        "        self.send_response(code); self.send_header('Content-Length', '0'); self.end_headers()\n"
        "    def do_POST(self):\n"  # the first 1-token completion: a 4xx is an answer too
        "        self.send_response(400); self.send_header('Content-Length', '0'); self.end_headers()\n"
        "    def log_message(self, *a): pass\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), H).serve_forever()\n"
    )
    from calibrate.server import lifecycle as server

    started = server.start(
        tmp_path / "runs",
        [sys.executable, str(script)],
        kind="llamacpp",
        port=port,
        health_path="/health",
        ready_timeout_s=10,
        stop_timeout_s=2,
    )
    try:
        assert started.ready_s >= 0.7, "ready was declared while /health still answered 503"
    finally:
        stopped = server.stop(tmp_path / "runs", 2)
    assert stopped is not None and stopped.gone and pid_gone(started.record.pid)


def test_builders_keep_a_hostile_path_one_argument() -> None:
    hostile = '/m/a b\'; $(touch x) "q"'
    spec = LaunchSpec(
        "custom", hostile, 9000, 4, 2, command="srv --model={model_path} -c {concurrency}"
    )
    assert build(spec).argv == ("srv", f"--model={hostile}", "-c", "2")
    vllm = build(LaunchSpec("vllm", hostile, 9000, 4, 2, served_name="m"))
    # the cap admits the verified batch (4) as well as the concurrency (2)
    assert vllm.argv[2] == hostile and vllm.argv[-2:] == ("--max-num-seqs", "4")
    assert vllm.health_path == "/health"
    plain = build(LaunchSpec("vllm", "/m", 9000))
    assert "--max-num-seqs" not in plain.argv, "nothing calibrated: the engine's own default"


@pytest.mark.parametrize(
    ("kind", "metrics_flag"),
    [("sglang", "--enable-metrics"), ("llamacpp", "--metrics")],
)
def test_engines_whose_metrics_are_off_by_default_are_started_with_them_on(
    kind: str, metrics_flag: str
) -> None:
    """SGLang serves /metrics (KV-cache usage, the queue) only when asked; without it the
    pressure of an engine that reserves its memory at start is not measured (LMDeploy: see
    tests/test_lmdeploy.py)."""
    argv = build(LaunchSpec(kind, "/m", 9000, 4, 4)).argv
    assert argv.count(metrics_flag) == 1, argv
    assert "--enable-metrics" not in build(LaunchSpec("vllm", "/m", 9000, 4, 4)).argv


def test_a_start_after_the_engine_died_waits_for_its_socket_not_another_server(
    cli, isolated: Path
) -> None:
    """kill -9 makes /proc call the engine a zombie while its socket still listens for a moment
    (3-10 ms for the mock; here a child holds it 1 s): that port is the dead engine's, so the
    next start (``batch --restart``'s, a user's) waits for it instead of "port in use"."""
    port = free_port()
    engine = Path(__file__).parent / "fakes" / "lingering_engine.py"
    managed_config(isolated, port, f"{shlex.quote(sys.executable)} {engine} --port {{port}}")
    first = cli("server", "start", "--json")
    assert first.code == 0, first.err
    subprocess.run(["kill", "-KILL", str(first.json["pid"])], check=True)
    assert _wait_gone(first.json["pid"])
    assert readiness.port_open("127.0.0.1", port), "the child still holds the dead engine's port"
    again = cli("server", "start", "--json")
    try:
        assert again.code == 0, again.err
        assert again.json["pid"] != first.json["pid"]
    finally:
        assert cli("server", "stop").code == 0
    # a port held by a live stranger is still refused
    with start_mock(port=port):
        managed_config(isolated, port, f"{shlex.quote(sys.executable)} {engine} --port {{port}}")
        held = cli("server", "start")
    assert held.code == 2 and f"port {port} is already in use" in held.err


def _wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pid_gone(pid):
            return True
        time.sleep(0.01)
    return False


def test_status_never_calls_ready_an_engine_that_has_not_answered_a_completion(
    cli, isolated: Path
) -> None:
    """An engine whose /health answers 200 while every completion fails (HTTP 500): while
    ``server start`` waits for its first completion, and after that start was killed, ``server
    status`` said "running (still starting: not ready yet), ready" and --json "ready": true —
    readiness from /health alone, the check SPEC §6 says is not ready. Ready now needs the
    start's own confirmation (a completion answered) as well as a live answer."""
    from tests.helpers import calibrate_process, reaped

    port = free_port()
    managed_config(isolated, port, mock_command("--fail-rate", "1.0"), ready_timeout_s=60)
    with reaped(calibrate_process(isolated, "server", "start", "--concurrency", "1")) as proc:
        root, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 30
        while not readiness.probe(root, None)[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert readiness.probe(root, None)[0], "its /v1/models answers"
        waiting = cli("server", "status", "--json")
        proc.kill()
        proc.communicate()
    left = cli("server", "status", "--json")
    try:
        for status in (waiting, left):
            assert status.json["state"] == "running" and status.json["phase"] == "starting"
            assert status.json["ready"] is False, status.err
            assert ", ready" not in status.err, status.err
    finally:
        assert cli("server", "stop").code == 0


@pytest.mark.parametrize("lines", ["0", "-5"])
def test_logs_with_no_lines_asked_is_a_usage_error_not_an_empty_log(
    cli, isolated: Path, lines: str
) -> None:
    """``server logs -n 0`` (or -5) on a log with lines in it said "runs/server.log is empty or
    missing", exit 0 — a log it never read called empty. A bad flag is exit 2 and says so."""
    (isolated / "runs").mkdir()
    (isolated / "runs/server.log").write_text("engine listening\n", encoding="utf-8")
    managed_config(isolated, free_port(), mock_command())
    result = cli("server", "logs", "-n", lines)
    assert result.code == 2, result.err
    assert f"-n must be at least 1, got {lines}" in result.err
    assert "empty or missing" not in result.err
