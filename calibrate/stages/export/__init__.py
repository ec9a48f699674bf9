"""One clean result per input id, in input order, from append-only batch journals (and shards).

The journal (``--out``) stays append-only — that is what makes kill -9 safe — so a retried id
has several lines. The final file has exactly one line per input id, in input order: the
**last ok** result if the id has one (a later failure does not undo a success), else its last
failure, else a ``not_run`` line. The ids without an ok result go to a separate list.

Memory is bounded by the id set, never the text: pass 1 maps each id to where its winning line
starts (journal number, byte offset, ok packed in one int); pass 2 streams the input in order
and reads each winning line back with a seek. Files are written to a temp file and renamed.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from calibrate.errors import InputError, UsageError, unwritten
from calibrate.io import bounded
from calibrate.io.atomic import remove_stale_temps
from calibrate.io.bounded import MAX_LINE_BYTES
from calibrate.io.jobs.openai_batch import JobFormat
from calibrate.io.jobs.shard import Shard
from calibrate.io.journal.made import Settings
from calibrate.io.jsonl import encode_line
from calibrate.io.output_paths import Named, check_outputs
from calibrate.io.tasks import index_input, read_tasks, readable_twice
from calibrate.stages.export.formats import Format, JsonlFinal, format_of, open_final
from calibrate.stages.export.scan import MAX_JOURNALS, Pass1, loads, open_journal, unpack

STALE = "its result(s) in the journal are for an earlier text of this item: rerun calibrate batch"


@dataclass(frozen=True)
class ExportResult:
    to_path: Path
    failed_path: Path
    total: int
    ok: int
    failed: int  # has result lines, none ok
    not_run: int  # no line at all
    foreign: int  # journal lines whose id is not in the input (or not in this shard)
    journal_lines: int
    seconds: float
    changed: int = 0  # ids whose only results are of an earlier text of the item (not run)
    made: tuple[tuple[int, Settings | None], ...] = ()  # results per settings, most first
    lines: str = "results"  # what the final file's lines are: "results", or "Batch API output"
    not_results: int = 0  # journal lines that are no result (nor a run's settings): skipped

    @property
    def mixed(self) -> str | None:
        """How the results' settings differ ("3 of 8 … with --prompt 'A:' (now …)"), or None."""
        if len(self.made) < 2:
            return None
        (most, usual), rest = self.made[0], self.made[1:]
        others = sum(n for n, _ in rest)
        other = rest[0][1]
        if usual is None or other is None:
            return (
                f"{others} of {most + others} results were made with other settings, or by an "
                "older calibrate that did not record them"
            )
        what = "; ".join(usual.changes_from(other, "the rest")) or "the servers"
        return f"{others} of {most + others} results were made with other settings ({what})"

    @property
    def passed(self) -> bool:
        return self.ok == self.total

    def to_json(self) -> dict[str, Any]:
        return {
            "to": str(self.to_path),
            "failed_list": str(self.failed_path),
            "total": self.total,
            "ok": self.ok,
            "failed": self.failed,
            "not_run": self.not_run,
            "foreign": self.foreign,
            "journal_lines": self.journal_lines,
            "seconds": round(self.seconds, 3),
            "rule": "last ok result per id, else its last failure",
            "changed": self.changed,
            "mixed_settings": self.mixed,
            "lines": self.lines,
            "not_results": self.not_results,
        }


def failed_path_for(to_path: Path) -> Path:
    """``final.jsonl`` → ``final.failed.jsonl`` (always JSONL), beside it."""
    return to_path.with_name(f"{to_path.stem}.failed.jsonl")


def check_export(
    to_path: Path, failed_path: Path | None, flag: str, reads: Sequence[Named] = ()
) -> Format:
    """Before anything runs: the format is known, and neither output is a special file, a file
    read (``reads``: the input, the journals…) or the other output (exit 2 otherwise)."""
    fmt = format_of(to_path, flag)
    failed = (
        ("--failed", failed_path) if failed_path else ("the failed list", failed_path_for(to_path))
    )
    check_outputs([(flag, to_path), failed], reads)
    return fmt


def export_final(
    input_path: Path,
    journals: Sequence[Path],
    to_path: Path,
    *,
    failed_path: Path | None = None,
    shard: Shard | None = None,
    raw_csv: bool = False,
    input_name: Path | None = None,
) -> ExportResult:
    """Write the final file and the failed list; the journals are only read.

    CSV text cells that a spreadsheet would run as formulas get a ``'`` unless ``raw_csv``.
    A pipe given as the input or a journal is copied once (bounded, unnamed) and read there;
    ``input_name`` is the input's name in messages when ``input_path`` is such a copy already.
    """
    start = time.perf_counter()
    reads = [("--input", input_path), *(("--out", journal) for journal in journals)]
    fmt = check_export(to_path, failed_path, "--to", reads)
    failed_path = failed_path or failed_path_for(to_path)
    if not journals or len(journals) > MAX_JOURNALS:
        raise InputError(f"give 1 to {MAX_JOURNALS} journals (--out), got {len(journals)}")
    _distinct(journals)
    with contextlib.ExitStack() as copies:
        source = copies.enter_context(readable_twice(input_path))
        readable = [copies.enter_context(readable_journal(path)) for path in journals]
        job = _Job(source, input_name or input_path, shard, to_path, failed_path, fmt, raw_csv)
        found = _export(job, readable, journals)
    ok, failed, not_run = found.counts
    return ExportResult(
        to_path,
        failed_path,
        len(found.winners),
        ok,
        failed,
        not_run,
        found.foreign,
        found.lines,
        time.perf_counter() - start,
        changed=len(found.stale - {i for i, w in found.winners.items() if w is not None}),
        made=tuple(found.made()),
        lines="Batch API output" if found.api_lines else "results",
        not_results=found.not_results,
    )


