"""A server that goes away mid-run: the batch pauses, keeps its items, and goes on when it is back."""

from __future__ import annotations

import itertools
import json
import signal
import threading
import time
from pathlib import Path

import pytest

from calibrate.errors import ErrorInfo
from calibrate.stages.batch.sending.lanes import Lane, report
from calibrate.stages.batch.sending.outage import Breaker, OutageEvent, OutagePolicy, is_outage
from calibrate.state.setting import Endpoint
from tests.batch_helpers import assert_valid_jsonl, write_tasks
from tests.fakes import free_port, managed_config, mock_command, pythonpath_env
from tests.helpers import write_config
from tests.mockserver import start_mock_process
from tests.tier_helpers import junit_cases

REFUSED = ErrorInfo("connect", "connection refused")
FAST = ("--ttft", "0.02", "--per-token", "0.001")


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _after_lines(path: Path, n: int, action, timeout_s: float = 20) -> threading.Thread:
    """Run ``action`` in a thread once ``path`` has ``n`` lines."""

    def wait_then_act() -> None:
        deadline = time.monotonic() + timeout_s
        while _lines(path) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        action()

    thread = threading.Thread(target=wait_then_act, daemon=True)
    thread.start()
    return thread


def _events(isolated: Path, run_id: str) -> list[dict]:
    path = isolated / "runs" / run_id / "outages.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_breaker_opens_after_n_in_a_row_and_an_answer_resets_the_count() -> None:
    events: list[OutageEvent] = []
    breaker = Breaker("http://a/v1", OutagePolicy(after=3), lambda: None, on_event=events.append)
    assert not breaker.note_failure(REFUSED) and not breaker.note_failure(REFUSED)
    breaker.note_answer()  # one answer in between: the run of failures starts again
    assert not breaker.note_failure(REFUSED) and not breaker.note_failure(REFUSED)
    assert not breaker.note_failure(ErrorInfo("http_4xx", "bad request", 400))  # an answer too
    assert [breaker.note_failure(REFUSED) for _ in range(3)] == [False, False, True]
    assert breaker.down and [e.event for e in events] == ["down"]
    assert breaker.note_failure(ErrorInfo("reset", "dropped")), (
        "in flight during the outage: put back"
    )
    assert not is_outage(ErrorInfo("http_5xx", "CUDA out of memory", 500))
    assert is_outage(ErrorInfo("http_5xx", "bad gateway", 502))


def test_an_event_the_caller_cannot_record_never_raises_into_the_worker() -> None:
    """outages.jsonl on a full disk: the breaker still opens, the worker is not hit."""

    def full_disk(event: OutageEvent) -> None:
        raise OSError(28, "No space left on device")

    breaker = Breaker("http://a/v1", OutagePolicy(after=1), lambda: None, on_event=full_disk)
    assert breaker.note_failure(REFUSED) and breaker.down


def test_probing_backs_off_and_gives_up_after_the_limit() -> None:
    now = [0.0]
    probes: list[float] = []

    def probe() -> str | None:
        probes.append(now[0])
        return "connection refused"

    class FakeStop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            now[0] += timeout or 0.0
            return False

    policy = OutagePolicy(after=1, limit_s=30.0)
    breaker = Breaker("http://a/v1", policy, probe, clock=lambda: now[0])
    breaker.trip("test")
    assert breaker.await_up(FakeStop(), lambda: False) is False
    assert breaker.state == "gone"
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps[:5] == [1.0, 2.0, 4.0, 8.0, 10.0], gaps  # capped at 10 s
    assert probes[-1] == 30.0


