"""The batch hot path without a shared lock: the feeder's queue, the journal thread, slot counts.

The journal writes each line before it counts the item (a crash loses only unwritten lines,
whose items run again), a slow disk holds workers back instead of growing memory, a failed
write stops the run; the feeder hands items out in order, again after an outage, and wakes a
waiting worker on close; kill -9 at c=64 at several moments loses and repeats nothing.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from calibrate.http.aio.bridge import shared_loop
from calibrate.http.client import OpenAIClient
from calibrate.http.models import Choice, Completion, SamplingParams, Usage
from calibrate.io.jsonl import JsonlWriter
from calibrate.stages.batch.journal import Journal, Tally
from calibrate.stages.batch.result import BatchProgress
from calibrate.stages.batch.sending.queue import MAX_REQUEUES, WorkQueue
from calibrate.stages.batch.stage import BatchSpec, plan_batch, run_batch
from tests.batch_helpers import (
    ScriptedTransport,
    assert_each_item_once,
    assert_valid_jsonl,
    batch_process,
    ok_ids,
    scripted_lane,
    wait_for_lines,
    write_tasks,
)
from tests.helpers import kill_9, reaped, write_config
from tests.mockserver import start_mock

PARAMS = SamplingParams(0.0, 64, 1.0, None)


def _line(i: int, ok: bool = True) -> dict[str, Any]:
    if ok:
        return {"id": f"t{i}", "ok": True, "output": f"answer {i}", "attempts": 1}
    return {
        "id": f"t{i}",
        "ok": False,
        "error": {"kind": "timeout", "message": "slow"},
        "attempts": 3,
    }


class GatedWriter(JsonlWriter):
    """Writes only once ``gate`` is open (a slow disk); the disk is full from line ``fail_at``
    on (the lines of the group before it are written, the write fails with ENOSPC)."""

    def __init__(self, path: Path, gate: threading.Event, fail_at: int | None = None) -> None:
        super().__init__(path)
        self.gate, self.fail_at, self.lines, self.held = gate, fail_at, 0, 0

    def write_many(self, objs: Any) -> None:
        self.held = len(objs)
        assert self.gate.wait(10)
        for obj in objs:
            self.lines += 1
            if self.fail_at is not None and self.lines >= self.fail_at:
                raise OSError(errno.ENOSPC, "No space left on device")
            super().write(obj)


class OnDiskTally(Tally):
    """Asserts, for every item it counts, that its line is already in the file."""

    def __init__(self, path: Path) -> None:
        super().__init__(sample=False, expect="text", max_chars=None)
        self.path = path
        self.seen_unwritten: list[Any] = []

    def count(self, line: dict[str, Any], text: str | None, tokens: int, endpoint: str) -> None:
        ids = {json.loads(x)["id"] for x in self.path.read_bytes().splitlines() if x}
        if line["id"] not in ids:
            self.seen_unwritten.append(line["id"])
        super().count(line, text, tokens, endpoint)


def test_the_journal_writes_each_line_before_it_counts_it_and_never_blocks_a_worker(
    tmp_path: Path,
) -> None:
    path = tmp_path / "out.jsonl"
    gate = threading.Event()
    tally = OnDiskTally(path)
    journal = Journal(GatedWriter(path, gate), tally)
    started = time.monotonic()
    for i in range(20):
        journal.record(_line(i, ok=i % 5 != 0), f"answer {i}", 7, "e1")
    assert time.monotonic() - started < 1.0, "record() waited for the disk"
    time.sleep(0.1)
    assert tally.finished == 0 and path.read_bytes() == b"", "counted or written past the gate"
    gate.set()
    journal.close()
    rows = assert_valid_jsonl(path)
    assert [r["id"] for r in rows] == [f"t{i}" for i in range(20)]
    assert not tally.seen_unwritten, "an item was counted before its line was on disk"
    assert (tally.ok, tally.failed, tally.kinds) == (16, 4, Counter({"timeout": 4}))
    assert tally.output_tokens == 16 * 7 and tally.attempts == 16 + 12 and tally.retried == 4
    assert tally.done_at["e1"] == 16 and tally.failed_at["e1"] == 4
    journal.record(_line(99), None, 0, "e1")  # after close: dropped, never half-written
    assert len(assert_valid_jsonl(path)) == 20 and tally.finished == 20


@pytest.mark.parametrize("fail_at", [1, 3, 10])
def test_a_failed_write_stops_recording_and_counts_only_what_was_written(
    tmp_path: Path, fail_at: int
) -> None:
    path = tmp_path / "out.jsonl"
    gate = threading.Event()
    gate.set()
    errors: list[str] = []
    tally = Tally(sample=False, expect="text", max_chars=None)
    journal = Journal(GatedWriter(path, gate, fail_at=fail_at), tally, on_write_error=errors.append)
    for i in range(12):
        journal.record(_line(i), None, 0, "e1")
    journal.close()
    written = fail_at - 1
    assert len(assert_valid_jsonl(path)) == written
    assert tally.ok <= written, "a line that was not written was counted"
    assert errors == [f"cannot write to {path}: No space left on device"]
    assert journal.write_error == errors[0]


@pytest.mark.parametrize("max_pending", [1, 2, 5])
def test_a_slow_disk_holds_workers_back_instead_of_queueing_without_bound(
    tmp_path: Path, max_pending: int
) -> None:
    path = tmp_path / "out.jsonl"
    gate = threading.Event()
    tally = Tally(sample=False, expect="text", max_chars=None)
    writer = GatedWriter(path, gate)
    journal = Journal(writer, tally, max_pending=max_pending)
    recorded = []
    n = 3 * max_pending + 10  # more than the writer's group and the queue can hold

    def worker() -> None:
        for i in range(n):
            journal.record(_line(i), None, 0, "e1")
            recorded.append(i)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    time.sleep(0.3)
    # the writer holds a group at the gate; the worker may be max_pending ahead of it
    assert len(recorded) <= writer.held + max_pending + 1, (recorded, writer.held)
    assert thread.is_alive(), "the worker ran ahead of a stuck disk without bound"
    gate.set()
    thread.join(5)
    assert not thread.is_alive() and len(recorded) == n
    journal.close()
    assert tally.ok == n


def _plan(tmp_path: Path, n: int) -> Any:
    tasks = write_tasks(tmp_path / "tasks.jsonl", n)
    spec = BatchSpec(
        input_path=tasks, out_path=tmp_path / "out.jsonl", model="internlm-s2", params=PARAMS
    )
    return plan_batch(spec)


def test_the_feeder_hands_items_in_order_again_after_an_outage_and_ends_when_all_left(
    tmp_path: Path,
) -> None:
    stop = threading.Event()
    queue = WorkQueue(_plan(tmp_path, 5), workers=2).start()
    first = [queue.take(stop) for _ in range(3)]
    assert [t.id for t in first if t] == ["t0", "t1", "t2"]
    assert first[0] is not None and first[1] is not None
    assert queue.put_back_item(first[0])  # its endpoint went down
    queue.finished(first[1])  # room for one more: t4
    taken = [queue.take(stop), queue.take(stop), queue.take(stop)]
    assert [t.id for t in taken if t] == ["t3", "t0", "t4"]  # t3 was read ahead already
    assert not queue.idle(), "items are still in flight"
    for task in [first[2], *taken]:
        assert task is not None
        queue.finished(task)
    assert queue.take(stop) is None and queue.idle()
    assert queue.take(stop) is None, "the end mark is passed on to every worker"
    queue.join()
    assert queue.handed == 5 and not queue.error


def test_an_item_rides_out_at_most_max_requeues_outages(tmp_path: Path) -> None:
    stop = threading.Event()
    queue = WorkQueue(_plan(tmp_path, 1), workers=1).start()
    task = queue.take(stop)
    assert task is not None
    for _ in range(MAX_REQUEUES):
        assert queue.put_back_item(task)
        again = queue.take(stop)
        assert again is not None and again.id == task.id
    assert not queue.put_back_item(task), "the 11th outage records the item's failure"
    queue.finished(task)
    assert queue.take(stop) is None
    queue.close()


@pytest.mark.parametrize("how", ["close", "stop"])
def test_a_worker_waiting_for_an_item_wakes_when_the_run_stops(tmp_path: Path, how: str) -> None:
    stop = threading.Event()
    queue = WorkQueue(_plan(tmp_path, 3), workers=1, ahead=0).start()
    held = queue.take(stop)  # in flight: the feeder hands out nothing more until it finishes
    assert held is not None
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(queue.take(stop)), daemon=True)
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive(), "took an item past the in-flight cap"
    if how == "stop":
        stop.set()
    queue.close()  # run_batch closes the queue once it sees the stop
    waiter.join(2)
    assert not waiter.is_alive() and got == [None]
    queue.finished(held)
    queue.join()


def test_a_feeder_that_fails_ends_the_run_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _plan(tmp_path, 10)
    real = WorkQueue._generate

    def broken(self: WorkQueue) -> Any:
        for n, task in enumerate(real(self)):
            if n == 3:
                raise RuntimeError("disk controller on fire")
            yield task

    monkeypatch.setattr(WorkQueue, "_generate", broken)
    with start_mock(ttft_s=0.001, per_token_s=0.0) as server:
        client = OpenAIClient(server.base_url, timeout_s=10)
        result = run_batch(plan, client, plan.spec.out_path, progress_every_s=3600)
        client.close()
    assert result.finished == 3 and result.unfinished == 7
    assert "RuntimeError: disk controller on fire" in result.stop_detail


def test_progress_counts_in_flight_items_from_each_workers_own_slot(isolated: Path) -> None:
    plan = _plan(isolated, 8)
    seen: list[BatchProgress] = []
    with start_mock(ttft_s=0.8, per_token_s=0.0) as server:
        client = OpenAIClient(server.base_url, timeout_s=30, max_connections=4)
        result = run_batch(
            plan, client, plan.spec.out_path, on_progress=seen.append, progress_every_s=0.1
        )
        client.close()
    assert result.ok == 8
    assert max(p.in_flight for p in seen) == 4, [p.in_flight for p in seen]
    assert all(p.in_flight <= 4 and p.finished + p.in_flight <= 8 for p in seen)
    assert (seen[-1].finished, seen[-1].ok, seen[-1].in_flight) == (8, 8, 0)


def test_kill_9_at_c64_at_several_moments_then_rerun_has_every_item_exactly_once(
    cli, isolated: Path
) -> None:
    n = 600
    tasks = write_tasks(isolated / "tasks.jsonl", n)
    out = isolated / "out.jsonl"
    args = ("--input", str(tasks), "--out", str(out), "-c", "64", "--progress-s", "3600")
    with start_mock(ttft_s=0.02, per_token_s=0.0) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        for kill_after in (40, 200):
            with reaped(batch_process(isolated, *args)) as proc:
                wait_for_lines(out, kill_after, proc, timeout_s=60)
                kill_9(proc)
        before = len(ok_ids(out))
        assert 200 <= before < n, "killed too late to prove anything"
        result = cli("batch", *args, "--json")
    assert result.code == 0, result.err
    assert result.json["skipped"] == before and result.json["done"] == n - before
    assert_each_item_once(out, n)


def instant(body: dict[str, Any]) -> Completion:
    """Answered in process (no HTTP): only the batch machinery is left to watch."""
    return Completion((Choice(0, "tok " * 8, "stop"),), Usage(5, 8, 13), "m", None, 0.001)


CONDITION_CALLS = {"__enter__", "wait", "notify", "notify_all", "acquire"}


def test_no_condition_or_semaphore_is_taken_per_item_on_the_io_loop(tmp_path: Path) -> None:
    """The old queue took a condition every worker waited on for each item (the c=512 profile's
    top entry); now the I/O loop, which sends every item and reads every answer, takes a
    condition only when the disk lags — never once an item."""
    n = 400
    plan = _plan(tmp_path, n)
    calls: Counter[str] = Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if code.co_filename == threading.__file__ and code.co_name in CONDITION_CALLS:
            owner = type(frame.f_locals.get("self")).__name__
            calls[f"{owner}.{code.co_name}"] += 1

    loop = shared_loop().loop
    on_loop(loop, lambda: sys.setprofile(profile))
    try:
        lane = scripted_lane(ScriptedTransport(instant), plan.spec.concurrency)
        result = run_batch(plan, None, plan.spec.out_path, lanes=[lane], progress_every_s=3600)
    finally:
        on_loop(loop, lambda: sys.setprofile(None))
    assert result.ok == n
    assert sum(calls.values()) <= n // 4, f"per-item locking on the I/O loop: {dict(calls)}"


def test_the_heap_before_the_run_is_frozen_out_of_the_collector_until_it_ends(
    tmp_path: Path,
) -> None:
    """A full collection of the ~45,000 objects alive at the start (every ~70,000 allocations:
    a few hundred items) took ~20 ms of a run's CPU: they are frozen while the items run, and
    back in the collector's care once the run ends."""
    frozen: list[int] = []

    def answer(body: dict[str, Any]) -> Completion:
        frozen.append(gc.get_freeze_count())
        return instant(body)

    plan = _plan(tmp_path, 20)
    assert gc.get_freeze_count() == 0
    lane = scripted_lane(ScriptedTransport(answer), plan.spec.concurrency)
    result = run_batch(plan, None, plan.spec.out_path, lanes=[lane], progress_every_s=3600)
    assert result.ok == 20
    assert min(frozen) > 1000, "the heap as the run began, out of the collector's scans"
    assert gc.get_freeze_count() == 0, "given back to the collector at the end"


