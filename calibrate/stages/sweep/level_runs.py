"""How a sweep runs a concurrency level: the workload's requests for it, ``repeats`` closed-loop
runs (more while unsure against the best level below it), each measured over its steady window
(``load.window``), and what every run keeps: records, incidents (SPEC §5.6)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from calibrate.gpu.vram import VramMonitor, WindowPeak
from calibrate.load.items import ItemResult
from calibrate.load.keepalive_stall import find_stall
from calibrate.load.request import Request
from calibrate.load.sender import Sender
from calibrate.load.window import (
    MIN_REQUESTS_PER_SLOT,
    LevelWindow,
    level_window,
    steady_throughput,
)
from calibrate.stages.context import StageContext
from calibrate.stages.measure.incidents import IncidentRecorder
from calibrate.stages.measure.item_records import all_refused, item_record, record_round
from calibrate.stages.measure.stop_rules import Point, ServerCap
from calibrate.stages.measure.tiers import Stats
from calibrate.stages.prepare.workload_plan import WorkloadPlan
from calibrate.stages.single import unreachable
from calibrate.stages.sweep.knee import best_of, gain_over, judge, needs_repeat
from calibrate.stages.sweep.levels import Level, level_stats
from calibrate.stages.sweep.runner import run_stats, whole_stats
from calibrate.stages.sweep.spec import SweepOptions


class LevelRuns:
    """A level's runs as the ``Sweep`` (a dataclass with these fields) makes them."""

    ctx: StageContext
    options: SweepOptions
    monitor: VramMonitor
    incidents: IncidentRecorder
    sender: Sender
    cap: ServerCap | None
    note: Callable[[str], None]
    levels: list[Level]
    plan: WorkloadPlan
    issued: int
    auto_step: int | None

    def level_requests(self, concurrency: int, count: int) -> list[Request]:
        """``count`` requests of the workload for a run at ``concurrency`` (each a prompt list of
        B in prompt-list mode). A run asks again when it needs more, so each call returns fresh
        requests: every prompt its own unless the workload shares them."""
        ctx, o = self.ctx, self.options
        per_request = o.prompts_per_request
        prompts, targets = self.plan.prompts(count * per_request, self.issued)
        self.issued += count * per_request
        waves = [prompts[i : i + per_request] for i in range(0, len(prompts), per_request)]
        if o.mode != "prompt-list":
            waves = [prompts]
        model = ctx.config.target.model
        return self.plan.requests(
            ctx.client,
            model,
            ctx.params,
            waves,
            targets,
            o.mode,
            stream=o.stream,
            stream_options=o.stream_options,
        )

    def numbered(self, requests: Sequence[Request]) -> list[Request]:
        """Requests numbered from 1 across one run (item indices stay unique)."""
        out: list[Request] = []
        first = 1
        for request in requests:
            out.append(replace(request, first_index=first))
            first += len(request.prompts)
        return out

    def supply(self, concurrency: int) -> Callable[[], Request]:
        """The next request of a run, numbered from 1 across the run (item indices stay unique)."""
        pending: deque[Request] = deque()
        numbered = 0

        def next_request() -> Request:
            nonlocal numbered
            if not pending:
                pending.extend(
                    self.level_requests(concurrency, MIN_REQUESTS_PER_SLOT * concurrency)
                )
            request = replace(pending.popleft(), first_index=numbered + 1)
            numbered += len(request.prompts)
            return request

        return next_request

    def run_level(self, concurrency: int) -> Level:
        """``repeats`` runs of the level (fewer when one fails: more load adds nothing), and
        more, up to ``max_repeats``, while it is unsure against the best level so far."""
        o = self.options
        # the levels below this one (a find-max probes out of order): the window and the gain
        below_it = sorted(
            (lv for lv in self.levels if lv.rate is None and lv.concurrency < concurrency),
            key=lambda lv: lv.concurrency,
        )
        previous = below_it[-1] if below_it else None
        window = level_window(
            o.level_s, concurrency, previous.stats.latency_p50_s if previous else None
        )
        below = [lv.point for lv in below_it]
        runs: list[Stats] = []
        items: list[ItemResult] = []
        peaks: list[WindowPeak] = []
        repeat = 0
        while True:
            repeat += 1
            stats, answered, peak = self.run_once(concurrency, repeat, window)
            runs.append(stats)
            items += answered
            peaks.append(peak)
            if stats.errors:
                break
            if repeat < o.repeats:
                continue
            level = self._level(concurrency, runs, items, peaks)
            if not needs_repeat(
                below, level.point, o.gain_min, repeat, o.max_repeats, o.confidence
            ):
                break
            self.note(
                f"concurrency {concurrency}: its range overlaps the best level's while the "
                f"medians differ by more than {o.gain_min * 100:.0f} %: run {repeat + 1} of at most "
                f"{o.max_repeats}"
            )
        return self._judged(self._level(concurrency, runs, items, peaks), below)

    def _level(
        self,
        concurrency: int,
        runs: list[Stats],
        items: list[ItemResult],
        peaks: list[WindowPeak],
    ) -> Level:
        """The level over its runs so far, not yet judged against the levels below it."""
        o = self.options
        stats = level_stats(whole_stats(o, concurrency, runs, items, peaks), runs)
        latencies = [i.elapsed_s for i in items if i.ok]
        return Level(
            stats,
            tuple(runs),
            None,
            False,
            "fail" if stats.errors else "pass",
            self.cap is not None and concurrency > self.cap.slots,
            stall=find_stall(latencies),
        )

    def _judged(self, level: Level, below: list[Point]) -> Level:
        """``level`` with its gain over the best level below it, and whether that counts."""
        o = self.options
        best = best_of(below, o.gain_min, o.confidence)
        if best is None:
            return level
        verdict = judge(best, level.point, o.gain_min, o.confidence)
        return replace(level, gain=gain_over(best, level.point), counted=verdict == "gain")

    def run_once(
        self, concurrency: int, repeat: int, window: LevelWindow
    ) -> tuple[Stats, list[ItemResult], WindowPeak]:
        """One closed-loop run; its throughput is the steady window's."""
        ctx, o = self.ctx, self.options
        idle = self.monitor.open_window()
        loop = self.sender.closed_loop(
            self.supply(concurrency), concurrency, window, ctx.params.max_tokens
        )
        peak = self.monitor.close_window(idle)
        items = self.keep(list(loop.items), concurrency, repeat, peak, f"c{concurrency}")
        steady = steady_throughput(loop)
        stats = run_stats(
            o,
            concurrency,
            repeat,
            items,
            loop.total_s,
            peak,
            items_per_s=steady.items_per_s,
            output_tokens_per_s=steady.output_tokens_per_s,
            window=steady.inside,
            window_s=steady.window_s,
        )
        record_round(
            ctx,
            stats,
            self.monitor.source,
            steady_window_s=round(steady.window_s, 6),
            steady_completions=steady.completions,
        )
        return stats, items, peak

    def keep(
        self,
        items: list[ItemResult],
        concurrency: int,
        repeat: int,
        peak: WindowPeak,
        label: str,
        tags: Mapping[str, Any] | None = None,
    ) -> list[ItemResult]:
        """Write a run's records and incidents (exit 4 when the very first run reached nothing)
        and return its items as recorded (a dead managed server's failures: ``server_died``).
        Each record carries ``tags`` (a rate level's offered rate) and the auto step, so a
        timeline finds a level's requests by the same key as its row."""
        ctx, o = self.ctx, self.options
        if not self.levels and repeat == 1 and all_refused(items):
            raise unreachable(items[0].error, ctx.config.target.base_url)
        items = self.incidents.classify(items)
        extra = {
            **(tags or {}),
            **({"auto_step": self.auto_step} if self.auto_step is not None else {}),
        }
        for item in items:
            record = item_record(ctx, item, o.batch_size, concurrency, repeat)
            ctx.run.append("records.jsonl", {**record, **extra})
        self.incidents.record(
            items,
            batch_size=o.batch_size,
            concurrency=concurrency,
            round_no=repeat,
            label=label,
            peak=peak,
        )
        return items
