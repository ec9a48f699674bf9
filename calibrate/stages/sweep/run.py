"""Stage C′: at the verified batch size, step concurrency and find the knee (SPEC §5.6).

Each level runs ``repeats`` times; each run is a closed loop of C requests in flight for at
least ``level_s`` (and 4×C requests), measured over its steady window (``sweep_window``). A
level whose range overlaps the best level's while their medians differ by more than
``gain_min`` runs again, up to ``max_repeats`` (``sweep_knee``), before it is judged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.gpu.vram import VramMonitor
from calibrate.load.waves import Sender
from calibrate.stages.context import StageContext
from calibrate.stages.determinism.wave import CopiesWave, send_copies
from calibrate.stages.measure.incidents import IncidentRecorder
from calibrate.stages.measure.item_records import item_record
from calibrate.stages.measure.stop_rules import ServerCap, continue_sweep
from calibrate.stages.prepare.workload_plan import WorkloadPlan
from calibrate.stages.sweep.auto import run_auto
from calibrate.stages.sweep.find_max import Probe, find_max, judge_probe, next_probe
from calibrate.stages.sweep.level_runs import LevelRuns
from calibrate.stages.sweep.levels import Level
from calibrate.stages.sweep.rates import run_rate_level
from calibrate.stages.sweep.result import SweepResult
from calibrate.stages.sweep.spec import SweepOptions
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
            bound = level.client_bound or self.selfload.bound_since(self.selfload_mark)
            level = replace(level, client_bound=bound)
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
            o.confidence,
        )
