"""What a batch will do, decided before anything is sent: the spec, the plan, the opened output.

``open_batch`` validates the input (a pipe is spooled first), locks the output (one writer per
file), scans it and opens it for appending; a problem is an InputError (exit 2) with the output
untouched. ``length_warning`` says which items are longer than any passing ladder verified.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from calibrate.errors import InputError, UsageError
from calibrate.http.models import SamplingParams, chat_request
from calibrate.io.bounded import Stamp, stamp, stamp_change
from calibrate.io.jobs.openai_batch import JobFormat
from calibrate.io.jobs.shard import Shard, foreign_lines
from calibrate.io.journal.made import MIXED_FLAG, Settings
from calibrate.io.journal.scan import (
    OutputScan,
    check_journal,
    check_output_path,
    repair_tail,
    scan_output,
)
from calibrate.io.jsonl import JsonlWriter
from calibrate.io.lock import ExclusiveLock
from calibrate.io.tasks import InputIndex, ItemId, Task, index_input, readable_twice
from calibrate.load.retry import RetryPolicy
from calibrate.stages.measure.format_check import Expect

CHAT_PATH = "/chat/completions"
DEFAULT_CONCURRENCY = 4
LineWatch = Callable[[dict[str, Any], int | None, str], None]  # a counted line, tokens, endpoint
MAX_CONCURRENCY = 4096  # documented in --help and the README; a thread each, a socket each
# --drift-window-s: the drift watch's shortest window (drift/windows.py), and the bounds a user
# may set it to — at 0.5 s its watch ticks 4 times a second, scraping the server's /metrics
DRIFT_WINDOW_S, DRIFT_WINDOW_S_RANGE = 2.0, (0.5, 60.0)


@dataclass(frozen=True)
class BatchSpec:
    input_path: Path
    out_path: Path | None  # None only with ``sample``
    model: str
    params: SamplingParams
    prompt: str = ""
    concurrency: int = 4
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    grace_s: float = 10.0
    fsync: bool = False
    sample: int | None = None
    limit: int | None = None
    max_chars: int | None = None
    expect: Expect = "text"
    allow_foreign: bool = False
    shard: Shard | None = None  # --shard I/N: only the ids whose stable hash mod N is I
    hosts: tuple[str, ...] = ()  # the endpoints' hosts: what produced results (made.py)
    allow_mixed: bool = False  # --allow-mixed: keep results made with other settings
    format: JobFormat = "tasks"  # the input's, found by the plan (io/jobs/openai_batch.py)
    text_flags: tuple[str, ...] = ()  # flags given that only {id, text} tasks take
    drift_window_s: float = DRIFT_WINDOW_S  # --drift-window-s

    @property
    def settings(self) -> Settings:
        """What this run sends besides each item (the journal's settings line), and what it
        checks of each answer (--expect): a Batch API request's body is the item's own, so only
        the model it may lack and the hosts."""
        params = self.params.to_json() if self.format == "tasks" else {}
        return Settings.of(self.model, self.prompt, params, self.hosts, self.expect)

    def request_for(self, task: Task) -> tuple[str, dict[str, Any]]:
        """Where ``task`` goes under the base URL, and the body sent: a request line's as it
        is (with this model if it names none), else the chat message of its text."""
        if task.request is not None:
            return task.request.path, task.request.body_for(self.model)
        return CHAT_PATH, chat_request(self.model, task.message(self.prompt), self.params)


@dataclass(frozen=True)
class BatchPlan:
    """What the validation pass and the resume scan found; nothing was written yet."""

    spec: BatchSpec
    total: int
    done_ids: set[ItemId]
    scan: OutputScan | None
    input_path: Path | None = None  # what to read: --input, or its spooled copy
    writer: JsonlWriter | None = None  # --out, opened (and locked) by open_batch
    notes: tuple[str, ...] = ()  # what the resume found about what produced the results
    input_stamp: Stamp | None = None  # --input as validated (a regular file; not a copy)
    watch: LineWatch | None = None  # sees each line once counted: the drift watch's ``seen``
    foreign: str = ""  # what --out holds besides this run's items (kept with --allow-foreign)

    def input_changed(self) -> str | None:
        """How --input changed since it was validated, in words; None when it did not (or is a
        pipe, read once into a copy of ours)."""
        if self.input_stamp is None:
            return None
        return stamp_change(self.input_stamp, stamp(self.spec.input_path))

    @property
    def piped(self) -> bool:
        """--input was a pipe or device, read once into a copy of ours (gone after the run)."""
        return self.input_path is not None and self.input_path != self.spec.input_path

    @property
    def source_path(self) -> Path:
        return self.input_path or self.spec.input_path

    @property
    def skipped(self) -> int:
        return 0 if self.spec.sample else len(self.done_ids)

    @property
    def pending(self) -> int:
        return self.total - self.skipped

    @property
    def to_run(self) -> int:
        cap = self.spec.sample or self.spec.limit
        return min(self.pending, cap) if cap else self.pending


def plan_batch(spec: BatchSpec, input_path: Path | None = None) -> BatchPlan:
    """Validate the input, scan the output; raise InputError (exit 2) without writing.

    ``input_path`` is a readable copy of ``spec.input_path`` (see ``open_batch``).
    """
    return _plan(spec, index_input(input_path or spec.input_path, spec.input_path), input_path)


def _plan(spec: BatchSpec, index: InputIndex, input_path: Path | None) -> BatchPlan:
    spec = replace(spec, format=index.format)
    if index.format == "openai_batch":
        check_requests(spec, index)
    whole = index  # every id: another shard's results are told from another input's
    if (shard := spec.shard) is not None and shard.count > 1:
        ids = {item_id: fp for item_id, fp in index.ids.items() if shard.holds(item_id)}
        index = InputIndex(index.path, ids, len(ids))
    if spec.sample or spec.out_path is None:
        return BatchPlan(spec, index.count, set(), None, input_path)
    check_output_path(spec.out_path, spec.input_path)
    scan = scan_output(spec.out_path, index.ids)
    check_journal(scan)
    foreign = foreign_lines(scan, spec.input_path, whole.ids, spec.shard) if scan.foreign else ""
    if foreign and not spec.allow_foreign:
        own = f" (each shard its own: out-{spec.shard.index}.jsonl)" if spec.shard else ""
        raise InputError(
            f"{spec.out_path} holds {foreign}",
            f"Use another --out{own}, or pass --allow-foreign to keep them and append anyway.",
        )
    notes = made_notes(spec, scan)
    return BatchPlan(spec, index.count, scan.done, scan, input_path, notes=notes, foreign=foreign)


def check_requests(spec: BatchSpec, index: InputIndex) -> None:
    """A Batch API input is sent as it is: flags that would change its requests, and bodies
    naming another model than the batch's, are refused (exit 2, nothing sent)."""
    where = spec.input_path
    if spec.text_flags:
        raise UsageError(
            f"{', '.join(spec.text_flags)}: {where} holds OpenAI Batch API requests, sent as "
            "they are",
            "Drop the flag and put what it set into the request bodies (e.g. max_tokens); "
            "nothing was sent.",
        )
    other = next(((m, line) for m, line in index.models if m != spec.model), None)
    if other is not None:
        model, line = other
        raise InputError(
            f"{where} line {line}: the body names model {model!r}, but this batch is for "
            f"{spec.model!r} (the target's model, which the stages before it calibrated)",
            f"Pass --model {model} if the server serves it (its own gates then apply), or "
            'drop "model" from the bodies; nothing was sent.',
        )


def _changes(now: Settings, old: Settings | None) -> list[str]:
    if old is None:  # the run's first line, which holds them in full, was lost (torn)
        return ["settings the journal no longer holds in full"]
    return now.changes_from(old)


def made_notes(spec: BatchSpec, scan: OutputScan) -> tuple[str, ...]:
    """Refuse (exit 2) a resume whose kept results were made with other settings, unless
    --allow-mixed; the notes to show: results kept as they are, items edited since."""
    assert spec.out_path is not None
    now = spec.settings
    other = [(n, scan.settings.get(fp)) for fp, n in scan.made.items() if fp and fp != now.fp]
    changes = [(n, c) for n, old in other if (c := _changes(now, old))]
    notes = []
    if changes and not spec.allow_mixed:
        count, what = max(changes, key=lambda found: found[0])
        others = sum(n for n, _ in changes) - count
        more = f", and {others} more with other settings" if others else ""
        raise InputError(
            f"{spec.out_path} holds {count} result(s) made with other settings: "
            f"{'; '.join(what)}{more}",
            f"Give another --out for a run with these settings, or pass {MIXED_FLAG} to keep "
            "those results and run only the rest with these (the output then mixes both); "
            "nothing was sent.",
        )
    if changes:
        notes.append(
            f"{sum(n for n, _ in changes)} result(s) in {spec.out_path} were made with other "
            f"settings ({'; '.join(changes[0][1])}); kept, as {MIXED_FLAG} asks"
        )
    if scan.made.get(None):
        notes.append(
            f"{scan.made[None]} result(s) in {spec.out_path} were written by an older calibrate "
            "that did not record what produced them: kept as they are"
        )
    if scan.edited:
        example = next(iter(scan.edited))
        notes.append(
            f"{len(scan.edited)} item(s) changed in {spec.input_path} since their result "
            f"(e.g. id {example!r}): they run again"
        )
    return tuple(notes)


def lock_path(out_path: Path) -> Path:
    """``out.jsonl`` → ``out.jsonl.lock``, beside the file it names (symlinks followed)."""
    real = out_path.resolve()
    return real.with_name(real.name + ".lock")


@contextmanager
def open_batch(spec: BatchSpec) -> Iterator[BatchPlan]:
    """The plan with --out locked, repaired and open for appending; released afterwards.

    Order matters: the input is validated before the lock (bad input leaves no trace), the
    output is scanned under the lock (no other run appends meanwhile), and it is opened before
    anything is sent (an unwritable --out is exit 2, not a failure after the run).
    """
    with readable_twice(spec.input_path) as readable:
        before = stamp(readable) if readable == spec.input_path else None
        index_only = spec.sample is not None or spec.out_path is None
        if index_only:
            yield replace(plan_batch(spec, readable), input_stamp=before)
            return
        assert spec.out_path is not None
        check_output_path(spec.out_path, spec.input_path)
        index = index_input(readable, spec.input_path)  # before the lock: bad input, no trace
        if index.format == "openai_batch":
            check_requests(spec, index)
        created = not os.path.lexists(spec.out_path)  # locking it creates it
        lock = ExclusiveLock.acquire(
            lock_path(spec.out_path), f"--out {spec.out_path}", guards=spec.out_path
        )
        try:
            plan = _plan(spec, index, readable)
            assert plan.scan is not None
            writer = _open_output(plan.scan, spec.fsync)
            try:
                yield replace(plan, writer=writer, input_stamp=before)
            except BaseException:
                writer.close_quietly()
                if created:  # refused before any line (other weights, no server): no trace
                    _drop_if_empty(spec.out_path)
                raise
            finally:
                writer.close_quietly()
        finally:
            lock.release()


def _drop_if_empty(path: Path) -> None:
    """Remove ``path`` if it holds nothing (this run created it and wrote no line)."""
    try:
        if path.stat().st_size == 0:
            path.unlink()
    except OSError:
        pass  # gone already, or not ours to remove: an empty file harms nothing


def _open_output(scan: OutputScan, fsync: bool) -> JsonlWriter:
    try:
        repair_tail(scan)
        return JsonlWriter(scan.path, fsync=fsync)
    except OSError as exc:
        raise InputError(
            f"cannot write to --out {scan.path}: {exc.strerror or exc}",
            "Choose a writable place for the results; nothing was sent.",
        ) from exc