@dataclass(frozen=True)
class _Job:
    """One export: the input to read (and its name), the shard, the outputs and their format."""

    source: Path
    input_name: Path
    shard: Shard | None
    to_path: Path
    failed_path: Path
    fmt: Format
    raw_csv: bool
    input_format: JobFormat = "tasks"

    @property
    def api_lines(self) -> bool:
        """A .jsonl final of a Batch API input holds Batch API output lines."""
        return self.fmt == "jsonl" and self.input_format == "openai_batch"


def _distinct(journals: Sequence[Path]) -> None:
    """Exit 2 when one journal file is given twice (its lines would be counted twice)."""
    seen: dict[tuple[int, int], Path] = {}
    for path in journals:
        try:
            found = os.stat(path)
        except OSError:  # absent: reading it says so
            continue
        if not stat.S_ISREG(found.st_mode):
            continue  # a pipe is read once, where it is read
        first = seen.get((found.st_dev, found.st_ino))
        seen.setdefault((found.st_dev, found.st_ino), path)
        if first is not None:
            raise UsageError(
                f"--out {path} is the same journal as --out {first}: its lines would count twice",
                "Give each journal once; nothing was written.",
            )


def readable_journal(path: Path) -> contextlib.AbstractContextManager[Path]:
    """A journal as a file that can be read twice (seeked into): a pipe is copied first."""
    return bounded.readable_twice(path, "the journal", rule=JOURNAL_RULE, hint=JOURNAL_HINT)


JOURNAL_RULE = "a journal has one result per line"
JOURNAL_HINT = "Give the --out file(s) of calibrate batch."


def _export(job: _Job, readable: list[Path], journals: Sequence[Path]) -> Pass1:
    """Both passes; what pass 1 found, ``counts`` set by pass 2."""
    index = index_input(job.source, job.input_name)
    job = replace(job, input_format=index.format)
    digests = index.ids
    if job.shard is not None and job.shard.count > 1:
        digests = {i: fp for i, fp in digests.items() if job.shard.holds(i)}
    found = Pass1(digests)
    found.api_lines = job.api_lines
    del digests
    for number, (journal, shown) in enumerate(zip(readable, journals, strict=True)):
        found.scan(journal, shown, number)
    handles = [open_journal(path) for path in readable]
    try:
        found.counts = _write(job, found, handles)
    except BaseException as exc:  # Ctrl-C, SIGTERM, SIGHUP at any point, even while a file opens
        for path in (job.to_path, job.failed_path):
            remove_stale_temps(path, own=True)
        if isinstance(exc, OSError):  # a full disk: exit 1 naming the file, neither left
            exc.filename = f"{job.to_path} (and {job.failed_path.name})"  # not a temp file's name
            raise unwritten(exc, "neither it nor its failed list was written") from exc
        raise
    finally:
        for handle in handles:
            handle.close()
    return found


def _write(job: _Job, found: Pass1, handles: list[BinaryIO]) -> tuple[int, int, int]:
    """Pass 2: the input in order, each id's winning line read back; (ok, failed, not run)."""
    shard, winners = job.shard, found.winners
    ok = failed = not_run = 0
    with (
        open_final(job.to_path, job.fmt, raw_csv=job.raw_csv, api=job.api_lines) as final,
        JsonlFinal(job.failed_path) as failures,
    ):
        for task in read_tasks(job.source, job.input_name):
            if shard is not None and shard.count > 1 and not shard.holds(task.id):
                continue
            packed = winners.get(task.id)
            if packed is None:
                not_run += 1
                why = STALE if task.id in found.stale else "no result in the journal(s)"
                line = {"id": task.id, "ok": False, "error": {"kind": "not_run", "message": why}}
                raw = encode_line(line).rstrip(b"\n")
                final.write(raw, line)
                failures.write(
                    encode_line({"id": task.id, "status": "not_run"}).rstrip(b"\n"), None
                )
                continue
            offset, number, is_ok = unpack(packed)
            handle = handles[number]
            handle.seek(offset)
            raw = handle.readline(MAX_LINE_BYTES + 1).rstrip(b"\n")
            record = loads(raw) if final.needs_record or not is_ok else None
            final.write(raw, record)
            if is_ok:
                ok += 1
                continue
            failed += 1
            error = (record or {}).get("error")
            if not isinstance(error, dict):  # a hand-edited line: its text is the message
                error = {"message": error if isinstance(error, str) else None}
            entry = {
                "id": task.id,
                "status": "failed",
                "kind": error.get("kind"),
                "message": error.get("message"),
            }
            failures.write(encode_line(entry).rstrip(b"\n"), None)
        failures.ready()  # both written out before either is renamed into place
        final.ready()
        failures.publish()
        final.publish()
    return ok, failed, not_run
