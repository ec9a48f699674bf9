"""Export's pass 1: where each input id's winning line is, over every journal.

The winner of an id is its **last ok** line if it has one (a later failure does not undo a
success), else its last failure. It is kept packed in one int — its byte offset, the journal's
number and whether it is ok — so memory is bounded by the id set, never the text. Lines are
read in blocks (one regular expression at C speed), each under the line bound.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from calibrate import json_text
from calibrate.errors import InputError
from calibrate.io.bounded import MAX_LINE_BYTES, open_read
from calibrate.io.journal.made import FP_FIELD, MADE_FIELD, SETTINGS_MARK, Settings
from calibrate.io.journal.scan import RESULT_LINE, line_too_long
from calibrate.io.tasks import ItemId

BLOCK_BYTES = 8 * 1024 * 1024
JOURNAL_BITS = 10  # up to 1024 journals (shards) in one export
MAX_JOURNALS = 1 << JOURNAL_BITS

Winners = dict[ItemId, int | None]  # id → packed winning line (None: no line yet)


def open_journal(path: Path) -> BinaryIO:
    return open_read(path, "the journal", "Give the --out file(s) of calibrate batch.")


MADE_BITS = 8  # up to 255 settings told apart in one export (0: not recorded)


def pack(offset: int, number: int, ok: bool, made: int = 0) -> int:
    return (((offset << MADE_BITS) | made) << (JOURNAL_BITS + 1)) | (number << 1) | ok


def unpack(packed: int) -> tuple[int, int, bool]:
    """(byte offset, journal number, ok) of a packed winner."""
    high = packed >> (JOURNAL_BITS + 1)
    return high >> MADE_BITS, (packed >> 1) & (MAX_JOURNALS - 1), bool(packed & 1)


def made_of(packed: int) -> int:
    return (packed >> (JOURNAL_BITS + 1)) & ((1 << MADE_BITS) - 1)


@dataclass
class Pass1:
    """What pass 1 learns over every journal: each id's winner, the ids whose only lines are
    of an earlier text of the item (``stale``), and what made the winners (``made``)."""

    digests: dict[ItemId, int]  # the input's ids (this shard's) and their item digests
    winners: Winners = field(default_factory=dict)
    stale: set[ItemId] = field(default_factory=set)
    lines: int = 0
    foreign: int = 0
    fps: dict[bytes, int] = field(default_factory=dict)  # settings fingerprint → its number
    settings: dict[str, Settings] = field(default_factory=dict)  # fingerprint → in full
    counts: tuple[int, int, int] = (0, 0, 0)  # pass 2's: ok, failed, not run
    api_lines: bool = False  # the final file holds Batch API output lines (a Batch API input)
    not_results: int = 0  # lines of the journals that are no result (nor a run's settings)

    def __post_init__(self) -> None:
        # one table of the input's ids (the same key objects): None until a line is found
        self.winners = dict.fromkeys(self.digests)

    def keep(self, item_id: ItemId, packed: int, fp: bytes | None) -> None:
        """The last ok line wins; a failure only replaces a failure (bit 0 is ok); a line of an
        earlier text of the item is no result of it."""
        if fp is not None and int(fp, 16) != self.digests[item_id]:
            self.stale.add(item_id)
            return
        old = self.winners[item_id]
        if old is None or packed & 1 or not old & 1:
            self.winners[item_id] = packed

    def made(self) -> list[tuple[int, Settings | None]]:
        """(results, settings) of the winners, most first (None: not recorded, or not in full)."""
        counts = Counter(made_of(p) for p in self.winners.values() if p is not None)
        names = {number: fp.decode() for fp, number in self.fps.items()}
        return [(n, self.settings.get(names.get(number, ""))) for number, n in counts.most_common()]

    def _made(self, made: bytes | None) -> int:
        if made is None:
            return 0
        found = self.fps.get(made)
        if found is None:
            found = self.fps[made] = min(len(self.fps) + 1, (1 << MADE_BITS) - 1)
        return found

    def scan(self, path: Path, shown: Path, number: int) -> None:
        """One journal (``shown``: its name in messages)."""

        results = others = 0

        def note(block: bytes, base: int, first_line: int, *, tail: bool = False) -> None:
            nonlocal results, others
            records, not_results = _records(block, shown, first_line)
            results += len(records)
            others += 0 if tail else not_results  # a torn last line is no line at all
            for match_start, token, ok, fp, made in records:
                item_id = _id_of(token)
                if item_id is None or isinstance(item_id, bool) or item_id not in self.winners:
                    if not tail:  # a torn last line is not counted at all
                        self.lines, self.foreign = self.lines + 1, self.foreign + 1
                    continue
                self.lines += 1
                packed = pack(base + match_start, number, ok == b"true", self._made(made))
                self.keep(item_id, packed, fp)
            if SETTINGS_MARK in block:  # a run's first line: its settings in full
                for raw in block.split(b"\n"):
                    found = Settings.from_line(loads(raw)) if SETTINGS_MARK in raw else None
                    if found is not None:
                        self.settings[found.fp] = found

        with open_journal(path) as handle:
            base = 0  # file offset of the block's first byte
            first_line = 1  # line number of the block's first line
            carry = b""
            while data := handle.read(BLOCK_BYTES):
                data = carry + data
                cut = data.rfind(b"\n") + 1
                block, carry = data[:cut], data[cut:]
                if len(carry) > MAX_LINE_BYTES:
                    raise line_too_long(shown, first_line + block.count(b"\n"))
                note(block, base, first_line)
                base += len(block)
                first_line += block.count(b"\n")
            if carry.strip():  # a last line without its newline: whole (kept) or torn (ignored)
                note(carry + b"\n", base, first_line, tail=True)
        self.not_results += others
        if others and not results:  # the tasks file, another tool's output: never "not run"
            raise InputError(
                f"{shown} holds no result of calibrate batch: none of its {others:,} line(s) "
                "is one (a result line has an 'id' and 'ok')",
                "Give the --out file(s) calibrate batch wrote (not its --input); nothing was "
                "written.",
            )


FP = re.compile("[0-9a-f]{16}")
_Record = tuple[int, bytes, bytes, bytes | None, bytes | None]  # offset, id, ok, digest, made


def _records(block: bytes, path: Path, first_line: int) -> tuple[list[_Record], int]:
    """(offset, id token, ok, item digest, settings fingerprint) of each result line of
    ``block`` (lines end at b"\\n"), and how many of its other lines are no result nor a run's
    settings (blank lines aside).

    A result whose id is neither a string nor an integer (a list, an object, ``1.0``, which
    must not be taken for ``1``) is an InputError naming the journal and the line.
    """
    found: list[_Record] = [
        (m.start(), m.group(1), m.group(2), m.group(3), m.group(4))
        for m in RESULT_LINE.finditer(block)
    ]
    if len(found) == block.count(b"\n"):
        return found, 0
    out: list[_Record] = []  # some lines are not ours verbatim: parse each
    others = 0
    offset = 0
    for number, raw in enumerate(block.split(b"\n")[:-1], first_line):
        match = RESULT_LINE.match(raw)
        if match is not None:
            out.append((offset, match.group(1), match.group(2), match.group(3), match.group(4)))
        else:
            obj = loads(raw)
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
                fp, made = obj.get(FP_FIELD), obj.get(MADE_FIELD)
                out.append(
                    (
                        offset,
                        token,
                        b"true" if obj["ok"] else b"false",
                        fp.encode() if isinstance(fp, str) and FP.fullmatch(fp) else None,
                        made.encode() if isinstance(made, str) and FP.fullmatch(made) else None,
                    )
                )
            elif raw.strip() and SETTINGS_MARK not in raw:
                others += 1
        offset += len(raw) + 1
    return out, others


def _id_of(token: bytes) -> ItemId | None:
    """The id of a token; None when it cannot be one of the input's (an integer too long)."""
    if token[:1] == b'"':
        return token[1:-1].decode("utf-8") if b"\\" not in token else json_text.loads(token)
    try:
        value: Any = json_text.loads(token)
    except ValueError:  # more digits than Python reads: no input id is like it
        return None
    return value  # type: ignore[no-any-return]


def loads(raw: bytes) -> Any:
    try:
        return json_text.loads(raw)
    except ValueError:
        return None
