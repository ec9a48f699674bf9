"""Shards for a cluster scheduler: ``--shard I/N`` takes the ids whose stable hash mod N is I.

The hash is CRC-32 of the id's JSON text (``"t1"`` and ``1`` are different ids), so every
process on every machine, in any Python, puts an id in the same shard: N processes started with
0/N … N-1/N cover every id exactly once. Python's ``hash()`` is salted per process and would not.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

from calibrate.errors import UsageError

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
