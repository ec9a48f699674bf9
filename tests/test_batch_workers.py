"""``batch --workers N``: worker processes send, the parent alone journals (SPEC §11, §12).

Over real HTTP against the mock: every item exactly once with two workers; kill -9 of the
parent mid-run leaves no worker behind and the rerun loses and repeats nothing; kill -9 of a
worker mid-run puts its unanswered items back, a replacement starts and the run completes
with every item once. The self-check's advice names --workers, and a worker's bottleneck is
the run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from calibrate.gpu.selfload import SelfLoadMonitor, SelfLoadReport, tree_cpu
from calibrate.http.client import OpenAIClient
from calibrate.http.models import SamplingParams
from calibrate.load.procs import selfcheck
from calibrate.load.procs.recipe import ClientRecipe
from calibrate.load.procs.selfcheck import CheckLimits
from calibrate.load.procs.worker_count import cores, workers_for
from calibrate.stages.batch.result import BatchResult
from calibrate.stages.batch.sending import worker as procs_run
from calibrate.stages.batch.sending.control import BatchControl
from calibrate.stages.batch.sending.items import run_items
from calibrate.stages.batch.sending.outage import OutagePolicy
from calibrate.stages.batch.sending.worker import split
from calibrate.stages.batch.sending.workers import worker_senders
from calibrate.stages.batch.stage import BatchPlan, BatchSpec, plan_batch, run_batch
from calibrate.state.setting import Endpoint
from tests.batch_helpers import (
    assert_each_item_once,
    batch_process,
    ok_ids,
    wait_for_lines,
    write_tasks,
)
from tests.canned_server import CannedServer
from tests.helpers import CHAT_REPLY, kill_9, reaped, write_config
from tests.mockserver import start_mock, start_mock_process

CHILD = "calibrate.load.procs.child"  # calibrate's one worker process (load.procs.pool)


def _workers_of(parent: int) -> list[int]:
    """The live worker processes whose parent is ``parent`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == parent and CHILD in cmdline and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def _any_worker_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:  # a process may be gone between any two reads (ENOENT, or ESRCH mid-read)
            state = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if state[state.rindex(")") + 2] != "Z" and CHILD.encode() in cmdline:
            alive.append(pid)
    return alive


def _wait_for_workers(parent: int, n: int, timeout_s: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(pids := _workers_of(parent)) >= n:
            return pids
        time.sleep(0.05)
    raise AssertionError(f"{n} worker processes did not start in {timeout_s} s")


def test_two_workers_over_http_write_every_item_exactly_once(cli, isolated: Path) -> None:
    n = 300
    tasks = write_tasks(isolated / "tasks.jsonl", n)
    out = isolated / "out.jsonl"
    with start_mock(ttft_s=0.005, per_token_s=0.0) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        result = cli(
            "batch", "--input", str(tasks), "--out", str(out), "-c", "8", "--workers", "2",
            "--json",
        )  # fmt: skip
    assert result.code == 0, result.err
    assert result.json["done"] == n and result.json["workers"] == 2
    assert_each_item_once(out, n)
    assert _workers_of(os.getpid()) == [], "a worker process was left running"


def test_kill_9_of_the_parent_leaves_no_worker_and_the_rerun_repeats_nothing(
    cli, isolated: Path
) -> None:
    n = 300
    tasks = write_tasks(isolated / "tasks.jsonl", n)
    out = isolated / "out.jsonl"
    args = ("--input", str(tasks), "--out", str(out), "-c", "8", "--progress-s", "3600")
    with start_mock(ttft_s=0.02, per_token_s=0.0) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        with reaped(batch_process(isolated, *args, "--workers", "2")) as proc:
            workers = _wait_for_workers(proc.pid, 2)
            wait_for_lines(out, 40, proc, timeout_s=60)
            kill_9(proc)
        deadline = time.monotonic() + 10
        while _any_worker_alive(workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _any_worker_alive(workers)
        for pid in left:  # never leave one behind, even when the test fails
            os.kill(pid, signal.SIGKILL)
        assert not left, "a worker outlived its parent"
        before = len(ok_ids(out))
        assert 40 <= before < n, "killed too late to prove anything"
        result = cli("batch", *args, "--workers", "2", "--json")
    assert result.code == 0, result.err
    assert result.json["skipped"] == before and result.json["done"] == n - before
    assert_each_item_once(out, n)


def test_kill_9_of_a_worker_puts_its_items_back_and_the_run_completes(isolated: Path) -> None:
    n = 300
    tasks = write_tasks(isolated / "tasks.jsonl", n)
    out = isolated / "out.jsonl"
    with start_mock(ttft_s=0.02, per_token_s=0.0) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        args = ("--input", str(tasks), "--out", str(out), "-c", "8", "--workers", "2")
        with reaped(batch_process(isolated, *args, "--progress-s", "3600")) as proc:
            victim, *_ = _wait_for_workers(proc.pid, 2)
            wait_for_lines(out, 40, proc, timeout_s=60)
            os.kill(victim, signal.SIGKILL)
            workers = _workers_of(proc.pid)  # the other one, perhaps its replacement already
            _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert not _any_worker_alive(workers), "a worker outlived the run"
    assert f"(PID {victim}) was killed by signal 9" in err and "a new worker starts" in err
    assert len(ok_ids(out)) == n
    assert_each_item_once(out, n)


def test_workers_flag_is_bounded_and_restart_needs_one_process(cli, isolated: Path) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 3)
    for bad in ("0", "x", "257"):
        result = cli("batch", "--input", str(tasks), "--out", "o.jsonl", "--workers", bad)
        assert result.code == 2 and "--workers" in result.err
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:9/v1")
    result = cli(
        "batch", "--input", str(tasks), "--out", "o.jsonl", "--workers", "2", "--restart"
    )  # fmt: skip
    assert result.code == 2 and "--restart goes with one process" in result.err, result.err


def test_the_self_check_advice_names_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("calibrate.load.procs.selfcheck.cores", lambda: 16)
    monkeypatch.setattr("calibrate.load.procs.worker_count.cores", lambda: 16)
    assert "--workers 2" in procs_run.advice(1)
    assert "--workers 16" in procs_run.advice(8)
    assert "already uses every core" in procs_run.advice(16)
    assert "--workers" in procs_run.parent_advice(4)
    assert workers_for(None, 64) == 2 and workers_for(None, 4096) == 16
    assert workers_for(None, 40) == 2  # at most 32 in flight per process, as the sweep's
    assert workers_for(8, 3) == 3  # never more workers than slots


def test_a_workers_bottleneck_is_the_runs_and_slots_are_dealt_evenly() -> None:
    idle = SelfLoadReport(3, 0.2, 0.1, 0.001, False, "")
    busy = SelfLoadReport(3, 0.97, 0.9, 0.002, True, "calibrate itself is the bottleneck: …")
    merged = selfcheck.merged(idle, [idle, busy])
    assert merged.bottleneck and merged.reason == busy.reason and merged.cpu_fraction_max == 0.97
    shares = split([Endpoint("http://a/v1", 5, "flag"), Endpoint("http://b/v1", 2, "flag")], 2)
    assert [sum(e.concurrency for e in share) for share in shares] == [4, 3]


def _plan_of(isolated: Path, name: str) -> BatchPlan:
    """120 items for the self-check tests (at 4 in flight on 0.1 s answers: about 3 s)."""
    spec = BatchSpec(
        input_path=write_tasks(isolated / f"{name}.jsonl", 120),
        out_path=isolated / f"{name}-out.jsonl",
        model="internlm-s2",
        params=SamplingParams(0.0, 64, 1.0, None),
    )
    return plan_batch(spec)


def _two_workers(isolated: Path, base_url: str, warned: list[str], **options: Any) -> BatchResult:
    """A run over 2 worker processes on 4 slots (``worker_senders``); ``options``: the
    self-check thresholds, or any of the run's options in place of these."""
    limits = {k: options.pop(k) for k in ("limits", "machine_share") if k in options}
    given: dict[str, Any] = {
        "control": BatchControl(),
        "on_progress": lambda progress: None,
        "progress_every_s": 3600,
        "monitor": SelfLoadMonitor(),
        "warn": warned.append,
        "outage": OutagePolicy(),
        "events": [],
    }
    run = {**given, **options}
    plan = _plan_of(isolated, "two")
    endpoints = [Endpoint(base_url, 4, "flag")]
    recipe = ClientRecipe(base_url, None, None, 30.0, 5.0, 64.0, 1)
    senders = worker_senders(
        plan, endpoints, 2, recipe, run["control"], run["outage"], lambda e: None, **limits
    )
    return run_items(plan, isolated / "two-out.jsonl", endpoints, senders, **run)


def test_a_failure_of_the_parents_own_loop_ends_every_worker_and_starts_none(
    isolated: Path,
) -> None:
    """calibrate's own error in the parent's loop (here the progress view raising) ends the run:
    every worker is killed, and none of those killed is replaced on the way out."""

    def broken_view(progress: object) -> None:
        raise RuntimeError("a bug in the progress view")

    with (
        start_mock(ttft_s=0.1, per_token_s=0.0) as server,
        pytest.raises(RuntimeError, match="progress view"),
    ):
        _two_workers(isolated, server.base_url, [], on_progress=broken_view, progress_every_s=0)
    assert _workers_of(os.getpid()) == [], "a worker was started while the run was ending"


def test_a_workers_bottleneck_warning_reaches_the_user_once_naming_workers(
    isolated: Path,
) -> None:
    """A worker process whose self-check fires (its threshold at 0 here: every window is
    client-bound) warns through the parent, once for the run, and the summary says so; the
    one-process path under the same threshold fires the same way."""
    with start_mock(ttft_s=0.1, per_token_s=0.0) as server:
        warned: list[str] = []
        result = _two_workers(isolated, server.base_url, warned, limits=CheckLimits(0.0))
        client = OpenAIClient(server.base_url, timeout_s=30, max_connections=4)
        one: list[str] = []
        single = _plan_of(isolated, "one")
        monitor = SelfLoadMonitor(cpu_limit=0.0, advice=procs_run.advice(1)).start()
        alone = run_batch(
            single, client, isolated / "one-out.jsonl", monitor=monitor, warn=one.append
        )
        monitor.stop()
        client.close()
    assert result.ok == 120 and alone.ok == 120
    bottleneck = [w for w in warned if "calibrate itself is the bottleneck" in w]
    assert len(bottleneck) == 1 and "--workers" in bottleneck[0], warned
    assert result.selfload is not None and result.selfload.bottleneck
    assert [w for w in one if "calibrate itself is the bottleneck" in w], one
    assert alone.selfload is not None and alone.selfload.bottleneck


def test_workers_that_together_take_the_machine_are_named_once_advising_another_machine(
    isolated: Path,
) -> None:
    """Each worker keeps up (its own threshold is the real one), but the parent and its workers
    together cross the machine-wide threshold (0 here): one warning, naming every process and
    the machine's cores, and the advice is to move the client, not more --workers."""
    with start_mock(ttft_s=0.1, per_token_s=0.0) as server:
        warned: list[str] = []
        result = _two_workers(isolated, server.base_url, warned, machine_share=0.0)
    assert result.ok == 120
    (text,) = [w for w in warned if "calibrate itself is the bottleneck" in w]
    assert "its 3 processes used" in text and f"of this machine's {cores()}" in text
    assert "another machine" in text
    assert result.selfload is not None and result.selfload.bottleneck


def test_the_tree_cpu_clock_counts_a_busy_child_and_never_runs_back() -> None:
    # the child burns 0.6 s of its own CPU, then stays alive idle: on a loaded machine that takes
    # longer than 0.6 s of wall time, so the clock is read until it shows or the child ends
    burn = "import time\nwhile time.process_time() < 0.6: pass\ntime.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", burn])
    with reaped(child):
        clock = tree_cpu(lambda: [child.pid] if child.poll() is None else [])
        before = during = clock()
        deadline = time.monotonic() + 30
        while during - before <= 0.3 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            during = clock()
        alive = child.poll() is None
        child.kill()
        child.wait(10)
        readings = [clock() for _ in range(3)]
    assert alive and during - before > 0.3  # the live child's CPU, while this process slept
    assert readings == sorted(readings) and readings[0] >= during


def _answers_once() -> CannedServer:
    """A server that answers one chat request (the endpoints' fixed-prompt check) and then stops
    listening: every later connection is refused."""

    def once() -> tuple[int, dict[str, str], bytes]:
        def close() -> None:
            canned._server.shutdown()
            canned._server.server_close()

        threading.Timer(0.02, close).start()  # after this answer is written
        return 200, {}, json.dumps(CHAT_REPLY).encode()

    canned = CannedServer({"/v1/chat/completions": once})
    return canned


def test_an_endpoint_that_answered_the_check_then_went_away_is_an_outage_not_no_server(
    isolated: Path,
) -> None:
    """Two endpoints, two workers, one endpoint each; the second answers the fixed-prompt check
    and is gone before its worker sends anything. A server did answer, so its worker's refusals
    are that endpoint's outage (the other does every item, exit 0), never "no server" (exit 4):
    the worker process alone never saw an answer, the run did. (Four slots there: two of its
    threads refused at once used to be "the first attempts were all refused".)"""
    n = 40
    tasks = write_tasks(isolated / "tasks.jsonl", n)
    out = isolated / "out.jsonl"
    with start_mock(ttft_s=0.005, per_token_s=0.0) as up, _answers_once() as gone:
        write_config(isolated / "calibrate.toml", up.base_url)
        proc = batch_process(
            isolated, "--input", str(tasks), "--out", str(out), "--workers", "2",
            "--base-url", f"{up.base_url}#c=1", "--base-url", f"{gone.base_url}#c=4",
            "--outage-s", "120", "--backoff-s", "0.1", "--progress-s", "3600",
        )  # fmt: skip
        _, err = proc.communicate(timeout=120)
    assert gone.hits == ["/v1/chat/completions"]  # the check, and nothing after it answered
    assert proc.returncode == 0, err
    assert "[down]" in err  # the gone endpoint, in the summary: an outage it waited out
    assert_each_item_once(out, n)


def test_an_endpoint_gone_mid_run_leaves_its_items_to_the_other_workers_endpoint(
    isolated: Path,
) -> None:
    """Two endpoints of one slot each, two workers: each worker has one endpoint. When one
    server goes away, its worker hands its waiting items back and takes none while down, the
    other worker does them all, and the run ends when the items do (not after --outage-s)."""
    n = 200
    tasks = write_tasks(isolated / "tasks.jsonl", n)
    out = isolated / "out.jsonl"
    with (
        start_mock(ttft_s=0.01, per_token_s=0.0) as up,
        start_mock_process("--ttft", "0.01", "--per-token", "0") as gone,
    ):
        write_config(isolated / "calibrate.toml", up.base_url)
        proc = batch_process(
            isolated, "--input", str(tasks), "--out", str(out), "--workers", "2",
            "--base-url", f"{up.base_url}#c=1", "--base-url", f"{gone.base_url}#c=1",
            "--outage-s", "120", "--backoff-s", "0.1", "--progress-s", "3600",
        )  # fmt: skip
        try:
            wait_for_lines(out, 30, proc, timeout_s=60)
            gone.stop(signal.SIGKILL)  # refused from now on
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    assert "down" in err
    assert_each_item_once(out, n)