def test_an_endpoint_given_up_is_down_until_the_run_ends_and_its_pace_is_over_its_up_time() -> None:
    """An endpoint killed 2.5 s into a 15.5 s run read "[gone]: 409 done, 26.4 items/s (c=2);
    1 outage(s), 5 s down": the rate over the whole run, the down time stopped at the give-up
    though it took nothing for 13 s. Its down time runs to the end; its pace is over the
    seconds it served."""
    now = [0.0]

    class FakeStop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            now[0] += timeout or 0.0
            return False

    breaker = Breaker(
        "http://a/v1", OutagePolicy(after=1, limit_s=5.0), lambda: "refused", clock=lambda: now[0]
    )
    now[0] = 2.5
    breaker.trip("killed")
    assert breaker.unavailable_s() == 0.0  # down from this moment
    now[0] = 4.0
    assert breaker.unavailable_s() == 1.5  # in the outage: counted so far
    assert breaker.await_up(FakeStop(), lambda: False) is False and breaker.state == "gone"
    assert breaker.down_total_s == 5.0
    now[0] = 15.5
    assert breaker.unavailable_s() == 13.0  # given up at 7.5 s: nothing taken since
    endpoint = Endpoint("http://a/v1", 2, "per endpoint")
    lane = Lane(endpoint, None, breaker, None)  # type: ignore[arg-type]  # report reads neither
    said = report(lane, 409, 0, 15.5)
    assert said.down_s == 13.0 and said.serving_s == 2.5
    assert said.items_per_s == 409 / 2.5 and said.to_json()["ok_per_s"] == round(409 / 2.5, 3)


def test_a_server_killed_mid_run_and_back_later_fails_no_item(cli, isolated: Path) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 80)
    out = isolated / "out.jsonl"
    mock = start_mock_process("--slots", "4", *FAST)
    port = mock.port
    write_config(isolated / "calibrate.toml", mock.base_url)
    revived: list = []

    def kill_then_revive() -> None:
        mock.stop(signal.SIGKILL)
        time.sleep(2.5)  # probes at 0, 1, 3 s after the outage began: back at the third
        revived.append(start_mock_process("--port", str(port), "--slots", "4", *FAST))

    thread = _after_lines(out, 20, kill_then_revive)
    try:
        result = cli(
            "batch",
            "--input",
            str(tasks),
            "--out",
            str(out),
            "-c",
            "4",
            "--retries",
            "2",
            "--backoff-s",
            "0.05",
            "--outage-after",
            "3",
            "--outage-s",
            "60",
            "--progress-s",
            "0.5",
            "--json",
        )
        thread.join()
    finally:
        mock.stop()
        for server in revived:
            server.stop()
    assert result.code == 0, result.err
    rows = assert_valid_jsonl(out)
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]][:3]
    assert sorted(r["id"] for r in rows) == sorted(f"t{i}" for i in range(80))
    assert "server unreachable for" in result.err and "waiting (up to 60 s)" in result.err
    summary = result.json
    assert summary["failed"] == 0 and summary["done"] == 80
    assert [e["event"] for e in summary["outages"]][:2] == ["down", "up"]
    assert summary["outages"][1]["down_s"] >= 2
    assert [e["event"] for e in _events(isolated, summary["run_id"])][:2] == ["down", "up"]
    assert summary["endpoints"][0]["outages"] >= 1


