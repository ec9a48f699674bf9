"""Stage C′: at the verified batch size, step concurrency and find the knee (SPEC §5.6).

Each level runs ``repeats`` times; each run is a closed loop of C requests in flight for at
least ``level_s`` (and 4×C requests), measured over its steady window (``sweep_window``). A
level whose range overlaps the best level's while their medians differ by more than
``gain_min`` runs again, up to ``max_repeats`` (``sweep_knee``), before it is judged.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from calibrate.errors import RequestError
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.gpu.vram import VramMonitor, WindowPeak
from calibrate.http.responses import in_range
from calibrate.load.items import ItemResult
from calibrate.load.keepalive_stall import find_stall
from calibrate.load.waves import Request, Sender
from calibrate.load.window import (
    MIN_REQUESTS_PER_SLOT,
    LevelWindow,
    level_window,
    steady_throughput,
)
from calibrate.stages.context import StageContext
from calibrate.stages.determinism.wave import CopiesWave, send_copies
from calibrate.stages.ladder.run import all_refused, item_record
from calibrate.stages.measure.incidents import IncidentRecorder
from calibrate.stages.measure.stop_rules import Point, continue_sweep
from calibrate.stages.measure.tiers import Stats
from calibrate.stages.prepare.workload_plan import WorkloadPlan
from calibrate.stages.single import unreachable
from calibrate.stages.sweep.auto import run_auto
from calibrate.stages.sweep.find_max import Probe, find_max, judge_probe, next_probe
from calibrate.stages.sweep.knee import best_of, gain_over, judge, needs_repeat
from calibrate.stages.sweep.rates import run_rate_level
from calibrate.stages.sweep.result import Level, ServerCap, SweepResult, level_stats
from calibrate.stages.sweep.runner import run_stats, whole_stats
from calibrate.stages.sweep.spec import SweepOptions
from calibrate.workload import WorkloadSpec

__all__ = ["Level", "ServerCap", "Sweep", "SweepOptions", "SweepResult", "read_server_cap"]


def safe_levels(
    levels: tuple[int, ...], max_in_flight: int, *, managed: bool, beyond_ladder: bool
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(levels to run, levels skipped): SPEC §5.0's rule that the sweep never sends more at once
    than the ladder proved. A managed server runs at cap B, so extra requests queue in the
    server and every level is safe; an unmanaged one gets at most ``max_in_flight`` at once."""
    if managed or beyond_ladder or max_in_flight < 1:
        return levels, ()
    keep = tuple(c for c in levels if c <= max_in_flight)
    skipped = tuple(c for c in levels if c > max_in_flight)
    return keep or (max_in_flight,), skipped


MAX_SLOTS = 1_000_000  # a slot count past this is no count


def read_server_cap(fetch: Callable[[str], str]) -> ServerCap | None:
    """llama.cpp's ``GET /props`` total_slots, else the length of ``GET /slots``."""
    for path in ("/props", "/slots"):
        try:
            data = json.loads(fetch(path))
        except (RequestError, ValueError, RecursionError):
            continue
        slots = in_range(data.get("total_slots"), 1, MAX_SLOTS) if isinstance(data, dict) else None
        if slots is not None:  # negative, 0, huge: no cap said
            return ServerCap(slots, "llama.cpp /props total_slots")
        if isinstance(data, list) and data:
            return ServerCap(len(data), "llama.cpp /slots")
    return None


