"""What one streamed answer's timing says beyond TTFT: its inter-token gaps (SPEC §5.13).

The client notes when each content chunk arrived; this module turns those moments into the
request's gap list (ITL, per chunk or — where the usage allows — per token) and its summary.
Pure arithmetic, no clock: the client passes times in seconds since the request was sent.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

TokensCountedBy = Literal["usage", "chunks"]


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0–100) of ``values``; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


@dataclass(frozen=True)
class StreamTiming:
    """One streamed answer: content chunks, output tokens and how they were counted, and the
    gaps between chunks (each divided by the tokens a chunk carried on average, when the
    server's usage says how many there were: a gap per token)."""

    chunks: int
    output_tokens: int
    tokens_counted_by: TokensCountedBy
    gaps_s: tuple[float, ...]  # kept in memory for the tier's pooled percentiles, not on disk

    @property
    def itl_mean_s(self) -> float | None:
        return sum(self.gaps_s) / len(self.gaps_s) if self.gaps_s else None

    @property
    def itl_p50_s(self) -> float | None:
        return nearest_rank(self.gaps_s, 50)

    @property
    def itl_p99_s(self) -> float | None:
        return nearest_rank(self.gaps_s, 99)

    @property
    def itl_max_s(self) -> float | None:
        return max(self.gaps_s, default=None)

    def to_json(self) -> dict[str, Any]:
        """The summary a request record keeps (the gap list itself stays in memory)."""

        def r(value: float | None) -> float | None:
            return round(value, 6) if value is not None else None

        return {
            "chunks": self.chunks,
            "tokens_counted_by": self.tokens_counted_by,
            "itl_mean_s": r(self.itl_mean_s),
            "itl_p50_s": r(self.itl_p50_s),
            "itl_p99_s": r(self.itl_p99_s),
            "itl_max_s": r(self.itl_max_s),
        }


def stream_timing(arrivals_s: Sequence[float], usage_tokens: int | None) -> StreamTiming:
    """The timing of a stream whose content chunks arrived at ``arrivals_s``.

    With the server's count of output tokens, each gap is divided by the tokens per chunk
    after the first (a server that sends several tokens a chunk still gets a per-token ITL);
    without it, every chunk counts as one token (llama.cpp without ``include_usage``).
    """
    chunks = len(arrivals_s)
    raw = [b - a for a, b in itertools.pairwise(arrivals_s)]
    if usage_tokens is None:
        return StreamTiming(chunks, chunks, "chunks", tuple(raw))
    per_chunk = (usage_tokens - 1) / (chunks - 1) if chunks > 1 and usage_tokens > 1 else 1.0
    # a token a chunk (the common stream): x / 1.0 is x, the list is kept as it is
    gaps = tuple([g / per_chunk for g in raw]) if per_chunk > 0 and per_chunk != 1.0 else tuple(raw)
    return StreamTiming(chunks, usage_tokens, "usage", gaps)
