"""Resuming a batch: which ids the output file already holds, read fast and crash-tolerant.

Every line we write starts ``{"id":…,"ok":…,`` and ends ``"attempts":N}``; the scan reads
those with one regular expression over large blocks (C speed) and falls back to ``json.loads``
only for blocks holding other lines. A torn last line (a crash mid-write) is ignored, and the
file gets a newline before anything is appended, so a new record never fuses with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calibrate.errors import InputError
from calibrate.stages.batch_input import ItemId

BLOCK_BYTES = 8 * 1024 * 1024

_OURS = re.compile(
    rb'^\{"id":("(?:[^"\\\n]|\\.)*"|-?\d+),"ok":(true|false),[^\n]*"attempts":\d+\}$',
    re.MULTILINE,
)


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
    torn_tail: bool = False
    needs_newline: bool = False

    @property
    def retry(self) -> int:
        """Ids with failed lines and no ok line: tried again this run."""
        return len(self.failed - self.done)

    def _record(self, item_id: ItemId, ok: bool, known: Container[ItemId] | None) -> None:
        if known is not None and item_id not in known:
            self.foreign += 1
            if not self.foreign_example:
                self.foreign_example = f"id {item_id!r}"
            return
        (self.done if ok else self.failed).add(item_id)

    def _line(self, raw: bytes, line: int, known: Container[ItemId] | None) -> None:
        """The slow path for one line that the fast expression did not recognise."""
        if not raw.strip():
            return
        try:
            obj: Any = json.loads(raw)
        except ValueError:
            self.unreadable += 1
            return
        item_id = obj.get("id") if isinstance(obj, dict) else None
        if isinstance(item_id, bool) or not isinstance(item_id, str | int):
            self.foreign += 1
            if not self.foreign_example:
                self.foreign_example = f"line {line} is not a batch result"
            return
        self._record(item_id, obj.get("ok") is True, known)


def scan_output(path: Path, known: Container[ItemId] | None = None) -> OutputScan:
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
    if carry:
        scan.needs_newline = True
        try:
            tail: Any = json.loads(carry)
            complete = isinstance(tail, dict) and "id" in tail
        except ValueError:
            complete = False
        if complete:  # the crash came between the record and its newline: it is whole
            scan._line(carry, scan.lines + 1, known)
            scan.lines += 1
        else:
            scan.torn_tail = True
    return scan


def _scan_block(scan: OutputScan, block: bytes, known: Container[ItemId] | None) -> None:
    first_line = scan.lines + 1
    lines = block.count(b"\n")
    scan.lines += lines
    found = _OURS.findall(block)
    if len(found) == lines:
        done, failed, record = scan.done, scan.failed, scan._record
        for token, ok in found:
            if token[0] == 34:  # a string id: no escapes is the common case
                item_id: ItemId = (
                    token[1:-1].decode("utf-8") if b"\\" not in token else json.loads(token)
                )
            else:
                item_id = int(token)
            if known is None or item_id in known:
                (done if ok == b"true" else failed).add(item_id)
            else:
                record(item_id, ok == b"true", known)
        return
    for offset, raw in enumerate(block.split(b"\n")[:-1]):
        match = _OURS.match(raw)
        if match is None:
            scan._line(raw, first_line + offset, known)
            continue
        token = match.group(1)
        item_id = json.loads(token) if token[0] == 34 else int(token)
        scan._record(item_id, match.group(2) == b"true", known)


def end_with_newline(path: Path) -> None:
    """Terminate a torn last line so the next appended record starts on a line of its own."""
    with path.open("ab") as handle:
        handle.write(b"\n")
