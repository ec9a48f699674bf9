"""Shards for a cluster scheduler: ``--shard I/N`` takes the ids whose stable hash mod N is I.

The hash is CRC-32 of the id's JSON text (``"t1"`` and ``1`` are different ids), so every
process on every machine, in any Python, puts an id in the same shard: N processes started with
0/N … N-1/N cover every id exactly once. Python's ``hash()`` is salted per process and would not.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from calibrate.errors import UsageError
from calibrate.io.journal.scan import OutputScan, scan_output

MAX_SHARDS = 100_000


def shard_of(item_id: str | int, count: int) -> int:
    """Which of ``count`` shards holds ``item_id``."""
    return zlib.crc32(json.dumps(item_id, ensure_ascii=False).encode("utf-8")) % count


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def holds(self, item_id: str | int) -> bool:
        return self.count == 1 or shard_of(item_id, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"2/8"`` → Shard(2, 8); anything else is a usage error (exit 2)."""
        index_text, sep, count_text = text.partition("/")
        if not (sep and index_text.isdigit() and count_text.isdigit()):
            raise UsageError(
                f"--shard {text!r} is not I/N", "e.g. --shard 0/4 … --shard 3/4 for four shards"
            )
        index, count = int(index_text), int(count_text)
        if not 1 <= count <= MAX_SHARDS or not 0 <= index < count:
            raise UsageError(
                f"--shard {text}: need 0 ≤ I < N ≤ {MAX_SHARDS}",
                "Shards are numbered from 0, e.g. --shard 0/4 … --shard 3/4.",
            )
        return cls(index, count)


def foreign_lines(
    scan: OutputScan, input_name: Path, whole: Mapping[str | int, int], shard: Shard | None
) -> str:
    """What a journal's ``scan.foreign`` lines are, in words: items of other shards of the
    input (a shard given another shard's --out: the journal is read again against every id),
    or not items of the input at all (another input file)."""
    not_input = f"line(s) that are not items of {input_name}"
    if shard is None or shard.count == 1:
        return f"{scan.foreign} {not_input} ({scan.foreign_example}): a different input file?"
    found = scan_output(scan.path, whole)
    others = sorted(
        (i for i in found.done | found.failed | found.changed if not shard.holds(i)), key=str
    )
    parts = []
    if others:
        example = others[0]
        parts.append(
            f"{scan.foreign - found.foreign} line(s) of other shards' items of {input_name} "
            f"(id {example!r} is shard {shard_of(example, shard.count)}/{shard.count}'s, this "
            f"run is shard {shard}): another shard's --out?"
        )
    if found.foreign:
        parts.append(f"{found.foreign} {not_input} ({found.foreign_example})")
    return "; and ".join(parts)
