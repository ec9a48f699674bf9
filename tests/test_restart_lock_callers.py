"""Every start and stop of the managed server takes ``runs/server.restart.lock``, not only a
hand ``server start`` and a ``batch --restart``: the ladder's restart at each ``--parallel B``
(a managed llama.cpp), ``server stop``, tune's start of each candidate, a rollback's stop and
start. Before, each went on while another process held the lock — a ladder restarted the engine
in the middle of a batch's restart, two engines raced for one port. Now each is refused with
exit 2, one line naming the holder's PID and what was not done, and the server is left as it was.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from calibrate.server import readiness
from tests.fakes import (
    free_port,
    managed_config,
    mock_command,
    passing_ladder,
    pid_gone,
    pythonpath_env,
)
from tests.helpers import RESTART_LOCK, restart_lock_held, write_config
from tests.tier_helpers import FAST
from tests.tune_helpers import tune_config

LOCK = RESTART_LOCK


def _fake_llama_server(bin_dir: Path) -> None:
    """``llama-server`` on PATH: the mock with as many slots as the --parallel it is given."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "llama-server"
    script.write_text(
        "#!/bin/sh\n"
        'port=""; p=1\n'
        "while [ $# -gt 0 ]; do\n"
        '  case "$1" in --port) port=$2; shift;; --parallel) p=$2; shift;; esac; shift\n'
        "done\n"
        f'exec "{sys.executable}" -m calibrate mock --port "$port" --slots "$p" '
        "--ttft 0.002 --per-token 0.001 --expose-props --metrics-style llamacpp --no-metrics\n",
        encoding="utf-8",
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def _refused(result: Any, not_done: str) -> None:
    """Exit 2 and one error line naming this test's PID (the holder), then its hint."""
    assert result.code == 2, result.err
    errors = [line for line in result.err.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: PID {os.getpid()} is starting or stopping the managed server (lock {LOCK}); "
        f"{not_done}"
    ], result.err
    assert "Traceback" not in result.err


def _record(root: Path) -> dict[str, Any]:
    return json.loads((root / "runs/server.json").read_text("utf-8"))


def test_a_ladder_does_not_restart_llamacpp_per_tier_while_another_process_holds_the_lock(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batch 2's restart at --parallel 2 was made beside the holder's start (exit 0, a new
    engine); now the ladder stops there, the engine it found still running at --parallel 1."""
    bin_dir = isolated / "fakebin"
    _fake_llama_server(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", pythonpath_env())
    port = free_port()
    server = (
        f'[server]\nkind = "llamacpp"\nmodel_path = "/models/m.gguf"\nport = {port}\n'
        "ready_timeout_s = 20\nstop_timeout_s = 5\n"
    )
    write_config(isolated / "calibrate.toml", f"http://127.0.0.1:{port}/v1", FAST + server)
    assert cli("server", "start", "--batch-size", "1").code == 0
    try:
        engine = _record(isolated)["pid"]
        assert cli("single").code == 0 and cli("repro", "--runs", "1").code == 0
        with restart_lock_held(isolated):
            result = cli("ladder")
        _refused(result, "not restarted at cap 2")
        assert "restarting the managed server at cap 2" in result.err
        record = _record(isolated)
        assert record["pid"] == engine and record["batch_size"] == 1, record
        assert not pid_gone(engine) and readiness.port_open("127.0.0.1", port)
    finally:
        cli("server", "stop")


def test_server_stop_is_refused_while_another_process_holds_the_lock(cli, isolated: Path) -> None:
    """A stop beside another's restart could forget the record of the engine that restart had
    just written (an engine left running that nothing knows of); now: exit 2, nothing touched."""
    port = free_port()
    managed_config(isolated, port, mock_command())
    assert cli("server", "start", "--concurrency", "2").code == 0
    engine = _record(isolated)["pid"]
    try:
        with restart_lock_held(isolated):
            result = cli("server", "stop")
        _refused(result, "not stopped")
        assert "then: calibrate server stop" in result.err
        assert not pid_gone(engine) and _record(isolated)["pid"] == engine
    finally:
        assert cli("server", "stop").code == 0
    assert pid_gone(engine)


def test_tune_starts_no_candidate_while_another_process_holds_the_lock(cli, isolated: Path) -> None:
    tune_config(isolated, 'grid = ["slots=2", "kv_tokens=50000", "memory_fraction=0.8"]\n')
    with restart_lock_held(isolated):
        result = cli("tune")
    _refused(result, "candidate c01 not started")
    assert not (isolated / "runs/server.json").exists(), "no engine started"


def test_a_rollback_stops_and_starts_nothing_while_another_process_holds_the_lock(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", pythonpath_env())
    port = free_port()
    managed_config(isolated, port, mock_command())
    started = cli("server", "start", "--concurrency", "4", "--json")
    assert started.code == 0, started.err
    engine = started.json["pid"]
    try:
        single = cli("single", "--json")
        assert single.code == 0, single.err
        passing_ladder(isolated, single.json["record"]["target"], batch_size=4)
        with restart_lock_held(isolated):
            result = cli("rollback")
        _refused(result, "not rolled back: nothing was stopped")
        assert not pid_gone(engine) and _record(isolated)["pid"] == engine
    finally:
        cli("server", "stop")
