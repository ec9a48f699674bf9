"""`calibrate rollback` with the mock as a managed engine (and as a server the user restarts)."""

from __future__ import annotations

import json
import socket
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from calibrate.gpu.nvml import GpuSnapshot
from calibrate.mock import BackgroundServer, MockSettings
from calibrate.server import readiness
from tests.fakes import (
    free_port,
    managed_config,
    mock_command,
    passing_ladder,
    pid_gone,
    pythonpath_env,
)
from tests.helpers import FAKE_KEY, all_files_text, write_config
from tests.mockserver import start_mock


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", pythonpath_env())
    monkeypatch.setenv("CALIBRATE_API_KEY", FAKE_KEY)


def _ledger(root: Path) -> list[dict]:
    return [json.loads(x) for x in (root / "runs/ledger.jsonl").read_text("utf-8").splitlines()]


def _managed_with_baseline(cli, root: Path, port: int) -> tuple[str, int]:
    """A managed mock at concurrency 4, a baseline from it, and a ladder that passed batch 4."""
    started = cli("server", "start", "--concurrency", "4", "--json")
    assert started.code == 0, started.err
    single = cli("single", "--json")
    assert single.code == 0, single.err
    target = single.json["record"]["target"]
    passing_ladder(root, target, batch_size=4)
    return target, started.json["pid"]


