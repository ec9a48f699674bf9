"""Resuming a batch: which ids the output file already holds, read fast and crash-tolerant.

Every line we write starts ``{"id":…,"ok":…,`` and ends ``"attempts":N}``; the scan reads
those with one regular expression over large blocks (C speed) and falls back to ``json.loads``
only for blocks holding other lines. Lines end at ``\n`` only (never ``splitlines``). A torn
last line (a crash mid-write) is cut off before anything is appended, under the output's lock,
so the file stays valid JSONL; a file that is not JSONL at all is refused, never appended to.
"""

from __future__ import annotations

import os
import re
import stat
from collections import Counter
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calibrate import json_text
from calibrate.errors import InputError
from calibrate.io.bounded import MAX_LINE_BYTES, TooLong, mib
from calibrate.io.journal.made import FP_FIELD, MADE_FIELD, SETTINGS_MARK, Settings
from calibrate.io.tasks import ItemId, id_twin

BLOCK_BYTES = 8 * 1024 * 1024
OUR_PREFIX = b'{"id":'
_UNREADABLE = object()

# One result line as batch writes it, whole: a line cut off by a kill does not end in
# "attempts":N} and is never taken for a result (resume and export read journals alike).
# Its groups: the id's token, ok, the item's digest and the settings' fingerprint
# (io/journal/made.py; lines written before they were recorded have neither).
RESULT_LINE = re.compile(
    rb'^\{"id":("(?:[^"\\\n]|\\.)*"|-?\d+),"ok":(true|false),'
    rb'(?:"input_fp":"([0-9a-f]{16})",)?'
    rb'(?:[^\n]*,"made":"([0-9a-f]{16})"|[^\n]*),"attempts":\d+\}$',
    re.MULTILINE,
)
Known = Container[ItemId] | Mapping[ItemId, int]  # the input's ids, or its ids' digests


@dataclass
class OutputScan:
    """What an existing output file says: finished ids, failed ones, foreign and torn lines."""

    path: Path
    done: set[ItemId] = field(default_factory=set)
    failed: set[ItemId] = field(default_factory=set)  # failed lines (retried unless also done)
    lines: int = 0
    unreadable: int = 0  # torn or garbled lines, skipped (earlier crashes)
    foreign: int = 0
    foreign_example: str = ""
    records: int = 0  # lines that are JSON objects, ours or not
    not_results: int = 0  # objects with an id but no "ok": not a results file
    not_result_example: str = ""
    torn_tail: bool = False  # the last line is the start of one of our records: cut it off
    alien_tail: bool = False  # the last line is something else: not our file
    tail_offset: int = 0  # where the unterminated last line starts
    needs_newline: bool = False
    # what produced the results (made.py): ok lines per settings fingerprint (None: not
    # recorded), the settings of each fingerprint seen in full; ok lines of an item edited since
    made: Counter[str | None] = field(default_factory=Counter)
    settings: dict[str, Settings] = field(default_factory=dict)
    changed: set[ItemId] = field(default_factory=set)

    def not_jsonl(self) -> str | None:
        """Why this file is not a results journal we may append to, or None."""
        if self.alien_tail:
            return "its last line is neither a JSON record nor the start of one"
        if self.not_results:
            return self.not_result_example
        if self.unreadable and (self.records == 0 or self.unreadable > self.records):
            return f"{self.unreadable} of {self.lines} lines are not JSON"
        return None

    @property
    def retry(self) -> int:
        """Ids with failed lines and no ok line: tried again this run."""
        return len(self.failed - self.done)

    @property
    def edited(self) -> set[ItemId]:
        """Ids whose only ok results are of an earlier text of the item: they run again."""
        return self.changed - self.done

    def _record(
        self, item_id: ItemId, ok: bool, fp: bytes | None, made: bytes | None, known: Known | None
    ) -> None:
        if known is not None and item_id not in known:
            self.foreign += 1
            if not self.foreign_example:
                twin = id_twin(item_id)
                self.foreign_example = f"id {item_id!r}" + (
                    f", where the input has {twin!r}: an id's type is part of it"
                    if twin is not None and twin in known
                    else ""
                )
            return
        if not ok:
            self.failed.add(item_id)
        elif fp is not None and isinstance(known, Mapping) and int(fp, 16) != known[item_id]:
            self.changed.add(item_id)
        else:
            self.done.add(item_id)
            self.made[made.decode() if made else None] += 1

    def _settings_of(self, raw: bytes) -> None:
        """Learn the settings a run's first line holds in full."""
        settings = Settings.from_line(_loads(raw))
        if settings is not None:
            self.settings[settings.fp] = settings

    def _line(self, raw: bytes, line: int, known: Known | None) -> None:
        """The slow path for one line that the fast expression did not recognise."""
        if not raw.strip():
            return
        obj = _loads(raw)
        if obj is _UNREADABLE:
            self.unreadable += 1
            return
        self.records += isinstance(obj, dict)
        if isinstance(obj, dict) and "id" in obj and not isinstance(obj.get("ok"), bool):
            self.not_results += 1  # e.g. the tasks file itself: id and text, no verdict
            if not self.not_result_example:
                self.not_result_example = f"line {line} has an id but no ok/failed verdict"
            return
        item_id = obj.get("id") if isinstance(obj, dict) else None
        if isinstance(item_id, bool) or not isinstance(item_id, str | int):
            self.foreign += 1
            if not self.foreign_example:
                self.foreign_example = f"line {line} is not a batch result"
            return
        fp, made = obj.get(FP_FIELD), obj.get(MADE_FIELD)
        fp_bytes = fp.encode() if isinstance(fp, str) and _FP.fullmatch(fp) else None
        made_bytes = made.encode() if isinstance(made, str) and _FP.fullmatch(made) else None
        settings = Settings.from_line(obj)
        if settings is not None:
            self.settings[settings.fp] = settings
        self._record(item_id, obj.get("ok") is True, fp_bytes, made_bytes, known)