def test_an_outage_longer_than_outage_s_exits_4_with_nothing_failed(cli, isolated: Path) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 60)
    out = isolated / "out.jsonl"
    mock = start_mock_process("--slots", "4", *FAST)
    write_config(isolated / "calibrate.toml", mock.base_url)
    thread = _after_lines(out, 10, lambda: mock.stop(signal.SIGKILL))
    try:
        started = time.monotonic()
        result = cli(
            "batch",
            "--input",
            str(tasks),
            "--out",
            str(out),
            "-c",
            "4",
            "--retries",
            "1",
            "--backoff-s",
            "0.05",
            "--outage-after",
            "3",
            "--outage-s",
            "2",
            "--progress-s",
            "0.5",
            "--junit",
            "junit.xml",
        )
        elapsed = time.monotonic() - started
        thread.join()
    finally:
        mock.stop()
    assert result.code == 4, result.err
    assert elapsed < 15
    rows = assert_valid_jsonl(out)
    assert rows and all(r["ok"] for r in rows), "an item that never got an answer is not failed"
    # --junit is the run's own verdict: no item failed, but most never ran (it passed before)
    _, cases = junit_cases(isolated / "junit.xml")
    (case,) = [c for c in cases if c.get("name") == "all items ok"]
    failure = case.find("failure")
    assert failure is not None, "an outage that stopped the run is no pass"
    said = failure.get("message", "")
    assert said.startswith("stopped: ") and f"{60 - len(rows)} remaining" in said, said
    assert "no server answered" in result.err and "resume with: calibrate batch" in result.err
    # the rerun against a live server does exactly the rest
    with start_mock_process("--slots", "4", *FAST) as again:
        rerun = cli(
            "batch",
            "--base-url",
            again.base_url,
            "--input",
            str(tasks),
            "--out",
            str(out),
            "-c",
            "4",
            "--json",
        )
    assert rerun.code == 0, rerun.err
    assert rerun.json["skipped"] == len(rows) and rerun.json["done"] == 60 - len(rows)


@pytest.mark.serial  # restarts a real engine 4 s into a 30 s outage window: kept out of the crowd
def test_restart_brings_back_a_managed_server_that_died(cli, isolated: Path) -> None:
    import os
    import sys

    tasks = write_tasks(isolated / "tasks.jsonl", 60)
    out = isolated / "out.jsonl"
    port = free_port()
    write_config(
        isolated / "calibrate.toml",
        f"http://127.0.0.1:{port}/v1",
        f'\n[server]\ncommand = "{sys.executable} -m calibrate mock --port {{port}} '
        f'--slots 4 --ttft 0.02 --per-token 0.001"\nport = {port}\n'
        "ready_timeout_s = 30\nstop_timeout_s = 5\n",
    )
    assert cli("server", "start", "--kind", "custom").code == 0
    pid = int((isolated / "runs/server.pid").read_text())
    thread = _after_lines(out, 15, lambda: os.kill(pid, signal.SIGKILL))
    try:
        result = cli(
            "batch",
            "--input",
            str(tasks),
            "--out",
            str(out),
            "-c",
            "4",
            "--restart",
            "--retries",
            "1",
            "--backoff-s",
            "0.05",
            "--outage-after",
            "3",
            "--outage-s",
            "30",
            "--json",
        )
        thread.join()
        restarted_pid = int((isolated / "runs/server.pid").read_text())
    finally:
        cli("server", "stop")
    assert result.code == 0, result.err
    assert restarted_pid != pid
    assert all(r["ok"] for r in assert_valid_jsonl(out))
    events = [e["event"] for e in result.json["outages"]]
    assert events[:3] == ["down", "restart", "up"], events
    assert result.json["endpoints"][0]["restarts"] == 1
    restart = result.json["outages"][1]["detail"]  # the engine's own end, as recorded
    assert f"the managed server (PID {pid}) was killed by SIGKILL; restarted" in restart, restart


def test_restart_refuses_a_managed_server_that_is_not_the_target(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server calibrate manages runs beside the batch's target: --restart would have
    restarted that one when the target went down, and the target never came back from it.
    Exit 2 before anything is sent."""
    monkeypatch.setenv("PYTHONPATH", pythonpath_env())
    tasks = write_tasks(isolated / "tasks.jsonl", 3)
    other, target = free_port(), free_port()
    managed_config(isolated, other, mock_command())
    config = isolated / "calibrate.toml"
    config.write_text(config.read_text().replace(f"127.0.0.1:{other}", f"127.0.0.1:{target}"))
    assert cli("server", "start", "--concurrency", "2").code == 0
    try:
        result = cli("batch", "--input", str(tasks), "--out", "out.jsonl", "--restart")
    finally:
        cli("server", "stop")
    assert result.code == 2, result.err
    assert "--restart needs the target to be a server calibrate manages" in result.err
    assert not (isolated / "out.jsonl").exists()
