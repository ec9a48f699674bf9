"""The output file's one writer: a thread fed by a queue, off the request path (SPEC §11).

A worker hands its item's line over (``record``, one ``SimpleQueue.put``) and takes its next
item; the journal thread appends the lines queued by then (one write, flushed, fsynced with
--fsync: a group commit) and only then counts those items done in the ``Tally``, which only
this thread changes, so counting needs no lock. After a write it lets the next lines gather
for ``GATHER_S`` (10 ms; not when closing, nor while a worker waits for room): one wake-up of
this thread a group, not a line — each cost the run's CPU a thread hand-off. A kill -9 loses
at most the lines not yet written, whose items have no line and so run again; nothing is
written twice (a line torn by the kill is cut off by the rerun's scan, and its item runs
again). A worker far ahead of a slow disk waits (at most ``max_pending`` lines queued), so
memory stays bounded. A write that fails (disk full, file gone) stops recording:
``on_write_error`` stops the run; lines already written stay valid.

The journal thread shares the interpreter with hundreds of workers, so it writes in bursts and
may lag (about 0.4 lines per worker at c=512 against a fast mock); a worker waits only past
``max_pending`` queued lines, and then until the queue is down to half of that (one wake-up
per burst, never one per line for every waiting worker). So a kill -9 loses at most the
requests in flight plus ``max_pending`` answered ones, which the rerun sends again.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any

from calibrate.io.journal.made import Settings
from calibrate.io.journal.scan import repair_tail
from calibrate.io.jsonl import JsonlWriter, without_surrogates
from calibrate.io.tasks import ItemId
from calibrate.stages.batch.plan import BatchPlan, LineWatch
from calibrate.stages.measure.format_check import Expect, OutputShape, find_preamble

EXAMPLES = 5  # failures and format notes kept as examples for the summary


class Tally:
    """The run's counters. Only the journal thread changes them (``Journal`` below), each item
    after its line was written, so they need no lock; progress reads them as they are."""

    def __init__(self, *, sample: bool, expect: Expect, max_chars: int | None) -> None:
        self.sample = sample
        self.expect: Expect = expect
        self.max_chars = max_chars
        self.ok = self.failed = self.output_tokens = self.retried = self.attempts = 0
        self.untold = 0  # ok answers that did not say their output tokens (no usage)
        self.kinds: Counter[str] = Counter()
        self.done_at: Counter[str] = Counter()  # per endpoint
        self.failed_at: Counter[str] = Counter()
        self.failures: list[dict[str, Any]] = []
        self.preamble: list[str] = []
        self.preamble_n = self.too_long_n = 0
        self.too_long: list[str] = []
        self.shapes: list[OutputShape] = []

    @property
    def finished(self) -> int:
        return self.ok + self.failed

    def count(
        self, line: dict[str, Any], text: str | None, tokens: int | None, endpoint: str
    ) -> None:
        """Count one item whose line is written (``tokens`` None: its answer did not say how
        many it had — counted apart, never as 0)."""
        item_id = line["id"]
        self.attempts += line["attempts"]
        self.retried += line["attempts"] > 1
        (self.done_at if line["ok"] else self.failed_at)[endpoint] += 1
        if line["ok"]:
            if tokens is None:
                self.untold += 1
            else:
                self.output_tokens += tokens
            self.ok += 1
        else:
            kind = line["error"]["kind"]
            self.kinds[kind] += 1
            if len(self.failures) < EXAMPLES:
                error = dict(line["error"])
                error["message"] = without_surrogates(str(error.get("message", "")))
                self.failures.append({"id": item_id, **error})
            self.failed += 1
        if text is not None:
            self._note_shape(item_id, text)

    def _note_shape(self, item_id: ItemId, text: str) -> None:
        if self.sample:
            self.shapes.append(OutputShape.of(item_id, text, self.expect))
        phrase = find_preamble(text)
        if phrase:
            self.preamble_n += 1
            if len(self.preamble) < EXAMPLES:
                self.preamble.append(f"{item_id!r}: {phrase!r}")
        if self.max_chars is not None and len(text) > self.max_chars:
            self.too_long_n += 1
            if len(self.too_long) < EXAMPLES:
                self.too_long.append(f"{item_id!r}: {len(text)} chars")


log = logging.getLogger("calibrate")

MAX_PENDING = 4096  # lines queued for the writer before a worker waits for it, at most
MIN_PENDING = 256  # … and at least (run_batch: one per worker in between)
MAX_GROUP = 512  # lines written in one write
JOIN_S = 30.0  # closing: how long the writer may take for the lines still queued
GATHER_S = 0.01  # after a write (not a full one), how long the writer lets lines gather

_Entry = tuple[dict[str, Any], str | None, int | None, str]  # line, text, tokens, endpoint


class Journal:
    def __init__(
        self,
        writer: JsonlWriter,
        tally: Tally,
        *,
        on_write_error: Callable[[str], None] = lambda detail: None,
        max_pending: int = MAX_PENDING,
        settings: Settings | None = None,
        watch: LineWatch | None = None,
    ) -> None:
        self.tally = tally
        self._watch = watch  # the drift watch: each line once counted (plan.watch)
        self._settings = settings  # each line is stamped with them (io/journal/made.py)
        self._whole = True  # the run's first line holds them in full
        self.write_error: str | None = None
        self._writer: JsonlWriter | None = writer
        self._on_write_error = on_write_error
        self._max_pending = max(max_pending, 1)
        self._resume_at = self._max_pending // 2  # a waiting worker goes on at this many
        self._queue: SimpleQueue[_Entry | None] = SimpleQueue()  # None: close
        self._accepting = True
        self._room = threading.Condition()  # only a worker over max_pending waits on it
        self._waiting = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="batch-journal", daemon=True)
        self._thread.start()

    @classmethod
    def for_plan(
        cls, plan: BatchPlan, out_path: Path, slots: int, on_write_error: Callable[[str], None]
    ) -> Journal:
        """The run's journal (pool and worker processes alike): on the plan's writer, or on one
        opened here for a plan that holds none (--sample, or a caller that holds no lock);
        lines not yet written: at most about one per slot (or MIN_PENDING)."""
        spec = plan.spec
        writer = plan.writer
        if writer is None:
            if plan.scan is not None:
                repair_tail(plan.scan)
            writer = JsonlWriter(out_path, fsync=spec.fsync)
        tally = Tally(sample=bool(spec.sample), expect=spec.expect, max_chars=spec.max_chars)
        pending = min(max(slots, MIN_PENDING), MAX_PENDING)
        return cls(
            writer,
            tally,
            on_write_error=on_write_error,
            max_pending=pending,
            settings=None if spec.sample else spec.settings,
            watch=plan.watch,
        )

    def record(
        self,
        line: dict[str, Any],
        text: str | None,
        tokens: int | None,
        endpoint: str,
        *,
        wait: bool = True,
    ) -> None:
        """Queue one item's line; it is counted once written (never twice, or not at all).

        Past ``max_pending`` queued lines the caller waits for room, unless ``wait`` is False
        (the I/O loop, which must not block: it sees ``backlogged`` and stops sending)."""
        if not self._accepting:
            return  # abandoned after the grace period, or a write failed
        self._queue.put((line, text, tokens, endpoint))
        if wait and self._queue.qsize() > self._max_pending:
            self._wait_for_room()

    @property
    def backlogged(self) -> bool:
        """More lines queued than ``max_pending``: who records more should wait (the engine's
        policy sends nothing meanwhile)."""
        return self._queue.qsize() > self._max_pending

    def _wait_for_room(self) -> None:
        with self._room:
            self._waiting += 1
            try:
                while (
                    self._queue.qsize() > self._resume_at
                    and self._accepting
                    and self._thread.is_alive()
                ):
                    self._room.wait(0.05)
            finally:
                self._waiting -= 1

    def close(self) -> None:
        """Write what is queued, then close the file; later lines are dropped."""
        self._accepting = False
        if self._thread.is_alive():  # after a failed write too: its writer still waits for lines
            self._queue.put(None)
            self._closed.set()  # no more gathering: the last lines are written at once
        self._thread.join(JOIN_S)
        if self._thread.is_alive():
            log.warning("batch: the output writer did not finish within %g s", JOIN_S)

    def _run(self) -> None:
        try:
            closing = False
            while not closing:
                group = [self._queue.get()]
                while len(group) < MAX_GROUP:  # and whatever else is queued, without waiting
                    try:
                        group.append(self._queue.get_nowait())
                    except Empty:
                        break
                if None in group:  # close: what came after it was refused anyway
                    closing = True
                    group = group[: group.index(None)]
                self._commit([entry for entry in group if entry is not None])
                if self._waiting and self._queue.qsize() <= self._resume_at:
                    with self._room:
                        self._room.notify_all()
                if not (closing or self._waiting) and len(group) < MAX_GROUP:
                    self._closed.wait(GATHER_S)  # lines gather: a wake-up a group, not a line
        finally:
            self._accepting = False
            if self._writer is not None:
                self._writer.close_quietly()
                self._writer = None
            with self._room:
                self._room.notify_all()

    def _commit(self, group: list[_Entry]) -> None:
        """Write the group's lines in one write (a write gives the interpreter away: one per
        line starved this thread behind hundreds of workers), then count each of them."""
        writer = self._writer
        if writer is None or not group:
            return
        lines = [line for line, _, _, _ in group]
        if self._settings is not None:  # what made each result (io/journal/made.py)
            for line in lines:
                self._settings.stamp(line, whole=self._whole)
                self._whole = False
        try:
            writer.write_many(lines)  # every line, flushed (fsynced with --fsync) before counted
        except Exception as exc:  # OSError (disk full…); anything else must not kill the writer
            detail = getattr(exc, "strerror", None) or exc
            self.write_error = f"cannot write to {writer.path}: {detail}"
            writer.close_quietly()
            self._writer = None
            self._accepting = False
            self._on_write_error(self.write_error)
            return
        for line, text, tokens, endpoint in group:
            try:
                self.tally.count(line, text, tokens, endpoint)
                if self._watch is not None:
                    self._watch(line, tokens, endpoint)
            except Exception:  # the line is written; a counting bug must not stop the writer
                log.exception("batch: counting the line of %r failed", line.get("id"))
