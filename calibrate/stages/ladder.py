"""Stage C: step the batch size, two rounds per tier, VRAM sampled throughout (SPEC §5.3)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calibrate.config import Config, LadderMode
from calibrate.errors import InputError
from calibrate.ledger import baseline_path
from calibrate.records import RequestRecord, utc_now_iso
from calibrate.stages.context import StageContext
from calibrate.stages.incidents import IncidentRecorder
from calibrate.stages.single import read_baseline, unreachable
from calibrate.stages.stop_rules import (
    last_passing,
    mismatch_notes,
    next_tier,
    stopped_by,
    tier_verdict,
)
from calibrate.stages.tiers import ItemResult, Stats, StopReason, Tier, summarise
from calibrate.stages.waves import Sender, build_requests
from calibrate.store import load_jsonl_objects
from calibrate.summaries import LadderSummary, Setting, Workload
from calibrate.vram import VramMonitor, WindowPeak

log = logging.getLogger("calibrate")


@dataclass(frozen=True)
class LadderOptions:
    batch_sizes: tuple[int, ...]
    rounds: int
    mode: LadderMode
    vram_limit: float
    latency_rise: float
    tasks: tuple[str, ...] = ()
    require_match: bool = False

    @classmethod
    def from_config(
        cls, cfg: Config, *, tasks: Sequence[str] = (), require_match: bool = False
    ) -> LadderOptions:
        c = cfg.ladder
        return cls(c.batch_sizes, c.rounds, c.mode, c.vram_limit,
                   c.latency_rise, tuple(tasks), require_match)  # fmt: skip


@dataclass(frozen=True)
class LadderResult:
    tiers: tuple[Tier, ...]
    stopped_by: StopReason
    vram_source: str
    notes: tuple[str, ...]
    require_match: bool
    incidents: int

    @property
    def last_passing(self) -> Tier | None:
        return last_passing(self.tiers)

    @property
    def match_failed(self) -> bool:
        return self.require_match and bool(self.notes)

    @property
    def passed(self) -> bool:
        return self.last_passing is not None and not self.match_failed

    def summary(self) -> LadderSummary:
        top = self.last_passing
        passing = [t.stats.concurrency for t in self.tiers if t.verdict != "fail"]
        details = {
            "vram_source": self.vram_source,
            "tiers": [t.short() for t in self.tiers],
            "baseline_mismatch": list(self.notes),
            "incidents": self.incidents,
        }
        return LadderSummary(
            Setting(top.batch_size, top.stats.concurrency) if top else None,
            self.stopped_by,
            max(passing, default=0),
            Workload(),
            details,
        )


def load_tasks(path: Path) -> tuple[str, ...]:
    """The ``text`` of every line of a tasks JSONL file; a bad line is exit 2 naming it."""
    texts: list[str] = []
    for number, obj in load_jsonl_objects(path, "tasks file"):
        if not isinstance(obj.get("text"), str):
            raise InputError(f"{path}:{number} has no string field 'text'",
                             'Each line must look like {"id": 1, "text": "..."}')  # fmt: skip
        texts.append(obj["text"])
    return tuple(texts)


@dataclass
class Ladder:
    """One ladder run; ``history`` grows as tiers finish (kept if interrupted)."""

    ctx: StageContext
    options: LadderOptions
    monitor: VramMonitor
    incidents: IncidentRecorder
    sender: Sender
    on_tier: Callable[[Tier], None] = lambda tier: None
    history: list[Tier] = field(default_factory=list)

    def baseline_text(self) -> str | None:
        path = baseline_path(self.ctx.config)
        if self.options.tasks or not path.exists():
            return None
        text = read_baseline(path).get("text")
        return text if isinstance(text, str) else None

    def run(self) -> LadderResult:
        baseline = self.baseline_text()
        opts = self.options
        while (batch := next_tier(self.history, opts.batch_sizes)) is not None:
            tier = self.run_tier(batch, baseline)
            self.history.append(tier)
            self.ctx.run.append("tiers.jsonl", tier.to_json())
            self.on_tier(tier)
        return self.result()

    def result(self) -> LadderResult:
        return LadderResult(
            tuple(self.history), stopped_by(self.history, self.options.batch_sizes),
            self.monitor.source, tuple(mismatch_notes(self.history)),
            self.options.require_match, len(self.incidents.written),
        )  # fmt: skip

    def run_tier(self, batch: int, baseline: str | None) -> Tier:
        opts = self.options
        previous = self.history[-1].stats if self.history else None
        rounds: list[Stats] = []
        items_all: list[ItemResult] = []
        peaks: list[WindowPeak] = []
        total_s = 0.0
        for round_no in range(1, opts.rounds + 1):
            items, seconds, peak = self.run_round(batch, round_no)
            stats = summarise(batch_size=batch, concurrency=self.in_flight(batch), round_no=round_no,
                              items=items, total_s=seconds, peaks=[peak],
                              baseline_text=baseline)  # fmt: skip
            self.ctx.run.append(
                "rounds.jsonl", {**stats.to_json(), "vram_source": self.monitor.source}
            )
            rounds.append(stats)
            items_all += items
            peaks.append(peak)
            total_s += seconds
            if stats.errors:  # a failed round fails the tier; another round only adds load
                break
        agg = summarise(batch_size=batch, concurrency=self.in_flight(batch), round_no=None,
                        items=items_all, total_s=total_s, peaks=peaks, baseline_text=baseline)  # fmt: skip
        verdict, reason = tier_verdict(agg, previous, vram_limit=opts.vram_limit,
                                       latency_rise=opts.latency_rise, rounds_run=len(rounds),
                                       rounds_planned=opts.rounds)  # fmt: skip
        return Tier(agg, tuple(rounds), verdict, reason, opts.rounds)

    def prompts(self, batch: int) -> list[list[str]]:
        """One wave of ``batch`` items (one batch at a time, SPEC §5.0): the fixed prompt or tasks."""
        source = self.options.tasks or (self.ctx.config.prompt.text,)
        return [[source[i % len(source)] for i in range(batch)]]

    def in_flight(self, batch: int) -> int:
        """Requests in flight at once: B in wave mode, one request of B prompts in prompt-list."""
        return 1 if self.options.mode == "prompt-list" else batch

    def run_round(self, batch: int, round_no: int) -> tuple[list[ItemResult], float, WindowPeak]:
        ctx, opts = self.ctx, self.options
        requests = build_requests(ctx.client, ctx.config.target.model, ctx.params,
                                  self.prompts(batch), opts.mode)  # fmt: skip
        idle = self.monitor.open_window()
        items, seconds = self.sender.send(requests, len(requests), ctx.params.max_tokens)
        peak = self.monitor.close_window(idle)
        if not self.history and round_no == 1 and all_refused(items):
            raise unreachable(items[0].error, ctx.config.target.base_url)
        for item in items:
            ctx.run.append(
                "records.jsonl", item_record(ctx, item, batch, self.in_flight(batch), round_no)
            )
        self.incidents.record(
            items, batch_size=batch, concurrency=self.in_flight(batch), round_no=round_no, peak=peak
        )
        return items, seconds, peak


def item_record(
    ctx: StageContext, item: ItemResult, batch: int, concurrency: int, round_no: int | None
) -> dict[str, Any]:
    """The SPEC §4.1 record of one item."""
    return RequestRecord(
        run_id=ctx.run.run_id, ts=utc_now_iso(), stage=ctx.run.stage, target=ctx.target,
        prompt=item.prompt, params=ctx.params, text=item.text, finish_reason=item.finish_reason,
        usage=item.usage, elapsed_s=item.elapsed_s, ttft_s=item.ttft_s,
        served_model=item.served_model, system_fingerprint=item.system_fingerprint,
        batch_size=batch, concurrency=concurrency, round=round_no, ok=item.ok, error=item.error,
    ).to_json()  # fmt: skip


def all_refused(items: Sequence[ItemResult]) -> bool:
    """Nothing answered at all: no server, which is exit 4 rather than a failing tier."""
    return bool(items) and all(i.error is not None and i.error.kind == "connect" for i in items)
