"""Stage C′: at the verified batch size, step concurrency and find the knee (SPEC §5.6, §5.14).

Each level runs until its runs separate it from the best level below it (from two runs on;
``level_runs``), each run a closed loop of C requests in flight for at least ``level_s`` (and
4×C requests), measured over its steady window. Two levels the runs cannot tell apart are
repeated interleaved, up to ``max_repeats`` each; once every level ran, the pairs the knee
still doubts are repeated the same way (``settle``) before the verdict (``verdict.knee``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from calibrate.gpu.noise import NoiseMeter
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.gpu.vram import VramMonitor
from calibrate.load.sender import Sender
from calibrate.stages.context import StageContext
from calibrate.stages.determinism.wave import CopiesWave, send_copies
from calibrate.stages.measure.incidents import IncidentRecorder
from calibrate.stages.measure.item_records import item_record
from calibrate.stages.measure.stop_rules import ServerCap, continue_sweep
from calibrate.stages.measure.tier_run import ClientMark, client_bound_since, client_mark
from calibrate.stages.prepare.workload_plan import WorkloadPlan
from calibrate.stages.sweep.auto import run_auto
from calibrate.stages.sweep.find_max import TOP, FindMax, Probe, find_max, judge_probe, next_probe
from calibrate.stages.sweep.level_runs import LevelRaw, LevelRuns
from calibrate.stages.sweep.levels import Level
from calibrate.stages.sweep.rates import judge_rate, next_rate, round_rate, run_rate_level
from calibrate.stages.sweep.result import SweepResult
from calibrate.stages.sweep.spec import SweepOptions
from calibrate.stages.verdict.probe import judged_row
from calibrate.workload import WorkloadSpec


@dataclass
class Sweep(LevelRuns):
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
    client: ClientMark = field(default_factory=ClientMark)  # the self-checks before this level
    probes: list[Probe] = field(default_factory=list)  # --find-max: the levels probed, in order
    rate_span: tuple[float, float] = (0.0, 0.0)  # --find-max --rates: the range searched, req/s
    raw: dict[int, LevelRaw] = field(default_factory=dict)  # each level's runs so far
    noise: NoiseMeter | None = None  # the machine's own noise per run (SPEC §5.14)

    def run(self) -> SweepResult:
        self.client = client_mark(self.selfload, self.sender)
        if self.options.auto_steps:
            run_auto(self)
            return self.result()
        if self.options.find_max_top:
            self.run_find_max()
            return self.result()
        if self.options.find_max_rates is not None:
            self.run_rate_search()
            return self.result()
        rates = self.options.rates
        for step in rates or self.options.levels:
            if not continue_sweep([lv.point for lv in self.levels]):
                break
            if self.levels and self.levels[-1].saturated:
                break  # over-saturated: more load only grows the queue
            self.add(run_rate_level(self, step) if rates else self.run_level(int(step)))
        if not rates:
            self.settle()
        return self.result()

    def settle(self) -> None:
        """Repeat the pairs of levels the knee still doubts (SPEC §5.14), interleaved, until
        the runs tell them apart or their repeats are spent."""
        tried: set[tuple[int, int]] = set()
        while True:
            found = self.result().found
            pairs = [(a.concurrency, b.concurrency) for a, b in (found.doubts if found else ())]
            left = [pair for pair in pairs if pair not in tried]
            if not left:
                break
            tried.add(left[0])
            self.separate(*left[0])
        # a level run again may have moved the best below a later one: its gain says so, and
        # its line in tiers.jsonl too (the last line of a level is its row, as in tiers.csv)
        for n, level in enumerate(self.levels):
            judged = self._judged(level) if level.rate is None else level
            if (judged.gain, judged.counted) != (level.gain, level.counted):
                self.levels[n] = judged
                self.ctx.run.append("tiers.jsonl", judged.to_json())

    def run_find_max(self) -> None:
        """Probe the levels ``sweep_find_max.next_probe`` asks for; a level that breaks an SLO
        is ``stop: slo`` (as a ladder tier over its SLO)."""
        o = self.options
        top = min(o.find_max_top, self.cap.slots) if self.cap else o.find_max_top  # §5.14
        while (concurrency := next_probe(self.probes, top)) is not None:
            level = self.run_level(concurrency)
            probe = judge_probe(concurrency, level.runs, o.slo)
            while probe.straddles and len(level.runs) < o.max_repeats:
                self.note(
                    f"find-max: concurrency {concurrency}: {probe.split}; run "
                    f"{len(level.runs) + 1} of at most {o.max_repeats}"
                )
                if self.rerun_into(concurrency, self.raw[concurrency]):
                    break
                level = self._level(concurrency, self.raw[concurrency])
                probe = judge_probe(concurrency, level.runs, o.slo)
            if not probe.passed and level.verdict == "pass":
                level = replace(level, verdict="stop: slo")
            # probed out of order: no knee; its row shows the p99 the probe rule judged
            level = replace(level, stats=judged_row(level.stats, probe), gain=None, counted=False)
            self.probes.append(probe)
            self.add(level)
            self.say_probe(probe, f"concurrency {concurrency}", "meets the SLOs")

    def run_rate_search(self) -> None:
        """``--find-max --rates``: the synchronous rate first unless the range was given, then
        the rates ``rates.next_rate`` asks for; a probe over an SLO is ``stop: slo``."""
        o = self.options
        assert o.find_max_rates is not None
        bottom, top = o.find_max_rates
        if not bottom:
            sync = self.add(self.run_level(1))
            bottom = round_rate(sync.stats.items_per_s / o.prompts_per_request)
            if sync.verdict == "fail" or bottom <= 0:
                return
            top = round_rate(bottom * TOP)
            self.note(f"find-max: synchronous {bottom:g} req/s, so rates {bottom:g}–{top:g} req/s")
        self.rate_span = (bottom, top)
        while (rate := next_rate(self.probes, bottom, top)) is not None:
            level = self.self_checked(run_rate_level(self, rate))
            saturated = level.rate.why if level.rate and level.saturated else ""
            unsure = level.rate.unsure if level.rate else ""  # never a boundary it may not keep
            probe = judge_rate(rate, level.runs, o.slo, saturated, level.client_bound, unsure)
            if probe.missed and level.verdict == "pass":
                level = replace(level, verdict="stop: slo")
            self.probes.append(probe)
            self.kept(level)
            self.say_probe(probe, f"{rate:g} req/s", "meets the SLOs, not saturated")

    def say_probe(self, probe: Probe, label: str, met: str) -> None:
        verb = "breaks them" if probe.missed and not probe.errors else "fails"
        said = met if probe.passed else f"{verb}: {probe.why}"
        said += f" ({probe.split}: not sure)" if probe.straddles else ""
        self.note(f"find-max probe {len(self.probes)}: {label} {said}")

    def add(self, level: Level) -> Level:
        """A finished level: marked when calibrate itself was the bottleneck while it ran, kept,
        written to tiers.jsonl, shown."""
        return self.kept(self.self_checked(level))

    def self_checked(self, level: Level) -> Level:
        """``level`` marked client-bound when the self-check saw calibrate the bottleneck: a
        closed-loop level's own runs said so each (``rerun_into``: another level's runs again,
        interleaved with its, are that level's); any other, over the time since the last."""
        if self.selfload is None:
            return level
        bound = client_bound_since(self.selfload, self.sender, self.client)
        self.client = client_mark(self.selfload, self.sender)
        if level.rate is None and level.concurrency in self.raw:
            return level
        return replace(level, client_bound=level.client_bound or bound)

    def kept(self, level: Level) -> Level:
        """A judged level kept, written to tiers.jsonl, shown."""
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
            self.cap,
            self.monitor,
        )
        return replace(level, determinism=found)

    def result(self) -> SweepResult:
        """The levels so far; an auto sweep's in the order of its curve (synchronous, the rates,
        maximum), not the order they ran in."""
        o = self.options
        passing = [lv.stats for lv in self.levels if lv.verdict == "pass"]
        return SweepResult(
            tuple(sorted(self.levels, key=self._shown_at)),
            o.batch_size,
            o.gain_min,
            self.cap,
            self.monitor.source,
            len(self.incidents.written),
            self.plan.recorded(passing),
            self.plan.details(),
            o.slo,
            self.search(),
            o.confidence,
            o.skipped_levels,
            o.conservative,
        )

    def _shown_at(self, level: Level) -> float:
        """Where a level is shown: a find-max's by concurrency or offered rate (the synchronous
        level first), not probe order; an auto sweep's by its step."""
        if self.options.find_max_rates is not None:
            return (level.rate.offered_rate or 0.0) if level.rate else 0.0
        if self.options.find_max_top:
            return level.concurrency
        return level.auto.step if level.auto else 0

    def search(self) -> FindMax | None:
        """A find-max's result so far (None: not a find-max)."""
        o = self.options
        if o.find_max_top:
            capped = min(o.find_max_top, self.cap.slots) if self.cap else o.find_max_top
            return find_max(self.probes, o.slo, capped)
        if o.find_max_rates is None:
            return None
        bottom, top = self.rate_span
        given = f"--rates {bottom:g}:{top:g}" if o.find_max_rates[0] else "the synchronous rate"
        return find_max(self.probes, o.slo, top, over="rates", bottom=bottom, start=given)
