"""Stage C: step the batch size, two rounds per tier, VRAM sampled throughout (SPEC §5.3)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from calibrate.gpu.engine_metrics import Gauge, counted_rise, read_preemptions
from calibrate.gpu.noise import NoiseMeter, combined
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.gpu.vram import VramMonitor
from calibrate.gpu.vram.peaks import WindowPeak
from calibrate.io.baseline import read_baseline
from calibrate.load.items import ItemResult
from calibrate.load.sender import Sender
from calibrate.stages.context import StageContext
from calibrate.stages.determinism import DeterminismCheck
from calibrate.stages.determinism.wave import CopiesWave, send_copies
from calibrate.stages.ladder.context_axis import axis_stopped_by, next_length, relabel
from calibrate.stages.ladder.judging import TierJudging
from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.ladder.repeats import TierRaw, TierRepeats
from calibrate.stages.ladder.result import LadderResult, WarmUp
from calibrate.stages.ladder.rounds import TierRounds
from calibrate.stages.measure.incidents import IncidentRecorder
from calibrate.stages.measure.item_records import all_refused, item_record, record_round
from calibrate.stages.measure.slo import with_goodput
from calibrate.stages.measure.stop_rules import (
    ServerCap,
    latency_seen,
    mismatch_notes,
    next_tier,
    reached,
    stopped_by,
)
from calibrate.stages.measure.tier import Tier
from calibrate.stages.measure.tier_run import client_bound_since, client_mark
from calibrate.stages.measure.tiers import Stats, summarise
from calibrate.stages.prepare.workload_plan import WorkloadPlan
from calibrate.stages.single import unreachable
from calibrate.state.ledger import baseline_path
from calibrate.workload import WorkloadSpec

log = logging.getLogger("calibrate")


@dataclass
class Ladder(TierJudging, TierRounds, TierRepeats):
    """One ladder run; ``history`` grows as tiers finish (kept if interrupted)."""

    ctx: StageContext
    options: LadderOptions
    monitor: VramMonitor
    incidents: IncidentRecorder
    sender: Sender
    on_tier: Callable[[Tier], None] = lambda tier: None
    note: Callable[[str], None] = lambda text: None  # a line for the user, as the ladder goes
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
    # where the server is restarted per tier: the slots it runs at B, read back (None: unsaid)
    cap_at: Callable[[int], ServerCap | None] | None = None
    selfload: SelfLoadMonitor | None = None  # calibrate's own load: a client-bound tier is marked
    noise: NoiseMeter | None = None  # the machine's own noise per round (SPEC §5.14)
    raw: dict[int, TierRaw] = field(default_factory=dict)  # each tier's items and VRAM windows

    def baseline_text(self) -> str | None:
        path = baseline_path(self.ctx.config)
        if not path.exists():
            return None
        text = read_baseline(path).get("text")
        return text if isinstance(text, str) else None

    def run(self) -> LadderResult:
        self.baseline = self.baseline_text()
        opts = self.options
        if opts.mode == "prompt-list" and self.plan.spec.fixed and self.baseline is not None:
            self.baseline = self.list_baseline()
        if opts.warmup_waves and opts.batch_sizes and not self.history:
            self.before_tier(opts.batch_sizes[0])  # warm the server the first tier runs on
            self.warmup = self.warm_up(opts.batch_sizes[0])
        # settling rounds can lift the stop of the top tier (a 'stop: latency' its later rounds
        # did not bear out): the ladder then goes on up, never ending on a pass it called
        # 'interrupted' with tiers left untried
        while True:
            while (batch := self.next_batch()) is not None:
                self.climb(batch)
            self.settle()
            if self.next_batch() is None:
                break
        return self.result()

    def climb(self, batch: int) -> None:
        """Run tier ``batch`` and add it to the history."""
        mark = client_mark(self.selfload, self.sender)
        tier = self.run_tier(batch, self.baseline)
        if self.selfload is not None:
            bound = client_bound_since(self.selfload, self.sender, mark)
            tier = replace(tier, client_bound=bound)
        tier = self.accounted(tier)
        self.history.append(tier)
        self.ctx.run.append("tiers.jsonl", tier.to_json())
        self.on_tier(tier)

    def next_batch(self) -> int | None:
        """The next tier's batch size; on the context axis, while a length is left to try."""
        opts = self.options
        if opts.axis == "context":
            found = next_length(self.history, opts.context_lengths)
            return opts.batch_sizes[0] if found is not None and opts.batch_sizes else None
        return next_tier(reached(self.history), opts.batch_sizes)  # never above a failed tier

    def result(self) -> LadderResult:
        passing = [t.stats for t in self.history if t.passed]
        opts = self.options
        return LadderResult(
            tuple(self.history),
            axis_stopped_by(self.history, opts.context_lengths)
            if opts.axis == "context"
            else stopped_by(reached(self.history), opts.batch_sizes),
            self.monitor.source,
            tuple(self.mismatch_notes()),
            self.options.require_match,
            len(self.incidents.written),
            self.warmup,
            self.plan.recorded(passing),
            self.plan.details(),
            self.options.axis,
            self.options.stream_check,
            self.options.slo,
            self.options.gain_min,
            self.options.confidence,
            self.options.conservative,
            self.cap,
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

    def mismatch_notes(self) -> list[str]:
        """The tiers whose outputs differ from the baseline they were compared with: in
        prompt-list mode the fixed prompt alone in a list (``list_baseline``)."""
        notes = mismatch_notes(self.history)
        if self.options.mode != "prompt-list" or not self.plan.spec.fixed:
            return notes
        own = "the prompt-list baseline (the fixed prompt alone in one list)"
        return [note.replace("the single-call baseline", own) for note in notes]

    def list_baseline(self) -> str | None:
        """Prompt-list mode's own baseline: the fixed prompt alone in one ``/v1/completions``
        list, its text (None when it got no answer: then nothing is compared). The chat
        baseline of ``single`` went through the chat template; a raw completion of the same
        prompt never matches it, on any engine with a template ("0 of 330 outputs match the
        baseline at batch 1"): like is compared with like."""
        ctx, opts = self.ctx, self.options
        requests = self.plan.requests(
            ctx.client,
            ctx.config.target.model,
            ctx.params,
            [[ctx.config.prompt.text]],
            [None],
            "prompt-list",
            stream=opts.stream,
            stream_options=opts.stream_options,
        )
        answered, _ = self.sender.send(requests, 1, ctx.params.max_tokens)
        found = next((i.text for i in answered if i.ok and i.text), None)
        if found is None:
            log.warning("prompt-list: the fixed prompt alone got no answer; outputs not compared")
        return found

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
        self.read_cap_back(batch)
        # read after every round too: a server restarted mid-tier (an OOM, a supervisor)
        # counts again from 0, and each reading narrows what its old process took with it
        counter = [self.preemption_counter()]
        last = self.history[-1] if self.history else None
        previous = last.stats if last else None
        previous_rounds = last.rounds if last else ()
        rounds: list[Stats] = []
        items_all: list[ItemResult] = []
        peaks: list[WindowPeak] = []
        while True:
            round_no = len(rounds) + 1
            mark = self.noise_mark()
            items, seconds, waves, peak = self.run_round(batch, round_no)
            stats = self.measured(batch, round_no, items, seconds, [peak], baseline, waves)
            stats = self.with_noise(stats, mark)
            record_round(self.ctx, stats, self.monitor.source)
            rounds.append(stats)
            items_all += items
            peaks.append(peak)
            counter.append(self.preemption_counter())
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
        self.raw[batch] = TierRaw(items_all, peaks)
        if (rise := counted_rise(counter)) is not None:
            agg = replace(agg, preemptions=round(rise.value), preemption_metric=rise.metric)
        verdict, reason = self.verdict_of(agg, rounds, last)
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
            self.cap,
            self.monitor,
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
        stats = self.measured(batch, None, items, total_s, peaks, baseline, waves)
        return replace(stats, noise=combined(r.noise for r in rounds))

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
