"""The user's own job in a run's report (SPEC §13): how close a replay came to the job it
replayed (``--replay JOURNAL``), and the engine's prefix cache as the run met it.

The run recorded the job's token counts (``workload_detail.replay``: p0…p100 of its items'
input and output tokens, from its journal); its ``records.jsonl`` holds what the replay sent
(each workload request's ``usage``). For input and output tokens apart, the two are compared:

- **close** when the two-sample Kolmogorov–Smirnov distance D between the job's counts and the
  replay's is within its 95 % critical value, ``1.36 · √((n + m) / (n · m))`` for n items of the
  job and m requests of the replay, plus 0.01 for the job being recorded as percentiles — a
  replay of m requests drawn from the job stays within it 95 % of the time; a replay whose
  prompts were sized wrong, or whose answers were not forced, does not;
- **too few to tell** when that critical value is 1 or more (a job of one item, a replay of one
  request): no distance could exceed it, so "close" would say nothing;
- p50 and p90 of each are shown side by side, and both histograms: as text in the terminal
  (``histogram_lines``), as SVG in the HTML report (``html.replay``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibrate.io.jsonl import read_jsonl
from calibrate.state.summary_values import PrefixCacheSeen, Workload

KS_95 = 1.36  # the two-sample Kolmogorov–Smirnov coefficient at 95 %
PERCENTILE_STEP = 0.01  # the job is recorded as p0…p100: its CDF is known to a step of 1 %
BINS = 12
BAR_CHARS = 24


@dataclass(frozen=True)
class TokenFit:
    """One count (input or output tokens): the job's percentiles against what the replay sent."""

    name: str
    job: tuple[int, ...]  # p0 … p100
    job_items: int
    sent: tuple[int, ...]  # sorted

    @property
    def distance(self) -> float:
        """The Kolmogorov–Smirnov distance: the largest gap between the two CDFs."""
        points = sorted({*self.job, *self.sent})
        return max((abs(self._job_cdf(x) - self._sent_cdf(x)) for x in points), default=0.0)

    @property
    def tolerance(self) -> float:
        n, m = self.job_items, len(self.sent)
        return KS_95 * math.sqrt((n + m) / (n * m)) + PERCENTILE_STEP if n and m else 1.0

    @property
    def decided(self) -> bool:
        """Some distance could exceed the tolerance (a KS distance is at most 1): with fewer
        items or requests every replay would pass, and passing proves nothing."""
        return bool(self.sent) and self.tolerance < 1.0

    @property
    def close(self) -> bool:
        return self.decided and self.distance <= self.tolerance

    @property
    def verdict(self) -> str:
        if not self.decided:
            return "too few to tell"
        return "close" if self.close else "NOT close"

    def _job_cdf(self, x: float) -> float:
        if len(self.job) < 2:
            return 0.0
        return max(bisect.bisect_right(self.job, x) - 1, 0) / (len(self.job) - 1)

    def _sent_cdf(self, x: float) -> float:
        return bisect.bisect_right(self.sent, x) / len(self.sent) if self.sent else 0.0

    def quantile(self, q: float) -> tuple[int, int | None]:
        """(the job's, the replay's) ``q`` quantile."""
        job = self.job[round(q * (len(self.job) - 1))]
        sent = self.sent[min(len(self.sent) - 1, int(q * len(self.sent)))] if self.sent else None
        return job, sent

    def line(self) -> str:
        p50, p90 = self.quantile(0.5), self.quantile(0.9)
        return (
            f"  {self.name}: job p50 {p50[0]} p90 {p90[0]}, replay p50 {p50[1]} p90 {p90[1]}; "
            f"KS distance {self.distance:.3f} (tolerance {self.tolerance:.3f}): {self.verdict}"
        )

    def bins(self, count: int = BINS) -> list[tuple[int, int, float, float]]:
        """(first, last token count, the job's share, the replay's share) per bin, whole
        numbers of tokens wide, over both ranges."""
        low = min(self.job[0], self.sent[0] if self.sent else self.job[0])
        high = max(self.job[-1], self.sent[-1] if self.sent else self.job[-1])
        width = max(1, math.ceil((high - low + 1) / count))
        out = []
        for first in range(low, high + 1, width):
            last = first + width - 1
            job = self._job_cdf(last) - self._job_cdf(first - 1)
            sent = self._sent_cdf(last) - self._sent_cdf(first - 1)
            out.append((first, last, max(job, 0.0), max(sent, 0.0)))
        return out

    def to_json(self) -> dict[str, Any]:
        p50, p90 = self.quantile(0.5), self.quantile(0.9)
        return {
            "job_p50": p50[0],
            "job_p90": p90[0],
            "replay_p50": p50[1],
            "replay_p90": p90[1],
            "ks_distance": round(self.distance, 4),
            "tolerance": round(self.tolerance, 4),
            "close": self.close if self.decided else None,
            "verdict": self.verdict,
            "sent": len(self.sent),
        }