_FP = re.compile("[0-9a-f]{16}")


def scan_output(path: Path, known: Known | None = None) -> OutputScan:
    """Read ``path`` (absent = empty); ids not in ``known`` are counted as foreign."""
    scan = OutputScan(path)
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return scan
    except OSError as exc:
        raise InputError(f"cannot read the output file {path}: {exc.strerror or exc}") from exc
    with handle:
        carry = b""
        while True:
            data = handle.read(BLOCK_BYTES)
            if not data:
                break
            data = carry + data
            cut = data.rfind(b"\n") + 1
            block, carry = data[:cut], data[cut:]
            if block:
                _scan_block(scan, block, known)
            if len(carry) > MAX_LINE_BYTES:
                raise line_too_long(path, scan.lines + 1)
        scan.tail_offset = handle.tell() - len(carry)
    if carry:
        tail = _loads(carry)
        if isinstance(tail, dict) and "id" in tail:  # the crash came between record and newline
            scan.needs_newline = True
            scan._line(carry, scan.lines + 1, known)
            scan.lines += 1
        elif not carry.strip() or carry.startswith(OUR_PREFIX) or OUR_PREFIX.startswith(carry):
            scan.torn_tail = True
        else:
            scan.alien_tail = True
    return scan


def line_too_long(path: Path, line: int) -> TooLong:
    """A journal line past the bound (exit 2): read no further."""
    return TooLong(
        f"{path} line {line}: longer than {mib(MAX_LINE_BYTES)} without a newline: "
        "not a results journal of calibrate batch",
        "Give the --out file calibrate batch wrote (or another --out for a new run).",
    )


def _loads(raw: bytes) -> Any:
    """The JSON value of one line, or ``_UNREADABLE`` (torn, not UTF-8, absurdly nested)."""
    try:
        return json_text.loads(raw)
    except ValueError:
        return _UNREADABLE


def _scan_block(scan: OutputScan, block: bytes, known: Known | None) -> None:
    first_line = scan.lines + 1
    lines = block.count(b"\n")
    scan.lines += lines
    found = RESULT_LINE.findall(block)
    if len(found) == lines:
        scan.records += lines
        done, failed, record = scan.done, scan.failed, scan._record
        digests = known if isinstance(known, Mapping) else None
        made_by: list[bytes] = []  # counted once per block (C speed)
        for token, ok, fp, made in found:
            if token[0] == 34:  # a string id: no escapes is the common case
                item_id: ItemId = (
                    token[1:-1].decode("utf-8") if b"\\" not in token else json_text.loads(token)
                )
            else:
                item_id = int(token)
            if known is not None and item_id not in known:
                record(item_id, ok == b"true", fp or None, made or None, known)  # foreign
            elif ok != b"true":
                failed.add(item_id)
            elif fp and digests is not None and int(fp, 16) != digests[item_id]:
                scan.changed.add(item_id)
            else:
                done.add(item_id)
                made_by.append(made)
        for made, n in Counter(made_by).items():
            scan.made[made.decode() if made else None] += n
        if SETTINGS_MARK in block:  # a run's first line: its settings in full
            for raw in block.split(b"\n"):
                if SETTINGS_MARK in raw:
                    scan._settings_of(raw)
        return
    for offset, raw in enumerate(block.split(b"\n")[:-1]):
        match = RESULT_LINE.match(raw)
        if match is None:
            scan._line(raw, first_line + offset, known)
            continue
        token = match.group(1)
        item_id = json_text.loads(token) if token[0] == 34 else int(token)
        scan.records += 1
        scan._record(item_id, match.group(2) == b"true", match.group(3), match.group(4), known)
        if SETTINGS_MARK in raw:
            scan._settings_of(raw)


def end_with_newline(path: Path) -> None:
    """Terminate a whole last record so the next appended one starts on a line of its own."""
    with path.open("ab") as handle:
        handle.write(b"\n")


def repair_tail(scan: OutputScan) -> None:
    """Before appending (under the lock): cut a torn last line off, or end a whole one."""
    if scan.torn_tail:
        os.truncate(scan.path, scan.tail_offset)
    elif scan.needs_newline:
        end_with_newline(scan.path)


def check_output_path(out: Path, input_path: Path) -> None:
    """Refuse an --out that is --input itself (any link to it) or not a regular file (exit 2)."""
    try:
        found = out.stat()
    except FileNotFoundError:
        return
    except OSError as exc:
        raise InputError(f"cannot use --out {out}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(found.st_mode):
        raise InputError(
            f"--out {out} is not a regular file (a FIFO, device or folder)",
            "Give a path for a results file (.jsonl); it is created if absent.",
        )
    try:
        source = input_path.stat()
    except OSError:
        return  # reading it will say what is wrong
    if (found.st_dev, found.st_ino) == (source.st_dev, source.st_ino):
        raise InputError(
            f"--out {out} is the same file as --input {input_path} (a link to it)",
            "Write the results elsewhere; the tasks file is never written to.",
        )


def check_journal(scan: OutputScan) -> None:
    """Refuse to append to an existing file that is not a JSONL results file (exit 2)."""
    reason = scan.not_jsonl()
    if reason is not None:
        raise InputError(
            f"--out {scan.path} exists and is not a JSONL results file ({reason})",
            "Give another --out (an existing one must be a results file of calibrate batch).",
        )