def test_rollback_after_failing_ladder_restores_and_matches(cli, isolated: Path) -> None:
    port = free_port()
    managed_config(isolated, port, mock_command())
    target, old_pid = _managed_with_baseline(cli, isolated, port)
    try:
        result = cli("rollback", "--json", "--junit", "rollback.xml")
        assert result.code == 0, result.err
        assert pid_gone(old_pid), "the old server process is gone"
        record = json.loads((isolated / "runs/server.json").read_text("utf-8"))
        assert record["pid"] != old_pid and record["batch_size"] == 4 and record["concurrency"] == 1
        assert record["argv"][-2:] == ["--slots", "1"], "restarted with concurrency 1"
        assert readiness.port_open("127.0.0.1", port)
    finally:
        cli("server", "stop")
    # the mock publishes no cap: what calibrate did is said, not that the server runs batch 4
    said = " ".join(result.err.split())
    assert "restored: restarted at batch 4, concurrency 1, output matches the baseline" in said
    assert "recovery, not more capacity" in result.err
    assert "VRAM release not measured" in result.err or "VRAM released" in result.err
    run = isolated / "runs" / result.json["run_id"]
    steps = [json.loads(x) for x in (run / "steps.jsonl").read_text("utf-8").splitlines()]
    assert [s["step"] for s in steps] == ["stop", "vram", "active", "restart", "compare"]
    assert all(s["ok"] for s in steps)
    ledger = _ledger(isolated)
    assert [e["summary"]["step"] for e in ledger if e["stage"] == "rollback-step"] == [
        "stop",
        "vram",
        "active",
        "restart",
        "compare",
    ]
    assert ledger[-1]["stage"] == "rollback" and ledger[-1]["passed"] is True
    assert ledger[-1]["summary"]["setting"] == {"batch_size": 4, "concurrency": 1}
    assert ledger[-1]["target"] == target
    assert not (isolated / "runs/active.json").exists(), "the ledger is the only copy"
    status = cli("status", "--json").json
    assert status["setting"]["batch_size"] == 4 and status["setting"]["concurrency"] == 1
    assert status["setting"]["source"] == "rollback"
    suite = ET.parse(isolated / "rollback.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "5" and suite.get("failures") == "0"
    assert FAKE_KEY not in all_files_text(isolated)


def test_rollback_with_other_output_says_not_concurrency(cli, isolated: Path) -> None:
    port = free_port()
    managed_config(isolated, port, mock_command())
    _managed_with_baseline(cli, isolated, port)
    # the engine now loads something else: same server, other text
    managed_config(isolated, port, mock_command("--text-seed", "7"))
    try:
        result = cli("rollback", "--junit", "rollback.xml")
    finally:
        cli("server", "stop")
    assert result.code == 1
    assert "still differs at the verified setting" in result.err
    assert "not concurrency" in result.err
    assert '+ "text": ' in result.err, "the diff shows the changed text"
    (run,) = [p for p in (isolated / "runs").iterdir() if "-rollback-" in p.name]
    incident = json.loads((run / "incidents/5-compare.json").read_text("utf-8"))
    assert incident["request"]["body"]["messages"][0]["content"]
    assert incident["request"]["headers"]["Authorization"] == "[REDACTED]"
    assert incident["server"]["log_tail"], "the managed server's log is in the bundle"
    assert incident["comparison"]["differing"]
    assert _ledger(isolated)[-1]["passed"] is False
    failures = ET.parse(isolated / "rollback.xml").getroot().findall(".//failure")
    assert len(failures) == 1 and "not concurrency" in (failures[0].get("message") or "")
    assert FAKE_KEY not in all_files_text(isolated)


class _UserRestart(threading.Thread):
    """The user: stops the target's server once rollback asks them to, then starts it again on
    the same port once rollback asks for that. (On timers, a rollback slower than the user on a
    busy machine found the server already down, or back already — the same process here, so no
    new PID to see — and waited 20 s for a stop that never came.)"""

    def __init__(self, port: int, settings: MockSettings, first: BackgroundServer) -> None:
        super().__init__(daemon=True)
        self.port, self.settings, self.first = port, settings, first
        self.servers: list[BackgroundServer] = []
        self.asked = threading.Event()

    def run(self) -> None:
        said = sys.stderr  # what rollback prints, captured (the user reads their terminal)
        while not self.asked.is_set():
            if "stop it yourself" in " ".join(said.getvalue().split()):
                break
            self.asked.wait(0.02)
        self.first.stop()
        while not self.asked.is_set():  # as a user does: once rollback says it saw the stop
            if "restart your server at batch size" in " ".join(said.getvalue().split()):
                break
            self.asked.wait(0.02)
        self.servers.append(BackgroundServer(self.settings, "127.0.0.1", self.port))

    def done(self) -> None:
        self.asked.set()  # rollback ended: whatever it said, the user goes on
        self.join()
        for server in self.servers:
            server.stop()


def _rollback_while_the_user_restarts(
    cli: Any, root: Path, batch: int, first: BackgroundServer, again: MockSettings
) -> Any:
    """A baseline and a ladder that passed ``batch``, then rollback while the user stops the
    target's server and starts it again (with ``again``'s settings) on the same port."""
    single = cli("single", "--json")
    assert single.code == 0, single.err
    passing_ladder(root, single.json["record"]["target"], batch_size=batch)
    user = _UserRestart(first.server.port, again, first)
    user.start()
    try:
        return cli("rollback", "--wait", "20")
    finally:
        user.done()


def test_rollback_waits_for_an_unmanaged_server_to_stop_and_come_back(cli, isolated: Path) -> None:
    settings = MockSettings(ttft_s=0.002, per_token_s=0.0005)
    first = BackgroundServer(settings, "127.0.0.1", 0)
    port = first.server.port
    write_config(isolated / "calibrate.toml", f"http://127.0.0.1:{port}/v1")
    result = _rollback_while_the_user_restarts(cli, isolated, 2, first, settings)
    assert result.code == 0, result.err
    assert "stop it yourself" in result.err and "kill -TERM" in result.err
    assert "restart your server at batch size 2 and concurrency 1" in result.err
    said = " ".join(result.err.split())
    # the user restarted it and no cap was read: the answer is restored, its batch not known
    assert "the answer is restored: output matches the baseline at concurrency 1" in said
    assert "restored: batch" not in said and "the server's cap is not known" in said


def test_an_unmanaged_restart_with_other_output_and_no_cap_is_not_at_the_verified_setting(
    cli, isolated: Path
) -> None:
    """The user restarts the target (no /props: its cap is not known) and it answers otherwise.
    Rollback said "still differs at the verified setting: look at model loading or the
    environment, not concurrency" of a server it neither started nor read: it may run at any
    batch. Now it says the cap is not known and that the batch size may be the cause."""
    settings = MockSettings(ttft_s=0.002, per_token_s=0.0005)
    first = BackgroundServer(settings, "127.0.0.1", 0)
    write_config(isolated / "calibrate.toml", f"http://127.0.0.1:{first.server.port}/v1")
    other = MockSettings(ttft_s=0.002, per_token_s=0.0005, text_seed=7)
    result = _rollback_while_the_user_restarts(cli, isolated, 4, first, other)
    assert result.code == 1, result.err
    said = " ".join(result.err.split())
    assert "at the verified setting" not in said and "not concurrency" not in said
    assert "still differs after your restart, and the server's cap is not known (no /props" in said
    assert "the cause may be its batch size as much as model loading or the environment" in said


def test_an_unmanaged_restart_read_at_its_cap_still_differs_at_the_verified_setting(
    cli, isolated: Path
) -> None:
    """Its /props says 4 slots, the batch rollback returns to: the verified setting's words hold."""
    props = MockSettings(ttft_s=0.002, per_token_s=0.0005, slots=4, expose_props=True)
    first = BackgroundServer(props, "127.0.0.1", 0)
    write_config(isolated / "calibrate.toml", f"http://127.0.0.1:{first.server.port}/v1")
    other = MockSettings(ttft_s=0.002, per_token_s=0.0005, slots=4, expose_props=True, text_seed=7)
    result = _rollback_while_the_user_restarts(cli, isolated, 4, first, other)
    assert result.code == 1, result.err
    assert "still differs at the verified setting" in " ".join(result.err.split())


def test_unmanaged_server_not_stopped_in_time_fails_step_1(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.001, per_token_s=0.0001) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        single = cli("single", "--json")
        passing_ladder(isolated, single.json["record"]["target"])
        result = cli("rollback", "--wait", "0.3")
    assert result.code == 1 and "still open after --wait" in result.err
    assert list((isolated / "runs").glob("*-rollback-*/incidents/1-stop.json"))


def test_rollback_gate_needs_a_passing_tier_or_pin(cli, mock, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    result = cli("rollback")
    assert result.code == 3 and "calibrate ladder" in result.err


def test_vram_release_waits_for_the_pid_to_leave_nvml() -> None:
    """A fake NVML: the old PID holds memory for two polls, then it is released."""
    held = GpuSnapshot(
        ({"index": 0, "used_mib": 70000.0, "total_mib": 81920.0},), ((4242, 68000.0),)
    )
    freed = GpuSnapshot(({"index": 0, "used_mib": 1500.0, "total_mib": 81920.0},), ())
    readings = iter([held, held, freed])
    now = [0.0]
    release = readiness.wait_released(
        lambda: next(readings),
        4242,
        1200.0,
        held,
        timeout_s=5,
        clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )
    assert release.ok and release.measured and release.pid_listed is False
    assert (
        "PID 4242 is not in NVML's process list" in release.message and "70000" in release.message
    )


def test_vram_not_released_fails_after_timeout() -> None:
    stuck = GpuSnapshot(({"index": 0, "used_mib": 30000.0, "total_mib": 81920.0},), ())
    now = [0.0]
    release = readiness.wait_released(
        lambda: stuck,
        4242,
        1200.0,
        stuck,
        timeout_s=2,
        clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )
    assert not release.ok and "not come back within 512 MiB" in release.message
    none = readiness.wait_released(lambda: None, 4242, None, None)
    assert none.ok and not none.measured and "not measured" in none.message


@pytest.mark.parametrize("beside", ["a managed server beside it", "[server] on another port"])
def test_rollback_of_a_target_calibrate_does_not_manage_touches_no_other_server(
    cli, isolated: Path, beside: str
) -> None:
    """The target is a server the user runs. A server calibrate manages on another port was
    stopped and started again instead (and the target's port then waited on), and with
    `[server]` set up for another port (none started) rollback said "calibrate does not manage
    this server" and then started an engine itself there, on `[server] port`. Both leave the
    other port alone now, and the user restarts the target. (`[server]` on the target's own
    port is started at step 4: test_engine_interrupts' rollback test.)"""
    settings = MockSettings(ttft_s=0.002, per_token_s=0.0005)
    first = BackgroundServer(settings, "127.0.0.1", 0)
    port, other = first.server.port, free_port()
    managed_config(isolated, other, mock_command())
    config = isolated / "calibrate.toml"
    config.write_text(config.read_text().replace(f"127.0.0.1:{other}", f"127.0.0.1:{port}"))
    managed_pid = None
    if beside == "a managed server beside it":
        started = cli("server", "start", "--concurrency", "2", "--json")
        assert started.code == 0, started.err
        managed_pid = started.json["pid"]
    try:
        result = _rollback_while_the_user_restarts(cli, isolated, 2, first, settings)
        still = managed_pid is not None and not pid_gone(managed_pid)
        other_open = readiness.port_open("127.0.0.1", other)
    finally:
        cli("server", "stop")
    assert result.code == 0, result.err
    said = " ".join(result.err.split())
    assert "stop it yourself" in said and "restart your server at batch size 2" in said
    assert "starting:" not in said  # no engine started by calibrate
    if managed_pid is not None:
        assert still and other_open, "the managed server beside the target is left running"
        assert f"(PID {managed_pid}, port {other}) is not the target" in said
    else:
        assert not other_open and not (isolated / "runs/server.json").exists()


def test_rollback_checks_the_cap_the_restarted_server_reports(cli, isolated: Path) -> None:
    """The user restarts the target at 8 slots (its /props says so), not the batch 4 rollback
    returns to: "restored: batch 4" was said from the answer alone, while verify a moment later
    said "the server runs at cap 8". The compare step now reads the cap as verify does."""
    first = BackgroundServer(
        MockSettings(ttft_s=0.002, per_token_s=0.0005, slots=4, expose_props=True), "127.0.0.1", 0
    )
    port = first.server.port
    write_config(isolated / "calibrate.toml", f"http://127.0.0.1:{port}/v1")
    eight = MockSettings(ttft_s=0.002, per_token_s=0.0005, slots=8, expose_props=True)
    result = _rollback_while_the_user_restarts(cli, isolated, 4, first, eight)
    assert result.code == 1, result.err
    said = " ".join(result.err.split())
    assert "restored:" not in said
    assert "the server runs at cap 8 (llama.cpp /props total_slots), not batch 4" in said


def test_a_fixed_prompt_that_gets_no_answer_is_that_failure_not_still_differs(
    cli, isolated: Path
) -> None:
    """The user restarts the target, and it answers the fixed prompt with HTTP 500. Rollback
    said "still differs at the verified setting: look at model loading or the environment, not
    concurrency" (text, --json messages, JUnit, incident) of a request that got no answer at
    all; now step 5 says the prompt got no answer and why, as verify does."""
    first = BackgroundServer(MockSettings(ttft_s=0.002, per_token_s=0.0005), "127.0.0.1", 0)
    write_config(isolated / "calibrate.toml", f"http://127.0.0.1:{first.server.port}/v1")
    failing = MockSettings(ttft_s=0.002, per_token_s=0.0005, fail_rate=1.0)
    single = cli("single", "--json")
    assert single.code == 0, single.err
    passing_ladder(isolated, single.json["record"]["target"], batch_size=2)
    user = _UserRestart(first.server.port, failing, first)
    user.start()
    try:
        result = cli("rollback", "--wait", "20", "--json", "--junit", "rollback.xml")
    finally:
        user.done()
    assert result.code == 1, result.err
    said = " ".join(result.err.split())
    assert "still differs" not in said and "model loading" not in said
    # the user restarted it, its cap unread: "after your restart", never "at the verified setting"
    assert "the fixed prompt got no answer after your restart (http_5xx, HTTP 500" in said
    assert "no answer after your restart (http_5xx" in result.json["messages"][-1]
    failure = ET.parse(isolated / "rollback.xml").getroot().find(".//failure")
    assert failure is not None and failure.get("type") == "http_5xx"
    assert "got no answer" in (failure.get("message") or "")
    (run,) = [p for p in (isolated / "runs").iterdir() if "-rollback-" in p.name]
    incident = json.loads((run / "incidents/5-compare.json").read_text("utf-8"))
    assert incident["error"]["kind"] == "http_5xx"


@pytest.mark.parametrize("props", [False, True], ids=["cap unread", "cap read"])
def test_junit_and_json_pass_no_check_the_rollback_did_not_make(
    cli, isolated: Path, props: bool
) -> None:
    """A server the user restarted, whose cap cannot be read: the text said "the server's cap
    could not be read: the answer was checked, not that it runs at batch 4", and the JUnit
    check "the server is back at the verified setting" passed all the same (as did "its VRAM
    was released" beside "VRAM release not measured"). Such a check is now skipped, its reason
    given, and --json's steps say it went unchecked; a cap read at batch 4 passes it."""
    settings = MockSettings(ttft_s=0.002, per_token_s=0.0005, slots=4, expose_props=props)
    first = BackgroundServer(settings, "127.0.0.1", 0)
    write_config(isolated / "calibrate.toml", f"http://127.0.0.1:{first.server.port}/v1")
    single = cli("single", "--json")
    assert single.code == 0, single.err
    passing_ladder(isolated, single.json["record"]["target"], batch_size=4)
    user = _UserRestart(first.server.port, settings, first)
    user.start()
    try:
        result = cli("rollback", "--wait", "20", "--json", "--junit", "rollback.xml")
    finally:
        user.done()
    assert result.code == 0, result.err
    cases = {
        c.get("name"): c.find("skipped")
        for c in ET.parse(isolated / "rollback.xml").getroot().iter("testcase")
    }
    steps = {s["step"]: s for s in result.json["steps"]}
    back = cases["the server is back at the verified setting"]
    if props:
        assert back is None and "unchecked" not in steps["restart"]
    else:
        assert "is not known (no /props" in " ".join(result.err.split())
        assert back is not None and "its cap could not be read" in (back.get("message") or "")
        assert "runs at batch 4 is not known" in steps["restart"]["unchecked"]
    vram = cases["its VRAM was released"]
    unproven = "not measured" in result.err or "release not proven" in result.err
    assert (vram is not None) == unproven == ("unchecked" in steps["vram"])
    assert cases["the fixed prompt matches the baseline"] is None


def test_after_a_rollback_the_batch_size_is_credited_to_the_run_that_measured_it(
    cli, isolated: Path
) -> None:
    """After a rollback, `pin` wrote "# batch size verified by rollback run R" and `status` said
    "batch size from rollback run R" — of a run that measured no batch size (it even said its
    cap could not be read). Both now name the ladder run it returned to, and the rollback."""
    settings = MockSettings(ttft_s=0.002, per_token_s=0.0005)
    first = BackgroundServer(settings, "127.0.0.1", 0)
    write_config(isolated / "calibrate.toml", f"http://127.0.0.1:{first.server.port}/v1")
    result = _rollback_while_the_user_restarts(cli, isolated, 2, first, settings)
    assert result.code == 0, result.err
    ledger = _ledger(isolated)
    ladder_run = next(e["run_id"] for e in ledger if e["stage"] == "ladder")
    rollback_run = ledger[-1]["run_id"]
    status = cli("status", "--json")
    pinned = cli("pin", "--kind", "vllm", "--out", str(isolated / "launch.sh"))
    assert pinned.code == 0, pinned.err
    expected = f"ladder run {ladder_run} (returned to by rollback run {rollback_run})"
    assert status.json["setting"]["batch_from"] == expected
    header = (isolated / "launch.sh").read_text("utf-8")
    assert f"# batch size verified by {expected}" in header
    assert f"verified by rollback run {rollback_run}" not in header


def test_a_restart_quicker_than_a_poll_counts_as_the_stop() -> None:
    """A user's supervisor that restarts the server between two of rollback's polls left the
    port open at every look: rollback waited out --wait and failed step 1 on a server that had
    stopped. Another process listening there now ends the wait as the port closing does."""
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        assert not readiness.wait_port_closed("127.0.0.1", port, 0.2)
        assert readiness.wait_port_closed("127.0.0.1", port, 30, replaced=lambda: True)