@dataclass
class Sweep:
    ctx: StageContext
    options: SweepOptions
    monitor: VramMonitor
    incidents: IncidentRecorder
    sender: Sender
    cap: ServerCap | None = None
    on_level: Callable[[Level], None] = lambda level: None
    note: Callable[[str], None] = lambda text: None  # a line for the user, as the sweep goes
    levels: list[Level] = field(default_factory=list)
    plan: WorkloadPlan = field(default_factory=lambda: WorkloadPlan(WorkloadSpec(), ""))
    issued: int = 0  # workload prompts built so far: the next one's number (its own prompt)
    auto_step: int | None = None  # --auto: the step now running (each record carries it)
    selfload: SelfLoadMonitor | None = None  # calibrate's own load: a client-bound level is marked
    selfload_mark: int = 0  # the self-check's windows before the level now running
    probes: list[Probe] = field(default_factory=list)  # --find-max: the levels probed, in order

    def run(self) -> SweepResult:
        if self.selfload is not None:
            self.selfload_mark = self.selfload.mark()
        if self.options.auto_steps:
            run_auto(self)
            return self.result()
        if self.options.find_max_top:
            self.run_find_max()
            return self.result()
        rates = self.options.rates
        for step in rates or self.options.levels:
            if not continue_sweep([lv.point for lv in self.levels]):
                break
            if self.levels and self.levels[-1].saturated:
                break  # over-saturated: more load only grows the queue
            self.add(run_rate_level(self, step) if rates else self.run_level(int(step)))
        return self.result()

    def run_find_max(self) -> None:
        """Probe the levels ``sweep_find_max.next_probe`` asks for; a level that breaks an SLO
        is ``stop: slo`` (as a ladder tier over its SLO)."""
        o = self.options
        while (concurrency := next_probe(self.probes, o.find_max_top)) is not None:
            level = self.run_level(concurrency)
            probe = judge_probe(concurrency, level.runs, o.slo)
            if not probe.passed and level.verdict == "pass":
                level = replace(level, verdict="stop: slo")
            level = replace(level, gain=None, counted=False)  # probed out of order: no knee
            self.probes.append(probe)
            self.add(level)
            verb = "fails" if probe.errors else "breaks them"
            said = "meets the SLOs" if probe.passed else f"{verb}: {probe.why}"
            self.note(f"find-max probe {len(self.probes)}: concurrency {concurrency} {said}")

    def add(self, level: Level) -> Level:
        """A finished level: marked when calibrate itself was the bottleneck while it ran, kept,
        written to tiers.jsonl, shown."""
        if self.selfload is not None:
            level = replace(level, client_bound=self.selfload.bound_since(self.selfload_mark))
            self.selfload_mark = self.selfload.mark()
        level = self.with_copies(level)
        self.levels.append(level)
        self.ctx.run.append("tiers.jsonl", level.to_json())
        self.on_level(level)
        return level

    def with_copies(self, level: Level) -> Level:
        """[determinism] copies of the fixed prompt after the level's measured window, C at a
        time (SPEC §13): in none of its figures; not sent after a failed level."""
        o = self.options
        if not o.determinism_copies or level.verdict == "fail":
            return level
        how = CopiesWave(o.determinism_copies, o.mode, o.stream, o.stream_options)
        c = max(1, level.concurrency)
        found = send_copies(
            self.ctx,
            self.sender,
            self.incidents,
            how,
            c,
            lambda item, in_flight: item_record(self.ctx, item, o.batch_size, in_flight, None),
        )
        return replace(level, determinism=found)

    def result(self) -> SweepResult:
        """The levels so far; an auto sweep's in the order of its curve (synchronous, the rates,
        maximum), not the order they ran in."""
        o = self.options
        passing = [lv.stats for lv in self.levels if lv.verdict == "pass"]
        by_probe = o.find_max_top > 0  # a find-max's levels by concurrency, not probe order
        return SweepResult(
            tuple(
                sorted(
                    self.levels,
                    key=lambda lv: lv.concurrency if by_probe else lv.auto.step if lv.auto else 0,
                )
            ),
            o.batch_size,
            o.gain_min,
            self.cap,
            self.monitor.source,
            len(self.incidents.written),
            self.plan.recorded(passing),
            self.plan.details(),
            o.slo,
            find_max(self.probes, o.slo, o.find_max_top) if by_probe else None,
        )

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
            if not needs_repeat(below, level.point, o.gain_min, repeat, o.max_repeats):
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
        best = best_of(below, self.options.gain_min)
        if best is None:
            return level
        verdict = judge(best, level.point, self.options.gain_min)
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
        ctx.run.append(
            "rounds.jsonl",
            {
                **stats.to_json(),
                "steady_window_s": round(steady.window_s, 6),
                "steady_completions": steady.completions,
                "vram_source": self.monitor.source,
            },
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
