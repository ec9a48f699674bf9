"""A finished batch replayed (``--replay JOURNAL``): which of its items each request sends.

Request ``key`` sends one item of the job: a synthetic prompt sized to the item's input tokens,
its answer forced to the item's output tokens. The items are taken in an order that spreads any
run of them over the whole job: sorted by their token counts, then visited in bit-reversed rank
order (0, ½, ¼, ¾, …), so the first few requests of a tier are already small, median and long
items alike — a short tier is a fair sample of the job, not its first lines. Past the last item
the order starts again.

``job_shape`` is what the run records of the job (summary ``workload_detail.replay``): its
percentiles of input and output tokens, against which ``report`` draws what the replay sent.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from calibrate.workload import JobTrace

PERCENTILES = 101  # p0 … p100 of each count: the job's distribution, small enough to record


def _reversed_bits(rank: int, bits: int) -> int:
    return int(format(rank, f"0{bits}b")[::-1], 2) if bits else 0


def spread_order(count: int) -> tuple[int, ...]:
    """Ranks 0…count-1 in an order whose every prefix is spread over all of them."""
    bits = max(count - 1, 0).bit_length()
    return tuple(sorted(range(count), key=lambda r: (_reversed_bits(r, bits), r)))


@dataclass(frozen=True)
class ReplayItems:
    """The job's items in the order requests take them: (input tokens, output tokens)."""

    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    @classmethod
    def of(cls, trace: JobTrace) -> ReplayItems:
        pairs = sorted(zip(trace.input_tokens, trace.output_tokens, strict=True))
        order = spread_order(len(pairs))
        return cls(tuple(pairs[r][0] for r in order), tuple(pairs[r][1] for r in order))

    def item(self, key: int) -> tuple[int, int]:
        """Request ``key``'s item: (input tokens, output tokens)."""
        n = key % len(self.inputs)
        return self.inputs[n], self.outputs[n]

    @property
    def median_input(self) -> int:
        return round(statistics.median(self.inputs))


def percentiles(values: tuple[int, ...] | list[int]) -> list[int]:
    """p0, p1 … p100 of ``values`` (nearest rank)."""
    ordered = sorted(values)
    last = len(ordered) - 1
    return [ordered[round(q * last / (PERCENTILES - 1))] for q in range(PERCENTILES)]


def job_shape(trace: JobTrace) -> dict[str, Any]:
    """What the run records of the replayed job: where it came from and its distributions."""
    gaps = trace.gaps_s()
    return {
        "journal": str(trace.source),
        "format": trace.job_format,
        "items": trace.items,
        "sampled_from": trace.sampled_from or None,
        "skipped": trace.skipped,
        "input_tokens": percentiles(trace.input_tokens),
        "output_tokens": percentiles(trace.output_tokens),
        "arrivals": bool(gaps),
        "mean_gap_s": round(statistics.fmean(gaps), 6) if gaps else None,
    }
