"""What the load engine hands back per input item: its answer or failure, and when (SPEC §4.1, §12)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from calibrate.errors import ErrorInfo
from calibrate.http.models import Usage
from calibrate.http.request_times import RequestTimes
from calibrate.http.stream_timing import StreamTiming

# fixed: the fixed-prompt workload (compared with the baseline); work: a workload item;
# canary: the fixed prompt sent alone between a workload's measured waves (compared, not
# measured; SPEC §5.3, §5.11)
ItemRole = Literal["fixed", "work", "canary"]


@dataclass(frozen=True)
class ItemResult:
    """One input item's answer (or failure); times are seconds since its round started."""

    index: int
    prompt: str
    path: str
    body: dict[str, Any]
    text: str | None
    finish_reason: str | None
    usage: Usage | None
    completion_tokens: int
    elapsed_s: float
    ttft_s: float | None
    started_s: float
    done_s: float
    served_model: str | None = None
    system_fingerprint: str | None = None
    error: ErrorInfo | None = None
    exception_type: str | None = None
    traceback: str | None = None
    role: ItemRole = "fixed"
    input_tokens_target: int | None = None
    stream: StreamTiming | None = None  # a streamed answer's chunks and inter-token gaps
    times: RequestTimes | None = None  # epoch sent / first token / finished (SPEC §4.1)

    @property
    def ok(self) -> bool:
        return self.error is None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0–100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]
