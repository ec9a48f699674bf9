"""A managed server's end is recorded by its supervisor: status, stop, incidents (`server_died`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from calibrate.errors import ErrorInfo
from calibrate.gpu.vram import VramMonitor
from calibrate.io.store import RunDir
from calibrate.load.items import ItemResult
from calibrate.server import exit_status, process, supervise
from calibrate.server.process import ServerRecord
from calibrate.stages.measure.incidents import IncidentRecorder
from tests.fakes import free_port, managed_config, mock_command, pid_gone

pytestmark = pytest.mark.usefixtures("repo_on_pythonpath")


def _wait_gone(pid: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pid_gone(pid):
        assert time.monotonic() < deadline, f"PID {pid} did not go"
        time.sleep(0.02)


def test_sigkilled_server_is_reported_by_status_and_stop(cli, isolated: Path) -> None:
    managed_config(isolated, free_port(), mock_command())
    started = cli("server", "start", "--concurrency", "2", "--json")
    assert started.code == 0, started.err
    pid = started.json["pid"]
    assert os.getpgid(pid) == pid, "the engine leads its own process group"
    os.kill(pid, signal.SIGKILL)
    _wait_gone(pid)
    ended = exit_status.wait_for(isolated / "runs/server.exit.json", pid)
    assert ended is not None and ended.exit_code == -9 and ended.signal == "SIGKILL"
    status = cli("server", "status", "--json")
    assert status.json["state"] == "gone" and "killed by SIGKILL" in status.err
    assert status.json["exit"]["signal"] == "SIGKILL"
    stop = cli("server", "stop", "--json")
    assert stop.json["was"] == "gone" and stop.json["exit_code"] == -9


def test_stop_reads_the_exit_code_from_the_supervisor(cli, isolated: Path) -> None:
    managed_config(isolated, free_port(), mock_command())
    assert cli("server", "start", "--concurrency", "1").code == 0
    stop = cli("server", "stop", "--json")
    assert stop.code == 0 and stop.json["signal"] == "SIGTERM"
    assert stop.json["exit_code"] is not None, "the supervisor recorded how it ended"


def _failed_item(kind: str) -> ItemResult:
    return ItemResult(
        index=0,
        prompt="p",
        path="/v1/chat/completions",
        body={"model": "m"},
        text=None,
        finish_reason=None,
        usage=None,
        completion_tokens=0,
        elapsed_s=0.1,
        ttft_s=None,
        started_s=0.0,
        done_s=0.1,
        error=ErrorInfo(kind, "the connection was dropped"),
    )


def test_incident_of_a_request_whose_managed_server_died_is_server_died(tmp_path: Path) -> None:
    """What the engine suite checks for real with llama.cpp (a SIGKILL mid-ladder), in ms."""
    runs = tmp_path / "runs"
    runs.mkdir()
    dead = subprocess.Popen(["sleep", "0"])
    dead.wait()
    record = ServerRecord(
        pid=dead.pid,
        start_id="gone",
        argv=("llama-server",),
        kind="llamacpp",
        port=8080,
        health_path="/health",
        started_at="t",
        log_offset=0,
    )
    process.save(record, runs)  # what `server start` leaves: runs/server.json and server.pid
    (runs / "server.log").write_text("slot 0: processing\n")
    exit_status.write(
        runs / "server.exit.json", exit_status.ExitStatus.from_returncode(dead.pid, -9)
    )
    recorder = IncidentRecorder(
        RunDir(runs, "ladder"),
        {"Authorization": "Bearer x"},
        VramMonitor([]),
        runs_dir=runs,
        snapshot=lambda _: None,
    )
    reset, http = _failed_item("reset"), replace(_failed_item("http_4xx"), index=1)
    paths = recorder.record([reset, http], batch_size=4, concurrency=4, round_no=1)
    died, answered = (json.loads(p.read_text("utf-8")) for p in paths)
    assert died["error"]["kind"] == "server_died"
    assert f"PID {dead.pid}) killed by SIGKILL" in died["error"]["message"]
    assert died["server"] == {
        "pid": dead.pid,
        "exit_code": -9,
        "signal": "SIGKILL",
        "log_tail": ["slot 0: processing"],
    }
    assert answered["error"]["kind"] == "http_4xx", "an HTTP answer came from a live server"
    # the records and the tier's error kinds say the same as the incident (they said "reset")
    kinds = [i.error.kind for i in recorder.classify([reset, http]) if i.error]
    assert kinds == ["server_died", "http_4xx"]


def test_supervisor_reports_an_engine_that_cannot_start(tmp_path: Path) -> None:
    with (tmp_path / "log").open("ab") as log, pytest.raises(OSError) as caught:
        supervise.launch(["no-such-engine-binary-x"], log, tmp_path / "exit.json")
    assert caught.value.errno is not None and caught.value.errno > 0


def test_exit_status_describes_codes_and_signals() -> None:
    assert exit_status.ExitStatus.from_returncode(7, 3).describe() == "exited with code 3"
    killed = exit_status.ExitStatus.from_returncode(7, -9)
    assert killed.describe() == "killed by SIGKILL" and killed.exit_code == -9


def test_first_error_is_the_earliest_bundles_own_message(tmp_path: Path) -> None:
    from calibrate.stages.measure.incidents import first_error

    assert first_error(tmp_path / "none") is None
    older, newer = tmp_path / "2-1-0.json", tmp_path / "1-1-0.json"
    older.write_text(json.dumps({"error": {"message": "HTTP 400: request (847 tokens) exceeds"}}))
    newer.write_text(json.dumps({"error": {"message": "later"}}))
    os.utime(older, ns=(1, 1))
    assert first_error(tmp_path) == "HTTP 400: request (847 tokens) exceeds"


class _Supervisor:
    """A supervisor on a virtual clock: it writes how the engine ended at ``writes_at`` (never
    when None) and exits at ``exits_at`` (never when None); time passes only in ``sleep``."""

    def __init__(self, path: Path, writes_at: float | None, exits_at: float | None) -> None:
        self.path, self.writes_at, self.exits_at = path, writes_at, exits_at
        self.now_s = 0.0

    def clock(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds
        if self.writes_at is not None and self.now_s >= self.writes_at and not self.path.exists():
            exit_status.write(self.path, exit_status.ExitStatus.from_returncode(7, -9))

    def lives(self) -> bool:
        return self.exits_at is None or self.now_s < self.exits_at

    def wait(self) -> exit_status.ExitStatus | None:
        return exit_status.wait_for(
            self.path,
            7,
            exit_status.WRITE_LIMIT_S,
            writing=self.lives,
            clock=self.clock,
            sleep=self.sleep,
        )


def test_how_an_engine_ended_is_waited_for_while_its_supervisor_lives(tmp_path: Path) -> None:
    """A loaded machine: the supervisor writes 10 s after the engine died (the old fixed 2 s
    wait gave up and said nothing of the SIGKILL); once it has exited nothing more will come,
    so the wait ends then; a supervisor that never writes nor ends is given up on, bounded."""
    slow = _Supervisor(tmp_path / "slow.json", writes_at=10.0, exits_at=10.0)
    ended = slow.wait()
    assert ended is not None and ended.signal == "SIGKILL" and ended.exit_code == -9
    assert slow.now_s == pytest.approx(10.0, abs=0.1)
    gone = _Supervisor(tmp_path / "gone.json", writes_at=None, exits_at=1.0)
    assert gone.wait() is None and gone.now_s == pytest.approx(1.0, abs=0.1)  # not 30 s
    stuck = _Supervisor(tmp_path / "stuck.json", writes_at=None, exits_at=None)
    assert stuck.wait() is None
    assert stuck.now_s == pytest.approx(exit_status.WRITE_LIMIT_S, abs=0.1)
    unknown = _Supervisor(tmp_path / "old.json", writes_at=10.0, exits_at=None)
    assert (
        exit_status.wait_for(
            unknown.path, 7, exit_status.SETTLE_S, clock=unknown.clock, sleep=unknown.sleep
        )
        is None
    )  # no supervisor on record (an older calibrate's): the short wait, as before


def test_a_managed_server_dead_beside_the_target_is_not_the_targets_death(
    cli, isolated: Path
) -> None:
    """A server calibrate manages on another port was killed; the target (a server the user
    runs) resets every connection. The ladder took the resets for the managed server's death:
    "server_died … killed by SIGKILL" in its tier and incidents, with that server's log. They
    are the target's resets."""
    from tests.fakes import append_ledger, kill_9
    from tests.mockserver import start_mock

    other = free_port()
    managed_config(isolated, other, mock_command())
    started = cli("server", "start", "--concurrency", "2", "--json")
    assert started.code == 0, started.err
    kill_9(started.json["pid"])
    with start_mock(ttft_s=0.001, per_token_s=0.0001, reset_rate=1.0) as target:
        config = isolated / "calibrate.toml"
        config.write_text(
            config.read_text().replace(f"127.0.0.1:{other}", f"127.0.0.1:{target.port}")
        )
        fingerprint = cli("status", "--json").json["target"]
        append_ledger(isolated, "repro", fingerprint, {})
        ladder = cli("ladder", "--json")
    assert ladder.code == 1, ladder.err
    incidents = [
        json.loads(p.read_text("utf-8"))
        for p in (isolated / "runs").glob("*-ladder-*/incidents/*.json")
    ]
    assert incidents and {i["error"]["kind"] for i in incidents} == {"reset"}, incidents[0]
    assert "server_died" not in ladder.err and "SIGKILL" not in ladder.err
    assert all(i["server"].get("log_tail") is None for i in incidents)
