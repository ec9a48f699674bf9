"""Per-request timeline of one tier or level, from a run's ``records.jsonl``.

Records carry when each request was sent and finished (``sent_at``, ``finished_at``, epoch
seconds on the client's one monotonic clock, SPEC §4.1) and, streamed, ``first_token_at``: the
bars are drawn from those. Records of older runs that carry ``started_s`` (seconds on the
stage's clock) are drawn from it, with ``done_s`` or ``started_s + elapsed_s`` as the finish.
Otherwise a record has ``ts`` and
``elapsed_s``: when the ``ts`` of a round differ, ``ts`` is taken as the finish. When they are all
one instant (the stage wrote the round's records after it ended) the starts are *estimated* by
replaying the round: ``concurrency`` requests in flight, in record order, waves of ``batch_size``
waiting for each other in a ladder. The report says which. ``ttft_s`` marks the first token.
"""

from __future__ import annotations

import datetime as dt
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from calibrate.errors import InputError
from calibrate.io.jsonl import read_jsonl
from calibrate.io.tier_table import level_key
from calibrate.io.tier_table.columns import Column
from calibrate.numbers import finite
from calibrate.report.html.svg import Bar


def _epoch_s(ts: Any) -> float | None:
    if not isinstance(ts, str):
        return None
    try:
        when = dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


Source = Literal["recorded", "finish times", "estimated"]
NOTES: dict[Source, str] = {
    "recorded": "sent and finished as recorded per request (the tick: its first token)",
    "finish times": "finish = the record's ts, start = finish - elapsed_s",
    "estimated": "records.jsonl has no start times (ts is when the round was written): starts "
    "are estimated by replaying the round with its concurrency and elapsed times",
}


@dataclass(frozen=True)
class Timeline:
    """The requests of one tier, and how their times were found."""

    label: str
    bars: tuple[Bar, ...]
    source: Source

    @property
    def note(self) -> str:
        return NOTES[self.source]


def _sent_finished(record: Mapping[str, Any]) -> tuple[float, float] | None:
    sent, finished = finite(record.get("sent_at")), finite(record.get("finished_at"))
    return (sent, finished) if sent is not None and finished is not None else None


def _first_token_s(record: Mapping[str, Any]) -> float | None:
    """Seconds from the send to the first token: ``first_token_at`` where recorded."""
    sent, first = finite(record.get("sent_at")), finite(record.get("first_token_at"))
    if sent is not None and first is not None:
        return first - sent
    return finite(record.get("ttft_s"))


def _recorded(record: Mapping[str, Any]) -> tuple[float, float] | None:
    started, elapsed = finite(record.get("started_s")), finite(record.get("elapsed_s"))
    if started is None:
        return None
    done = finite(record.get("done_s"))
    if done is None and elapsed is not None:
        done = started + elapsed
    return (started, done) if done is not None else None


def _from_ts(record: Mapping[str, Any]) -> tuple[float, float] | None:
    finish, elapsed = _epoch_s(record.get("ts")), finite(record.get("elapsed_s"))
    return None if finish is None or elapsed is None else (finish - elapsed, finish)


def _written_at_once(records: Sequence[Mapping[str, Any]]) -> bool:
    """Every round's records share one ``ts``: it is a write time, not each finish."""
    rounds: dict[Any, set[Any]] = {}
    for record in records:
        rounds.setdefault(record.get("round"), set()).add(record.get("ts"))
    return len(records) > 1 and all(len(stamps) == 1 for stamps in rounds.values())


def _replayed(records: Sequence[Mapping[str, Any]], wave: bool) -> list[tuple[float, float]]:
    """Closed-loop replay: ``concurrency`` workers take the next request when one finishes;
    in a ladder (``wave``) each wave of ``batch_size`` waits for the one before."""
    rounds: dict[Any, list[Mapping[str, Any]]] = {}
    for record in records:
        rounds.setdefault(record.get("round"), []).append(record)
    spans: dict[int, tuple[float, float]] = {}
    clock = 0.0
    for group in rounds.values():
        size = max(1, int(finite(group[0].get("batch_size")) or 1)) if wave else len(group)
        # a wave (B chat requests, or one request carrying B prompts) is sent all at once
        workers = size if wave else max(1, int(finite(group[0].get("concurrency")) or 1))
        for first in range(0, len(group), size):
            free = [clock] * workers
            for record in group[first : first + size]:
                start = heapq.heappop(free)
                end = start + (finite(record.get("elapsed_s")) or 0.0)
                heapq.heappush(free, end)
                spans[id(record)] = (start, end)
            clock = max(free)
    return [spans[id(r)] for r in records]


def _matches(record: Mapping[str, Any], key: Column, tier: float) -> bool:
    value = level_key(record, key)
    return value is not None and (value == tier or abs(value - tier) < 1e-9)


def tier_timeline(
    records: Iterable[Mapping[str, Any]], key: Column, tier: float, *, wave: bool, label: str = ""
) -> Timeline:
    """One bar per request of the tier (``key`` = batch_size, concurrency or offered_rate)."""
    picked = [r for r in records if _matches(r, key, tier)]
    source: Source
    if picked and all(_sent_finished(r) is not None for r in picked):
        source, spans = "recorded", [_sent_finished(r) for r in picked]
    elif picked and all(_recorded(r) is not None for r in picked):
        source, spans = "recorded", [_recorded(r) for r in picked]
    elif _written_at_once(picked):
        source, spans = "estimated", list(_replayed(picked, wave))
    else:
        source, spans = "finish times", [_from_ts(r) for r in picked]
    placed = [(r, s) for r, s in zip(picked, spans, strict=True) if s is not None]
    origin = min((s[0] for _, s in placed), default=0.0)
    bars: list[Bar] = []
    for number, (record, span) in enumerate(placed, 1):
        round_no = record.get("round")
        text = f"request {number}" + (f", round {round_no}" if round_no is not None else "")
        error = record.get("error")
        if isinstance(error, dict) and error.get("kind"):
            text += f" ({error['kind']})"
        ok = record.get("ok") is not False
        bars.append(Bar(text, span[0] - origin, span[1] - origin, _first_token_s(record), ok))
    return Timeline(label or f"{key} {tier:g}", tuple(bars), source)


def read_timeline(run: Path, key: Column, tier: float, *, wave: bool, label: str = "") -> Timeline:
    """The timeline of one tier; a tier with no records is exit 2 naming the tiers there are."""
    path = run / "records.jsonl"
    if not path.exists():
        raise InputError(f"{path} does not exist: no per-request records for a timeline")
    records = list(read_jsonl(path))
    timeline = tier_timeline(records, key, tier, wave=wave, label=label)
    if not timeline.bars:
        there = sorted({v for r in records if (v := level_key(r, key)) is not None})
        listed = ", ".join(f"{v:g}" for v in there) or "none"
        raise InputError(
            f"no records with {key} {tier:g} in {path}",
            f"Pick one of the tiers the run has ({listed}), e.g. --timeline {there[-1]:g}"
            if there
            else "This run's records carry no such column; rerun the stage.",
        )
    return timeline
