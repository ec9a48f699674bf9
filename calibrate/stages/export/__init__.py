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

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from calibrate import json_text
from calibrate.errors import InputError, unwritten
from calibrate.io.atomic import remove_stale_temps
from calibrate.io.jsonl import encode_line
from calibrate.io.output_paths import Named, check_outputs
from calibrate.io.resume import RESULT_LINE
from calibrate.io.tasks import ItemId, Shard, index_input, read_tasks
from calibrate.stages.export.formats import Format, JsonlFinal, format_of, open_final

BLOCK_BYTES = 8 * 1024 * 1024
JOURNAL_BITS = 10  # up to 1024 journals (shards) in one export
MAX_JOURNALS = 1 << JOURNAL_BITS


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
) -> ExportResult:
    """Write the final file and the failed list; the journals are only read.

    CSV text cells that a spreadsheet would run as formulas get a ``'`` unless ``raw_csv``.
    """
    start = time.perf_counter()
    reads = [("--input", input_path), *(("--out", journal) for journal in journals)]
    fmt = check_export(to_path, failed_path, "--to", reads)
    failed_path = failed_path or failed_path_for(to_path)
    if not journals or len(journals) > MAX_JOURNALS:
        raise InputError(f"give 1 to {MAX_JOURNALS} journals (--out), got {len(journals)}")
    known: set[ItemId] = index_input(input_path).ids
    if shard is not None and shard.count > 1:
        known = {item_id for item_id in known if shard.holds(item_id)}
    # one table of the input's ids (the same key objects): None until a line is found
    winners: dict[ItemId, int | None] = dict.fromkeys(known)
    del known
    lines = foreign = 0
    for number, journal in enumerate(journals):
        read, alien = _scan_journal(journal, number, winners)
        lines, foreign = lines + read, foreign + alien
    total = len(winners)
    handles = [_open_journal(path) for path in journals]
    try:
        counts = _write(input_path, shard, winners, handles, to_path, failed_path, fmt, raw_csv)
    except BaseException as exc:  # Ctrl-C, SIGTERM, SIGHUP at any point, even while a file opens
        for path in (to_path, failed_path):
            remove_stale_temps(path, own=True)
        if isinstance(exc, OSError):  # a full disk: exit 1 naming the file, neither left
            exc.filename = f"{to_path} (and {failed_path.name})"  # not a temp file's name
            raise unwritten(exc, "neither it nor its failed list was written") from exc
        raise
    finally:
        for handle in handles:
            handle.close()
    ok, failed, not_run = counts
    return ExportResult(
        to_path,
        failed_path,
        total,
        ok,
        failed,
        not_run,
        foreign,
        lines,
        time.perf_counter() - start,
    )


def _open_journal(path: Path) -> BinaryIO:
    try:
        return path.open("rb")
    except OSError as exc:
        raise InputError(
            f"cannot read the journal {path}: {exc.strerror or exc}",
            "Give the --out file(s) of calibrate batch.",
        ) from exc


def _keep(winners: dict[ItemId, int | None], item_id: ItemId, packed: int) -> None:
    """The last ok line wins; a failure only replaces a failure (bit 0 is ok)."""
    old = winners[item_id]
    if old is None or packed & 1 or not old & 1:
        winners[item_id] = packed


def _scan_journal(path: Path, number: int, winners: dict[ItemId, int | None]) -> tuple[int, int]:
    """Pass 1 over one journal: (lines read, foreign lines)."""
    lines = foreign = 0
    with _open_journal(path) as handle:
        base = 0  # file offset of the block's first byte
        first_line = 1  # line number of the block's first line
        carry = b""
        while data := handle.read(BLOCK_BYTES):
            data = carry + data
            cut = data.rfind(b"\n") + 1
            block, carry = data[:cut], data[cut:]
            for match_start, token, ok in _records(block, path, first_line):
                lines += 1
                item_id = _id_of(token)
                if item_id is None or isinstance(item_id, bool) or item_id not in winners:
                    foreign += 1
                    continue
                _keep(
                    winners,
                    item_id,
                    ((base + match_start) << (JOURNAL_BITS + 1)) | (number << 1) | (ok == b"true"),
                )
            base += len(block)
            first_line += block.count(b"\n")
        if carry.strip():  # a last line without its newline: whole (kept) or torn (ignored)
            for match_start, token, ok in _records(carry + b"\n", path, first_line):
                item_id = _id_of(token)
                if item_id is not None and not isinstance(item_id, bool) and item_id in winners:
                    lines += 1
                    _keep(
                        winners,
                        item_id,
                        ((base + match_start) << (JOURNAL_BITS + 1))
                        | (number << 1)
                        | (ok == b"true"),
                    )
    return lines, foreign


