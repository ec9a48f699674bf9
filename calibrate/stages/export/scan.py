"""Export's pass 1: where each input id's winning line is, over every journal.

The winner of an id is its **last ok** line if it has one (a later failure does not undo a
success), else its last failure. It is kept packed in one int — its byte offset, the journal's
number and whether it is ok — so memory is bounded by the id set, never the text. Lines are
read in blocks (one regular expression at C speed), each under the line bound.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, BinaryIO

from calibrate import json_text
from calibrate.errors import InputError
from calibrate.io.bounded import MAX_LINE_BYTES, open_read
from calibrate.io.journal.scan import RESULT_LINE, line_too_long
from calibrate.io.tasks import ItemId

BLOCK_BYTES = 8 * 1024 * 1024
JOURNAL_BITS = 10  # up to 1024 journals (shards) in one export
MAX_JOURNALS = 1 << JOURNAL_BITS

Winners = dict[ItemId, int | None]  # id → packed winning line (None: no line yet)


def open_journal(path: Path) -> BinaryIO:
    return open_read(path, "the journal", "Give the --out file(s) of calibrate batch.")


def pack(offset: int, number: int, ok: bool) -> int:
    return (offset << (JOURNAL_BITS + 1)) | (number << 1) | ok


def unpack(packed: int) -> tuple[int, int, bool]:
    """(byte offset, journal number, ok) of a packed winner."""
    return packed >> (JOURNAL_BITS + 1), (packed >> 1) & (MAX_JOURNALS - 1), bool(packed & 1)


def _keep(winners: Winners, item_id: ItemId, packed: int) -> None:
    """The last ok line wins; a failure only replaces a failure (bit 0 is ok)."""
    old = winners[item_id]
    if old is None or packed & 1 or not old & 1:
        winners[item_id] = packed


def scan_journal(path: Path, shown: Path, number: int, winners: Winners) -> tuple[int, int]:
    """Pass 1 over one journal (``shown``: its name in messages): (lines read, foreign lines)."""
    lines = foreign = 0

    def note(block: bytes, base: int, first_line: int, *, tail: bool = False) -> None:
        nonlocal lines, foreign
        for match_start, token, ok in _records(block, shown, first_line):
            item_id = _id_of(token)
            if item_id is None or isinstance(item_id, bool) or item_id not in winners:
                if not tail:  # a torn last line is not counted at all
                    lines, foreign = lines + 1, foreign + 1
                continue
            lines += 1
            _keep(winners, item_id, pack(base + match_start, number, ok == b"true"))

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


def loads(raw: bytes) -> Any:
    try:
        return json_text.loads(raw)
    except ValueError:
        return None