@dataclass(frozen=True)
class ReplayFit:
    """The replayed job against what the replay sent, input and output tokens."""

    journal: str
    items: int
    inputs: TokenFit
    outputs: TokenFit
    arrivals: bool

    @property
    def close(self) -> bool:
        return self.inputs.close and self.outputs.close

    @property
    def decided(self) -> bool:
        """Either count is shown NOT close, or both could have been and were not."""
        fits = (self.inputs, self.outputs)
        return any(f.decided and not f.close for f in fits) or all(f.decided for f in fits)

    @property
    def verdict(self) -> str:
        """close to the job, NOT close (either count is not), or too few to tell."""
        if not self.decided:
            return (
                "too few to tell whether it is close to the job (no distance could exceed "
                "the tolerance)"
            )
        return "close to the job" if self.close else "NOT close to the job"

    def lines(self) -> list[str]:
        how = self.verdict
        head = (
            f"replay of {self.journal} ({self.items} items): {len(self.inputs.sent)} requests, "
            f"{how}"
        )
        return [head, self.inputs.line(), self.outputs.line()]

    def to_json(self) -> dict[str, Any]:
        return {
            "journal": self.journal,
            "items": self.items,
            "close": self.close if self.decided else None,
            "verdict": self.verdict,
            "input_tokens": self.inputs.to_json(),
            "output_tokens": self.outputs.to_json(),
            "arrivals": self.arrivals,
        }


def _ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool))


def _sent(records: Iterable[Mapping[str, Any]]) -> tuple[list[int], list[int]]:
    """The workload requests' token counts (the canary and failed requests left out)."""
    inputs: list[int] = []
    outputs: list[int] = []
    for record in records:
        usage = record.get("usage")
        if record.get("canary") or record.get("ok") is not True or not isinstance(usage, dict):
            continue
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(prompt, int) and isinstance(completion, int):
            inputs.append(prompt)
            outputs.append(completion)
    return sorted(inputs), sorted(outputs)


def replay_fit(summary: Mapping[str, Any], run: Path) -> ReplayFit | None:
    """The run's replay against its job; None for a run that replayed nothing."""
    detail = summary.get("workload_detail")
    shape = detail.get("replay") if isinstance(detail, dict) else None
    if not isinstance(shape, dict):
        return None
    job_in, job_out = _ints(shape.get("input_tokens")), _ints(shape.get("output_tokens"))
    items = shape.get("items")
    if len(job_in) < 2 or len(job_out) < 2 or not isinstance(items, int) or items < 1:
        return None
    path = run / "records.jsonl"
    inputs, outputs = _sent(read_jsonl(path)) if path.is_file() else ([], [])
    return ReplayFit(
        str(shape.get("journal", "")),
        items,
        TokenFit("input tokens", job_in, items, tuple(inputs)),
        TokenFit("output tokens", job_out, items, tuple(outputs)),
        shape.get("arrivals") is True,
    )


def histogram_lines(fit: TokenFit) -> list[str]:
    """The two histograms side by side as text: one row per bin, the job's bar then the
    replay's, each as a share of its own count."""
    rows = fit.bins()
    top = max((max(j, s) for *_, j, s in rows), default=0.0) or 1.0
    out = [f"  {fit.name:<16} {'job':<{BAR_CHARS + 5}} replay"]
    for first, last, job, sent in rows:
        span = f"{first}–{last}" if last > first else str(first)
        out.append(f"  {span:>16} {_bar(job, top)} {job:4.0%}  {_bar(sent, top)} {sent:4.0%}")
    return out


def _bar(share: float, top: float) -> str:
    return ("█" * round(share / top * BAR_CHARS)).ljust(BAR_CHARS)


def all_lines(fit: ReplayFit, *, histograms: bool = True) -> Sequence[str]:
    """What ``report`` says of a replay: the verdict, then both histograms."""
    lines = fit.lines()
    if histograms:
        lines += histogram_lines(fit.inputs) + histogram_lines(fit.outputs)
    return lines


def prefix_cache_seen(summary: Mapping[str, Any]) -> PrefixCacheSeen | None:
    """The engine's prefix cache as the run met it, when it was probed or found anything."""
    seen = Workload.from_json(summary.get("workload")).prefix_cache
    return seen if seen is not None and (seen.hit or seen.gain is not None) else None
