"""A ladder tier's rounds: waves of B until the round lasted long enough, every item recorded
as it comes, then the canary alone (SPEC §5.3, §5.11). The ``Ladder`` is built on it."""

from __future__ import annotations

from dataclasses import replace

from calibrate.gpu.vram import VramMonitor
from calibrate.gpu.vram.peaks import WindowPeak
from calibrate.load.items import ItemResult
from calibrate.load.request import Request, build_requests
from calibrate.load.sender import Sender
from calibrate.stages.context import StageContext
from calibrate.stages.ladder.context_axis import next_length
from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.ladder.result import WarmUp
from calibrate.stages.measure.incidents import IncidentRecorder
from calibrate.stages.measure.item_records import all_refused, item_record
from calibrate.stages.measure.tier import Tier
from calibrate.stages.prepare.workload_plan import WorkloadPlan
from calibrate.stages.single import unreachable
from calibrate.workload import TokenRange


class TierRounds:
    """The rounds of a tier as the ``Ladder`` (a dataclass with these fields) runs them."""

    ctx: StageContext
    options: LadderOptions
    monitor: VramMonitor
    incidents: IncidentRecorder
    sender: Sender
    history: list[Tier]
    warmup: WarmUp | None
    plan: WorkloadPlan
    issued: int
    baseline: str | None

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
