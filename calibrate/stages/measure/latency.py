"""The latency columns of a round, tier or level (SPEC §5.13): TTFT, TPOT, ITL and E2E at
p50/p90/p95/p99 and their mean, output tokens/s per request, and how the tokens were counted.

TTFT, TPOT and ITL exist only for streamed answers; ITL pools every request's inter-token gaps
(as vLLM's benchmark does), so a long answer weighs by its tokens, not as one request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from calibrate.http.stream_timing import nearest_rank

if TYPE_CHECKING:
    from calibrate.load.items import ItemResult

PERCENTILES = (50, 90, 95, 99)


def tpot_of(elapsed_s: float, ttft_s: float | None, tokens: int | None) -> float | None:
    """Time per output token after the first: (E2E − TTFT) / (output tokens − 1)."""
    if ttft_s is None or tokens is None or tokens < 2:
        return None
    return max(0.0, elapsed_s - ttft_s) / (tokens - 1)


def columns_of(metric: str, values: Sequence[float]) -> dict[str, float | None]:
    """``{metric}_p50_s`` … ``{metric}_p99_s`` and ``{metric}_mean_s`` of ``values``."""
    out: dict[str, float | None] = {
        f"{metric}_p{q}_s": nearest_rank(values, q) for q in PERCENTILES
    }
    out[f"{metric}_mean_s"] = sum(values) / len(values) if values else None
    return out


def latency_columns(items: Sequence[ItemResult]) -> dict[str, Any]:
    """Every latency column of the answered ``items`` (canaries already left out)."""
    ok = [i for i in items if i.ok]
    ttfts = [i.ttft_s for i in ok if i.ttft_s is not None]
    tpots = [t for i in ok if (t := tpot_of(i.elapsed_s, i.ttft_s, i.completion_tokens))]
    gaps = [g for i in ok if i.stream is not None for g in i.stream.gaps_s]
    e2es = [i.elapsed_s for i in ok]
    rates = [i.completion_tokens / i.elapsed_s for i in ok if i.elapsed_s > 0]
    counted = {i.stream.tokens_counted_by for i in ok if i.stream is not None}
    return {
        **columns_of("ttft", ttfts),
        **columns_of("tpot", tpots),
        **columns_of("itl", gaps),
        **columns_of("e2e", e2es),
        "output_tokens_per_s_per_request": sum(rates) / len(rates) if rates else None,
        "tokens_counted_by": "/".join(sorted(counted)) if counted else None,
    }
