"""How a sweep runs a concurrency level (SPEC §5.6, §5.14): closed-loop runs until they separate
it from the best level below it (from two runs on), the two repeated interleaved while they
cannot (``separate``), each run measured over its steady window (``load.window``) beside the
machine's own noise (``gpu.noise``), and what every run keeps: records, incidents."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from calibrate.gpu.noise import NoiseMeter
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.gpu.vram import VramMonitor
from calibrate.gpu.vram.peaks import WindowPeak
from calibrate.load.items import ItemResult
from calibrate.load.keepalive_stall import find_stall
from calibrate.load.sender import Sender
from calibrate.load.window import (
    LevelWindow,
    level_window,
    steady_throughput,
)
from calibrate.stages.context import StageContext
from calibrate.stages.measure.incidents import IncidentRecorder
from calibrate.stages.measure.item_records import all_refused, item_record, record_round
from calibrate.stages.measure.slo import has_slo
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.measure.tier_run import client_bound_since, client_mark
from calibrate.stages.measure.tiers import Stats
from calibrate.stages.prepare.workload_plan import WorkloadPlan
from calibrate.stages.single import unreachable
from calibrate.stages.sweep.levels import Level, level_stats
from calibrate.stages.sweep.runner import LevelSupply, run_stats, whole_stats
from calibrate.stages.sweep.spec import SweepOptions
from calibrate.stages.verdict.knee import Point, best_of, gain_over, judge, spread_of
from calibrate.stages.verdict.separation import LogSpread, futile, next_of_pair


@dataclass
class LevelRaw:
    """What a level's runs left so far: its window, each run's stats, every item, the peaks."""

    window: LevelWindow
    runs: list[Stats] = field(default_factory=list)
    items: list[ItemResult] = field(default_factory=list)
    peaks: list[WindowPeak] = field(default_factory=list)
    client_bound: str = ""  # why calibrate was the limit during one of its runs ("": never)

    @property
    def failed(self) -> bool:
        return any(r.errors for r in self.runs)


class LevelRuns(LevelSupply):
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
    raw: dict[int, LevelRaw]  # each concurrency level's runs so far
    noise: NoiseMeter | None
    selfload: SelfLoadMonitor | None

    def run_level(self, concurrency: int) -> Level:
        """The level's ``repeats`` runs, then — while they cannot tell it from the best level
        below it (SPEC §5.14) — more of the two, interleaved, until they can or each has
        ``max_repeats`` (``separate``): a level stops repeating as soon as its interval
        separates. A failed run ends it (more load adds nothing); a ``--find-max`` probe or an
        ``--auto`` step is judged on its own rule."""
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
        raw = self.raw[concurrency] = LevelRaw(window)
        judged = self.judged_by_knee()
        while len(raw.runs) < o.repeats and not self.rerun_into(concurrency, raw):
            pass
        best = self.best_below(concurrency)
        over_cap = self.cap is not None and concurrency > self.cap.slots  # never the knee
        if judged and best is not None and not raw.failed and not over_cap:
            self.separate(best.concurrency, concurrency)
        return self._judged(self._level(concurrency, raw))

    def judged_by_knee(self) -> bool:
        """Whether levels are told apart by the knee rule (throughput, or goodput with SLOs):
        not a find-max probe nor an auto step, which are judged on their own rules."""
        o = self.options
        return not (o.find_max_top or o.find_max_rates is not None or o.auto_steps or o.rates)

    def point_of(self, level: Level) -> Point:
        """What the knee rule compares: throughput, or goodput under SLOs."""
        return level.goodput_point if has_slo(self.options.slo) else level.point

    def spread(self, *also: Point) -> LogSpread | None:
        """The runs' spread pooled over the levels measured so far (and ``also``)."""
        kept = [self.point_of(lv) for lv in self.levels if lv.rate is None and not lv.client_bound]
        return spread_of([*kept, *also])

    def best_below(self, concurrency: int) -> Level | None:
        """The best level measured below ``concurrency`` that the knee rule may use."""
        o = self.options
        below = [lv for lv in self.levels if lv.rate is None and lv.concurrency < concurrency]
        below = [lv for lv in below if lv.verdict == "pass" and not lv.client_bound]
        below = [lv for lv in below if not lv.capped]
        below = sorted(below, key=lambda lv: lv.concurrency)
        points = [self.point_of(lv) for lv in below]
        best = best_of(points, o.gain_min, o.confidence, self.spread())
        return next(
            (lv for lv in below if best is not None and lv.concurrency == best.concurrency), None
        )

    def current(self, concurrency: int) -> Level:
        """A level as its runs stand now (kept ones as kept, the one running from its runs)."""
        kept = next(
            (lv for lv in self.levels if lv.rate is None and lv.concurrency == concurrency), None
        )
        if kept is not None:
            return kept
        return self._level(concurrency, self.raw[concurrency])

    def separate(self, base: int, cur: int) -> bool:
        """Repeat levels ``base`` and ``cur`` — the one with fewer runs first, so A B A B … —
        until their judgement settles or both have ``max_repeats`` runs; whether it settled."""
        o = self.options
        while True:
            a, b = self.point_of(self.current(base)), self.point_of(self.current(cur))
            spread = self.spread(b)
            if judge(a, b, o.gain_min, o.confidence, spread) != "unsure":
                return True
            which = next_of_pair((len(a.runs), len(b.runs)), o.max_repeats)
            if which is None:
                return False
            if futile(a.sample, b.sample, o.gain_min, o.confidence, spread, o.max_repeats):
                self.note(
                    f"concurrency {cur} against {base}: even {o.max_repeats} runs each, as noisy "
                    "as these, could not tell them apart — not repeated"
                )
                return False
            again = (base, cur)[which]
            n = len(self.raw[again].runs) + 1
            self.note(
                f"concurrency {cur} against {base}: the runs cannot tell yet whether it adds "
                f"{o.gain_min * 100:.0f} % — run {n} of concurrency {again} (at most "
                f"{o.max_repeats}, interleaved)"
            )
            if self.rerun_into(again, self.raw[again]):
                return False
            self.refresh(again)

    def refresh(self, concurrency: int) -> None:
        """A kept level run again: its row again from all its runs (tiers.jsonl gets the new
        line, which supersedes the earlier one), said as a line (the table keeps one row a
        level; tiers.csv has the level over all its runs)."""
        for n, lv in enumerate(self.levels):
            if lv.rate is None and lv.concurrency == concurrency:
                fresh = self._level(concurrency, self.raw[concurrency])
                level = replace(
                    lv,
                    stats=fresh.stats,
                    runs=fresh.runs,
                    verdict=fresh.verdict,
                    client_bound=lv.client_bound or fresh.client_bound,
                )
                self.levels[n] = self._judged(level)
                self.ctx.run.append("tiers.jsonl", self.levels[n].to_json())
                s = self.levels[n].stats
                self.note(
                    f"concurrency {concurrency} again: {s.items_per_s:.2f} items/s over its "
                    f"{len(self.levels[n].runs)} runs"
                )
                return

    def rerun_into(self, concurrency: int, raw: LevelRaw) -> bool:
        """One more run of a level into ``raw``; True when it failed. Whether calibrate was the
        limit during it is this level's to say, whichever level runs next (``separate``
        interleaves two)."""
        client = client_mark(self.selfload, self.sender)
        stats, answered, peak = self.run_once(concurrency, len(raw.runs) + 1, raw.window)
        if not raw.client_bound:
            raw.client_bound = client_bound_since(self.selfload, self.sender, client)
        raw.runs.append(stats)
        raw.items += answered
        raw.peaks.append(peak)
        return bool(stats.errors)

    def _level(self, concurrency: int, raw: LevelRaw) -> Level:
        """The level over its runs so far, not yet judged against the levels below it."""
        o = self.options
        stats = level_stats(whole_stats(o, concurrency, raw.runs, raw.items, raw.peaks), raw.runs)
        latencies = [i.elapsed_s for i in raw.items if i.ok]
        return Level(
            stats,
            tuple(raw.runs),
            None,
            False,
            "fail" if stats.errors else "pass",
            self.cap is not None and concurrency > self.cap.slots,
            stall=find_stall(latencies),
            client_bound=raw.client_bound,
        )

    def _judged(self, level: Level) -> Level:
        """``level`` with its gain over the best level below it, and whether that counts."""
        o = self.options
        best = self.best_below(level.concurrency)
        if best is None:
            return replace(level, gain=None, counted=False)
        a, b = self.point_of(best), self.point_of(level)
        verdict = judge(a, b, o.gain_min, o.confidence, self.spread(b))
        return replace(level, gain=gain_over(a, b), counted=verdict == "gain")

    def run_once(
        self, concurrency: int, repeat: int, window: LevelWindow
    ) -> tuple[Stats, list[ItemResult], WindowPeak]:
        """One closed-loop run; its throughput is the steady window's, its noise the machine's."""
        ctx, o = self.ctx, self.options
        mark = self.noise.mark() if self.noise is not None else None
        idle = self.monitor.open_window()
        loop = self.sender.closed_loop(
            self.supply(concurrency), concurrency, window, ctx.params.max_tokens
        )
        peak = self.monitor.close_window(idle)
        noise = self.noise.since(mark) if self.noise is not None and mark is not None else None
        steady = steady_throughput(loop, concurrency * o.prompts_per_request)
        items = self.keep(
            list(loop.items), concurrency, repeat, peak, f"c{concurrency}", counted=steady.inside
        )
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
        stats = replace(stats, noise=noise)
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
        counted: Sequence[ItemResult] = (),
    ) -> list[ItemResult]:
        """Write a run's records and incidents (exit 4 when the very first run reached nothing)
        and return its items as recorded (a dead managed server's failures: ``server_died``).
        Each record carries ``tags`` (a rate level's offered rate) and the auto step, so a
        timeline finds a level's requests by the same key as its row; the answers ``counted`` in
        the run's steady window carry ``"steady": true`` (what its throughput was read from)."""
        ctx, o = self.ctx, self.options
        if not self.levels and repeat == 1 and all_refused(items):
            raise unreachable(items[0].error, ctx.config.target.base_url)
        items = self.incidents.classify(items)
        extra = {
            **(tags or {}),
            **({"auto_step": self.auto_step} if self.auto_step is not None else {}),
        }
        steady = {id(i) for i in counted}  # the same objects: only failures are re-kinded below
        for item in items:
            record = item_record(ctx, item, o.batch_size, concurrency, repeat)
            mark = {"steady": True} if id(item) in steady else {}
            ctx.run.append("records.jsonl", {**record, **extra, **mark})
        self.incidents.record(
            items,
            batch_size=o.batch_size,
            concurrency=concurrency,
            round_no=repeat,
            label=label,
            peak=peak,
        )
        return items
