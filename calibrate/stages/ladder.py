"""Stage C: step the batch size, two rounds per tier, VRAM sampled throughout (SPEC §5.3)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from calibrate.config import Config, LadderMode
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
from calibrate.stages.waves import Request, Sender, build_requests
from calibrate.stages.workload_plan import WorkloadPlan
from calibrate.summaries import LadderSummary, Setting, Workload
from calibrate.vram import VramMonitor, WindowPeak
from calibrate.workload import TokenRange, WorkloadSpec

log = logging.getLogger("calibrate")

Axis = Literal["batch", "context"]


@dataclass(frozen=True)
class LadderOptions:
    batch_sizes: tuple[int, ...]
    rounds: int
    mode: LadderMode
    vram_limit: float
    latency_rise: float
    require_match: bool = False
    axis: Axis = "batch"
    context_lengths: tuple[int, ...] = ()  # the context axis's input lengths, one tier each

    @classmethod
    def from_config(cls, cfg: Config, *, require_match: bool = False) -> LadderOptions:
        c = cfg.ladder
        return cls(c.batch_sizes, c.rounds, c.mode, c.vram_limit, c.latency_rise, require_match)

    def on_context_axis(self, lengths: Sequence[int], batch: int) -> LadderOptions:
        """Step the input length at batch ``batch`` (SPEC §5.3 ``--axis context``). Per-item
        time grows with the input by nature, so the latency rule has nothing to say here."""
        return replace(
            self,
            axis="context",
            context_lengths=tuple(lengths),
            batch_sizes=(batch,) * len(lengths),
            latency_rise=math.inf,
        )


@dataclass(frozen=True)
class LadderResult:
    tiers: tuple[Tier, ...]
    stopped_by: StopReason
    vram_source: str
    notes: tuple[str, ...]
    require_match: bool
    incidents: int
    workload: Workload = field(default_factory=Workload)
    workload_details: dict[str, Any] = field(default_factory=dict)
    axis: Axis = "batch"

    @property
    def last_passing(self) -> Tier | None:
        return last_passing(self.tiers)

    @property
    def match_failed(self) -> bool:
        return self.require_match and bool(self.notes)

    @property
    def passed(self) -> bool:
        return self.last_passing is not None and not self.match_failed

    @property
    def longest_input_tokens(self) -> int | None:
        """The longest input (server-counted tokens) of the last passing tier."""
        top = self.last_passing
        return top.stats.input_tokens_max if top else None

    def summary(self) -> LadderSummary:
        top = self.last_passing
        passing = [t.stats.concurrency for t in self.tiers if t.verdict != "fail"]
        tiers = [t.short() for t in self.tiers]
        if self.axis == "context":
            tiers = [
                {
                    **short,
                    "input_tokens_target": t.stats.input_tokens_target,
                    "input_tokens_max": t.stats.input_tokens_max,
                }
                for short, t in zip(tiers, self.tiers, strict=True)
            ]
        details = {
            "vram_source": self.vram_source,
            "tiers": tiers,
            "baseline_mismatch": list(self.notes),
            "incidents": self.incidents,
            "workload_detail": self.workload_details,
        }
        return LadderSummary(
            Setting(top.batch_size, top.stats.concurrency) if top else None,
            self.stopped_by,
            max(passing, default=0),
            self.workload,
            details,
            self.axis,
            self.longest_input_tokens if self.axis == "context" else None,
        )


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
    plan: WorkloadPlan = field(default_factory=lambda: WorkloadPlan(WorkloadSpec(), ""))
    issued: int = 0  # workload requests built so far: the next one's number (its own prompt)
    baseline: str | None = None
    baseline_read: bool = False

    def baseline_text(self) -> str | None:
        path = baseline_path(self.ctx.config)
        if not path.exists():
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
        passing = [t.stats for t in self.history if t.passed]
        return LadderResult(
            tuple(self.history), stopped_by(self.history, self.options.batch_sizes),
            self.monitor.source, tuple(mismatch_notes(self.history)),
            self.options.require_match, len(self.incidents.written),
            self.plan.recorded(passing), self.plan.details(), self.options.axis,
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

    def tier_sizes(self) -> TokenRange | None:
        """The input length of the tier being run on the context axis (None on the batch axis)."""
        lengths = self.options.context_lengths
        if self.options.axis != "context" or len(self.history) >= len(lengths):
            return None
        length = lengths[len(self.history)]
        return TokenRange(length, length)

    def wave_requests(self, batch: int, wave_no: int) -> list[Request]:
        """One wave (one batch at a time, SPEC §5.0): ``batch`` workload items, each its own
        prompt, and — under a workload other than the fixed prompt, when a baseline exists —
        the fixed prompt once more as a canary for batch invariance (SPEC §5.11)."""
        ctx, opts = self.ctx, self.options
        prompts, targets = self.plan.prompts(batch, self.issued, self.tier_sizes())
        self.issued += batch
        model = ctx.config.target.model
        requests = self.plan.requests(ctx.client, model, ctx.params, [prompts], targets, opts.mode)
        if self.plan.spec.fixed or self.canary_baseline() is None:
            return requests
        canary = build_requests(
            ctx.client,
            model,
            ctx.params,
            [[ctx.config.prompt.text]],
            "wave",
            first_index=batch + 1,
            role="canary",
        )
        return [*requests, *canary]

    def canary_baseline(self) -> str | None:
        """The baseline text the canary is compared with (read once; None: no canary)."""
        if not self.baseline_read:
            self.baseline = self.baseline_text()
            self.baseline_read = True
        return self.baseline

    def in_flight(self, batch: int) -> int:
        """Requests in flight at once: B in wave mode, one request of B prompts in prompt-list."""
        return 1 if self.options.mode == "prompt-list" else batch

    def run_round(self, batch: int, round_no: int) -> tuple[list[ItemResult], float, WindowPeak]:
        ctx = self.ctx
        requests = self.wave_requests(batch, 1)
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
    """The SPEC §4.1 record of one item, with the sampling parameters its body carried."""
    sent = item.body.get("max_tokens")
    params = ctx.params
    if isinstance(sent, int) and not isinstance(sent, bool) and sent != params.max_tokens:
        params = replace(params, max_tokens=sent)  # a forced answer length (SPEC §5.11)
    return RequestRecord(
        run_id=ctx.run.run_id, ts=utc_now_iso(), stage=ctx.run.stage, target=ctx.target,
        prompt=item.prompt, params=params, text=item.text, finish_reason=item.finish_reason,
        usage=item.usage, elapsed_s=item.elapsed_s, ttft_s=item.ttft_s,
        served_model=item.served_model, system_fingerprint=item.system_fingerprint,
        batch_size=batch, concurrency=concurrency, round=round_no, ok=item.ok, error=item.error,
        input_tokens_target=item.input_tokens_target, canary=item.role == "canary",
    ).to_json()  # fmt: skip


def all_refused(items: Sequence[ItemResult]) -> bool:
    """Nothing answered at all: no server, which is exit 4 rather than a failing tier."""
    return bool(items) and all(i.error is not None and i.error.kind == "connect" for i in items)
