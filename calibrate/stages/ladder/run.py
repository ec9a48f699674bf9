"""Stage C: step the batch size, two rounds per tier, VRAM sampled throughout (SPEC §5.3)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from calibrate.config import Config, LadderMode, SloConfig
from calibrate.gpu.engine_metrics import Gauge, read_preemptions
from calibrate.gpu.vram import VramMonitor, WindowPeak
from calibrate.io.records import RequestRecord, utc_now_iso
from calibrate.load.items import ItemResult
from calibrate.load.waves import Request, Sender, build_requests
from calibrate.stages.context import StageContext
from calibrate.stages.determinism import DeterminismCheck
from calibrate.stages.determinism.wave import CopiesWave, send_copies
from calibrate.stages.ladder.context_axis import axis_stopped_by, next_length, relabel
from calibrate.stages.ladder.result import Axis, LadderResult, WarmUp
from calibrate.stages.measure.incidents import IncidentRecorder
from calibrate.stages.measure.slo import with_goodput
from calibrate.stages.measure.stop_rules import (
    ServerCap,
    latency_seen,
    mismatch_notes,
    next_tier,
    stopped_by,
    tier_verdict,
)
from calibrate.stages.measure.tiers import Stats, Tier, summarise
from calibrate.stages.prepare.stream_probe import StreamCheck
from calibrate.stages.prepare.workload_plan import WorkloadPlan
from calibrate.stages.single import read_baseline, unreachable
from calibrate.state.ledger import baseline_path
from calibrate.workload import TokenRange, WorkloadSpec

log = logging.getLogger("calibrate")
__all__ = ["Axis", "Ladder", "LadderOptions", "LadderResult", "WarmUp"]


@dataclass(frozen=True)
class LadderOptions:
    batch_sizes: tuple[int, ...]
    rounds: int
    mode: LadderMode
    vram_limit: float
    latency_rise: float
    require_match: bool = False
    min_round_s: float = 0.0  # a round repeats waves of B until it lasted this long
    warmup_waves: int = 0  # waves of the first tier before it, not counted
    slo: SloConfig = field(default_factory=SloConfig)
    axis: Axis = "batch"
    context_lengths: tuple[int, ...] = ()  # the context axis's input lengths, one tier each
    streaming: bool = True  # SPEC §5.13: streamed by default (``--no-stream`` turns it off)
    stream_check: StreamCheck | None = None  # what the stream probe found (None: not probed)
    gain_min: float = 0.10  # the setting: the smallest B within this much of the fastest tier
    max_rounds: int = 0  # rounds a tier may run when its rounds disagree (0: ``rounds``)
    determinism_copies: int = 0  # [determinism] copies of the fixed prompt per tier (0: off)

    @property
    def round_bound(self) -> int:
        return max(self.rounds, self.max_rounds)

    @property
    def stream(self) -> bool:
        """Stream (SSE) by default, and always when an SLO needs TTFT: only a streamed answer
        shows its first token — unless the server refused streamed requests (the probe)."""
        asked = self.streaming or self.slo.needs_stream
        return asked and (self.stream_check is None or self.stream_check.stream)

    @property
    def stream_options(self) -> bool:
        return self.stream_check is None or self.stream_check.stream_options

    @classmethod
    def from_config(cls, cfg: Config, *, require_match: bool = False) -> LadderOptions:
        c = cfg.ladder
        return cls(
            batch_sizes=c.batch_sizes,
            rounds=c.rounds,
            mode=c.mode,
            vram_limit=c.vram_limit,
            latency_rise=c.latency_rise,
            require_match=require_match,
            min_round_s=c.min_round_s,
            warmup_waves=c.warmup_waves,
            slo=cfg.slo,
            gain_min=cfg.sweep.gain_min,
            max_rounds=2 * c.rounds,
            determinism_copies=cfg.determinism.copies,
        )

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
    warmup: WarmUp | None = None
    plan: WorkloadPlan = field(default_factory=lambda: WorkloadPlan(WorkloadSpec(), ""))
    issued: int = 0  # workload requests built so far: the next one's number (its own prompt)
    baseline: str | None = None  # the single-call baseline's text, read once by run()
    cap: ServerCap | None = None  # the server's own cap, when known (``stop: cap`` above it)
    # the server's preemption counter now (None: it has none); default: its /metrics
    preemptions: Callable[[], Gauge | None] | None = None
    # before each tier: e.g. restart a managed llama.cpp at --parallel B; True: it restarted
    before_tier: Callable[[int], bool] = lambda batch: False

    def baseline_text(self) -> str | None:
        path = baseline_path(self.ctx.config)
        if not path.exists():
            return None
        text = read_baseline(path).get("text")
        return text if isinstance(text, str) else None

    def run(self) -> LadderResult:
        self.baseline = self.baseline_text()
        opts = self.options
        if opts.warmup_waves and opts.batch_sizes and not self.history:
            self.before_tier(opts.batch_sizes[0])  # warm the server the first tier runs on
            self.warmup = self.warm_up(opts.batch_sizes[0])
        while (batch := self.next_batch()) is not None:
            tier = self.run_tier(batch, self.baseline)
            self.history.append(tier)
            self.ctx.run.append("tiers.jsonl", tier.to_json())
            self.on_tier(tier)
        return self.result()

    def next_batch(self) -> int | None:
        """The next tier's batch size; on the context axis, while a length is left to try."""
        opts = self.options
        if opts.axis == "context":
            found = next_length(self.history, opts.context_lengths)
            return opts.batch_sizes[0] if found is not None and opts.batch_sizes else None
        return next_tier(self.history, opts.batch_sizes)

    def result(self) -> LadderResult:
        passing = [t.stats for t in self.history if t.passed]
        opts = self.options
        return LadderResult(
            tuple(self.history),
            axis_stopped_by(self.history, opts.context_lengths)
            if opts.axis == "context"
            else stopped_by(self.history, opts.batch_sizes),
            self.monitor.source,
            tuple(mismatch_notes(self.history)),
            self.options.require_match,
            len(self.incidents.written),
            self.warmup,
            self.plan.recorded(passing),
            self.plan.details(),
            self.options.axis,
            self.options.stream_check,
            self.options.slo,
            self.options.gain_min,
        )

    def warm_up(self, batch: int) -> WarmUp:
        """Waves of the first tier that load weights, kernels and connections; not counted."""
        items: list[ItemResult] = []
        total_s = 0.0
        for _ in range(self.options.warmup_waves):
            answered, seconds = self.send_wave(batch)
            if not items and all_refused(answered):
                raise unreachable(answered[0].error, self.ctx.config.target.base_url)
            items += answered
            total_s += seconds
        errors = sum(1 for i in items if not i.ok)
        if errors:
            log.warning("warm-up: %d of %d requests failed (not counted)", errors, len(items))
        return WarmUp(self.options.warmup_waves, len(items), errors, total_s)

    def preemption_counter(self) -> Gauge | None:
        if self.preemptions is not None:
            return self.preemptions()
        client = self.ctx.client
        return read_preemptions(lambda: client.get_text("/metrics"))

    def run_tier(self, batch: int, baseline: str | None) -> Tier:
        """The tier's rounds (more, up to ``round_bound``, while they disagree on a rise in
        time per item), the server's preemptions during them, and the verdict."""
        opts = self.options
        if self.before_tier(batch) and self.history and opts.warmup_waves:
            self.warm_up(batch)  # a restarted engine is cold again: warm it, count nothing
        before = self.preemption_counter()
        last = self.history[-1] if self.history else None
        previous = last.stats if last else None
        previous_rounds = last.rounds if last else ()
        rounds: list[Stats] = []
        items_all: list[ItemResult] = []
        peaks: list[WindowPeak] = []
        while True:
            round_no = len(rounds) + 1
            items, seconds, waves, peak = self.run_round(batch, round_no)
            stats = self.measured(batch, round_no, items, seconds, [peak], baseline, waves)
            self.ctx.run.append(
                "rounds.jsonl", {**stats.to_json(), "vram_source": self.monitor.source}
            )
            rounds.append(stats)
            items_all += items
            peaks.append(peak)
            if stats.errors:  # a failed round fails the tier; another round only adds load
                break
            if round_no < opts.rounds:
                continue
            if round_no >= opts.round_bound:
                break
            agg = self.aggregate(batch, rounds, items_all, peaks, baseline)
            seen = latency_seen(agg, previous, rounds, previous_rounds, opts.latency_rise)
            if seen != "unsure":
                break
            log.info("batch %d: its rounds disagree on the time per item; one more round", batch)
        agg = self.aggregate(batch, rounds, items_all, peaks, baseline)
        after = self.preemption_counter()
        if before is not None and after is not None:
            agg = replace(
                agg,
                preemptions=max(0, round(after.value - before.value)),
                preemption_metric=after.metric,
            )
        verdict, reason = tier_verdict(
            agg,
            previous,
            vram_limit=opts.vram_limit,
            latency_rise=opts.latency_rise,
            slo=opts.slo,
            rounds_run=len(rounds),
            rounds_planned=opts.rounds,
            rounds=rounds,
            previous_rounds=previous_rounds,
            cap=self.cap if opts.axis == "batch" else None,
        )
        if opts.axis == "context":  # said of the input length, not of "batch 1"
            reason = relabel(reason, batch, agg.input_tokens_target)
        copies = self.copies(batch) if verdict != "fail" else None  # a failed tier: no more load
        return Tier(agg, tuple(rounds), verdict, reason, opts.rounds, copies)

    def copies(self, batch: int) -> DeterminismCheck | None:
        """[determinism] copies of the fixed prompt in waves of B after the tier's rounds,
        between measured waves as the canary is (SPEC §13); None when off."""
        opts = self.options
        if not opts.determinism_copies or opts.axis != "batch":
            return None
        how = CopiesWave(opts.determinism_copies, opts.mode, opts.stream, opts.stream_options)
        return send_copies(
            self.ctx,
            self.sender,
            self.incidents,
            how,
            batch,
            lambda item, in_flight: item_record(self.ctx, item, batch, in_flight, None),
        )

    def aggregate(
        self,
        batch: int,
        rounds: Sequence[Stats],
        items: Sequence[ItemResult],
        peaks: list[WindowPeak],
        baseline: str | None,
    ) -> Stats:
        """A tier's stats over its rounds so far."""
        total_s, waves = sum(r.total_s for r in rounds), sum(r.waves or 0 for r in rounds)
        return self.measured(batch, None, items, total_s, peaks, baseline, waves)

    def measured(
        self,
        batch: int,
        round_no: int | None,
        items: Sequence[ItemResult],
        total_s: float,
        peaks: list[WindowPeak],
        baseline: str | None,
        waves: int,
    ) -> Stats:
        """A round's (or, ``round_no`` None, a tier's) stats, with goodput under the SLOs
        (none without): the requests that met every SLO over ``total_s``, the window its
        ``items_per_s`` divides by (a round: the sum of its waves' wall times, first send to
        last answer; a tier: the sum of its rounds'), counted over the same items (the canaries
        left out, as ``summarise`` does)."""
        stats = summarise(
            batch_size=batch,
            concurrency=self.in_flight(batch),
            round_no=round_no,
            items=items,
            total_s=total_s,
            peaks=peaks,
            baseline_text=baseline,
            waves=waves,
        )
        work = [i for i in items if i.role != "canary"]
        return with_goodput(stats, self.options.slo, work, stats.total_s)

    def tier_sizes(self) -> TokenRange | None:
        """The input length of the tier being run on the context axis (None on the batch axis)."""
        if self.options.axis != "context":
            return None
        length = next_length(self.history, self.options.context_lengths)
        return TokenRange(length, length) if length is not None else None

    def wave_requests(self, batch: int) -> list[Request]:
        """One measured wave (one batch at a time, SPEC §5.0): ``batch`` workload items, each
        its own prompt. The canary never rides in it (``canary_requests``)."""
        ctx, opts = self.ctx, self.options
        prompts, targets = self.plan.prompts(batch, self.issued, self.tier_sizes())
        self.issued += batch
        return self.plan.requests(
            ctx.client,
            ctx.config.target.model,
            ctx.params,
            [prompts],
            targets,
            opts.mode,
            stream=opts.stream,
            stream_options=opts.stream_options,
        )

    def canary_requests(self, first_index: int) -> list[Request]:
        """The fixed prompt alone, the canary for batch invariance under a workload other than
        the fixed prompt when a baseline exists (SPEC §5.3, §5.11); none otherwise."""
        ctx, opts = self.ctx, self.options
        if self.plan.spec.fixed or self.baseline is None:
            return []
        return build_requests(
            ctx.client,
            ctx.config.target.model,
            ctx.params,
            [[ctx.config.prompt.text]],
            "wave",
            stream=opts.stream,
            stream_options=opts.stream_options,
            first_index=first_index,
            role="canary",
        )

    def send_canary(self, batch: int, round_no: int, first_index: int) -> list[ItemResult]:
        """The round's canary, sent alone after its measured waves: compared with the baseline
        and counted in errors, but in no wall time, in-flight count or per-item time."""
        requests = self.canary_requests(first_index)
        if not requests:
            return []
        answered, _ = self.sender.send(requests, 1, self.ctx.params.max_tokens)
        answered = self.incidents.classify(answered)
        for item in answered:
            self.ctx.run.append("records.jsonl", item_record(self.ctx, item, batch, 1, round_no))
        return answered

    def in_flight(self, batch: int) -> int:
        """Requests in flight at once: B in wave mode, one request of B prompts in prompt-list."""
        return 1 if self.options.mode == "prompt-list" else batch

    def send_wave(self, batch: int) -> tuple[list[ItemResult], float]:
        """One wave: all its requests released together, every answer awaited."""
        requests = self.wave_requests(batch)
        return self.sender.send(requests, len(requests), self.ctx.params.max_tokens)

    def run_round(
        self, batch: int, round_no: int
    ) -> tuple[list[ItemResult], float, int, WindowPeak]:
        """Waves of ``batch`` until the round has lasted ``min_round_s`` (at least one wave).

        The round's time is the sum of its waves' wall times (first send to last answer): the
        moments calibrate spends between waves writing records are not the server's.
        Returns (items, seconds, waves, VRAM peak).
        """
        ctx = self.ctx
        concurrency = self.in_flight(batch)
        idle = self.monitor.open_window()
        items: list[ItemResult] = []
        total_s = 0.0
        waves = 0
        while True:
            answered, seconds = self.send_wave(batch)
            if not self.history and not self.warmup and not items and all_refused(answered):
                self.monitor.close_window(idle)
                raise unreachable(answered[0].error, ctx.config.target.base_url)
            # item times and numbers run on across the round's waves
            answered = [shifted(i, len(items), total_s) for i in answered]
            answered = self.incidents.classify(answered)  # a dead server's failures say so
            for item in answered:
                ctx.run.append(
                    "records.jsonl", item_record(ctx, item, batch, concurrency, round_no)
                )
            items += answered
            total_s += seconds
            waves += 1
            if any(not i.ok for i in answered) or total_s >= self.options.min_round_s:
                break
        peak = self.monitor.close_window(idle)
        self.incidents.record(
            items, batch_size=batch, concurrency=concurrency, round_no=round_no, peak=peak
        )
        canary = self.send_canary(batch, round_no, len(items) + 1)
        self.incidents.record(canary, batch_size=batch, concurrency=1, round_no=round_no, peak=peak)
        return [*items, *canary], total_s, waves, peak