def _records(block: bytes, path: Path, first_line: int) -> list[tuple[int, bytes, bytes]]:
    """(offset, id token, ok) of each result line of ``block`` (lines end at b"\\n").

    A result whose id is neither a string nor an integer (a list, an object, ``1.0``, which
    must not be taken for ``1``) is an InputError naming the journal and the line.
    """
    found = [(m.start(), m.group(1), m.group(2)) for m in RESULT_LINE.finditer(block)]
    if len(found) == block.count(b"\n"):
        return found
    out: list[tuple[int, bytes, bytes]] = []  # some lines are not ours verbatim: parse each
    offset = 0
    for number, raw in enumerate(block.split(b"\n")[:-1], first_line):
        match = RESULT_LINE.match(raw)
        if match is not None:
            out.append((offset, match.group(1), match.group(2)))
        else:
            obj = _loads(raw)
            if isinstance(obj, dict) and isinstance(obj.get("ok"), bool) and "id" in obj:
                item_id = obj["id"]
                if isinstance(item_id, bool) or not isinstance(item_id, str | int):
                    shown = json.dumps(item_id, ensure_ascii=False)
                    raise InputError(
                        f"{path} line {number}: the result's 'id' must be a string or an "
                        f"integer, got {shown[:60]}{'…' if len(shown) > 60 else ''}",
                        "Give the journal(s) calibrate batch wrote (--out); fix or drop that line.",
                    )
                token = json.dumps(obj["id"], ensure_ascii=False).encode("utf-8")
                out.append((offset, token, b"true" if obj["ok"] else b"false"))
        offset += len(raw) + 1
    return out


def _id_of(token: bytes) -> ItemId | None:
    """The id of a token; None when it cannot be one of the input's (an integer too long)."""
    if token[:1] == b'"':
        return token[1:-1].decode("utf-8") if b"\\" not in token else json_text.loads(token)
    try:
        value: Any = json_text.loads(token)
    except ValueError:  # more digits than Python reads: no input id is like it
        return None
    return value  # type: ignore[no-any-return]


def _loads(raw: bytes) -> Any:
    try:
        return json_text.loads(raw)
    except ValueError:
        return None


def _write(
    input_path: Path,
    shard: Shard | None,
    winners: dict[ItemId, int | None],
    handles: list[BinaryIO],
    to_path: Path,
    failed_path: Path,
    fmt: Format,
    raw_csv: bool,
) -> tuple[int, int, int]:
    """Pass 2: the input in order, each id's winning line read back; (ok, failed, not run)."""
    ok = failed = not_run = 0
    mask = MAX_JOURNALS - 1
    with open_final(to_path, fmt, raw_csv=raw_csv) as final, JsonlFinal(failed_path) as failures:
        for task in read_tasks(input_path):
            if shard is not None and shard.count > 1 and not shard.holds(task.id):
                continue
            packed = winners.get(task.id)
            if packed is None:
                not_run += 1
                line = {
                    "id": task.id,
                    "ok": False,
                    "error": {"kind": "not_run", "message": "no result in the journal(s)"},
                }
                raw = encode_line(line).rstrip(b"\n")
                final.write(raw, line)
                failures.write(
                    encode_line({"id": task.id, "status": "not_run"}).rstrip(b"\n"), None
                )
                continue
            handle = handles[(packed >> 1) & mask]
            handle.seek(packed >> (JOURNAL_BITS + 1))
            raw = handle.readline().rstrip(b"\n")
            record = _loads(raw) if final.needs_record or not packed & 1 else None
            final.write(raw, record)
            if packed & 1:
                ok += 1
                continue
            failed += 1
            error = (record or {}).get("error") or {}
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