def on_loop(loop: asyncio.AbstractEventLoop, call: Callable[[], None]) -> None:
    """Run ``call`` on ``loop``'s thread and wait for it."""
    done = threading.Event()
    loop.call_soon_threadsafe(lambda: (call(), done.set()))
    assert done.wait(10)


class Counting(OpenAIClient):
    """The real client, counting which threads send completions."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.by_thread: Counter[str] = Counter()

    async def complete(self, path: str, body: dict[str, Any]) -> Completion:
        self.by_thread[threading.current_thread().name] += 1
        return await super().complete(path, body)


def test_every_item_is_sent_from_the_io_loop_once(isolated: Path) -> None:
    """Waking a thread for each answer cost ≈ 0.27 ms CPU per request (bench/README.md): every
    request of a batch is sent, and its answer read back, on the one I/O loop (the engine)."""
    n = 200
    plan = _plan(isolated, n)
    with start_mock(ttft_s=0.002, per_token_s=0.0) as server:
        client = Counting(server.base_url, timeout_s=30, max_connections=4)
        result = run_batch(plan, client, plan.spec.out_path, progress_every_s=3600)
        client.close()
    assert result.ok == n
    assert dict(client.by_thread) == {"calibrate-io": n}, "one request per item, on the loop"
    assert_each_item_once(plan.spec.out_path, n)


def test_progress_never_shows_more_in_flight_than_are_left() -> None:
    """Counts read without a lock: a slot still busy with an item the journal has just counted
    must not read as "8/8 done, 1 in flight"."""
    assert BatchProgress(8, 8, 8, 0, 1, 1.0, False).in_flight == 0
    assert BatchProgress(8, 6, 6, 0, 4, 1.0, False).in_flight == 2
    assert BatchProgress(8, 2, 1, 1, 3, 1.0, False).in_flight == 3


def test_no_eta_while_every_endpoint_is_down_or_the_run_stops() -> None:
    """An ETA at the rate before an outage said "ETA 7 s" while nothing was sent: with every
    endpoint down (or stopping) the time left is unknown; one of two down, the other sends."""
    running = BatchProgress(200, 47, 47, 0, 8, 2.0, False, endpoints=2)
    assert running.eta_s == pytest.approx(153 / 23.5)
    one_down = BatchProgress(200, 47, 47, 0, 8, 2.0, False, (("a", 1.0),), 30.0, 2)
    assert one_down.eta_s == running.eta_s
    all_down = BatchProgress(200, 47, 47, 0, 0, 2.0, False, (("a", 1.0),), 30.0)
    assert all_down.eta_s is None and all_down.items_per_s > 0
    assert BatchProgress(200, 47, 47, 0, 8, 2.0, True).eta_s is None  # stopping