def shifted(item: ItemResult, index_by: int, seconds: float) -> ItemResult:
    """An item of a later wave, numbered and timed from the start of its round."""
    return replace(
        item,
        index=item.index + index_by,
        started_s=item.started_s + seconds,
        done_s=item.done_s + seconds,
    )


def item_record(
    ctx: StageContext, item: ItemResult, batch: int, concurrency: int, round_no: int | None
) -> dict[str, Any]:
    """The SPEC §4.1 record of one item, with the sampling parameters its body carried."""
    sent = item.body.get("max_tokens")
    params = ctx.params
    if isinstance(sent, int) and not isinstance(sent, bool) and sent != params.max_tokens:
        params = replace(params, max_tokens=sent)  # a forced answer length (SPEC §5.11)
    return RequestRecord(
        run_id=ctx.run.run_id,
        ts=utc_now_iso(),
        stage=ctx.run.stage,
        target=ctx.target,
        prompt=item.prompt,
        params=params,
        text=item.text,
        finish_reason=item.finish_reason,
        usage=item.usage,
        elapsed_s=item.elapsed_s,
        ttft_s=item.ttft_s,
        served_model=item.served_model,
        system_fingerprint=item.system_fingerprint,
        batch_size=batch,
        concurrency=concurrency,
        round=round_no,
        ok=item.ok,
        error=item.error,
        input_tokens_target=item.input_tokens_target,
        canary=item.role == "canary",
        times=item.times,
    ).to_json()


def all_refused(items: Sequence[ItemResult]) -> bool:
    """Nothing answered at all: no server, which is exit 4 rather than a failing tier."""
    return bool(items) and all(i.error is not None and i.error.kind == "connect" for i in items)
