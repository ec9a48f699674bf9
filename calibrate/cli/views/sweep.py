"""The sweep on the command line: its plan, the levels as they finish, then the knee or the
recommendation, the JUnit report and the ``--json`` result (the stage is ``stages.sweep``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from calibrate.cli.views.determinism import say_differs
from calibrate.cli.views.pace import SweepPace
from calibrate.cli.views.tiers import TierView, check_comparison, warn_if_client_bound
from calibrate.errors import Interrupted
from calibrate.gpu.energy import cost_text
from calibrate.io.junit import JUnitSuite
from calibrate.load.arrivals import rate_text
from calibrate.numbers import rate_text as shown_rate
from calibrate.report.progress import Plan
from calibrate.stages.measure.slo import describe, has_slo
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.measure.tier_run import Measuring
from calibrate.stages.sweep import SweepOutcome
from calibrate.stages.sweep.find_max import PROBE_RULE
from calibrate.stages.sweep.levels import Level
from calibrate.stages.sweep.result import SweepResult
from calibrate.stages.sweep.spec import SweepOptions
from calibrate.workload import WorkloadSpec


class SweepView(TierView[SweepResult, SweepOptions]):
    """Watches a sweep (``stages.sweep.SweepWatcher``), then says what it found."""

    kind = "sweep"
    cap: ServerCap | None = None  # the server's own cap, when ``planned`` was told it

    def planned(self, options: SweepOptions, workload: WorkloadSpec, cap: ServerCap | None) -> None:
        capped = f"; server cap {cap.slots} ({cap.source})" if cap else ""
        self.say(f"{announce(options)}{capped}; workload: {workload.describe()}")  # as a ladder
        self.cap = cap

    @contextmanager
    def live(
        self, run_id: str, options: SweepOptions, watch: Measuring
    ) -> Iterator[Callable[[Level], None]]:
        growth = self.growth(self.cap)
        pace = SweepPace(options, planned_levels(options), growth)
        plan = replace(progress(options), pace=pace.step_s)
        self.say_plan(plan, growth)
        with self.out.live_table("sweep", f"sweep {run_id}", plan) as show:

            def on_level(level: Level) -> None:
                pace.observe(level)  # the levels left are planned from it before the bar moves
                show(level.row())
                warn_if_client_bound(self.out, watch.selfload)
                say_differs(self.out, level.determinism, level.label)

            yield on_level

    def junit(self, done: SweepOutcome, suite: JUnitSuite) -> JUnitSuite:
        result = done.result
        for lv in result.levels:
            s = lv.stats
            suite.check(
                lv.label,
                lv.verdict != "fail",  # a find-max probe over an SLO is how the search ends
                f"{lv.label}: {s.errors} of {s.items} requests failed ({s.kinds_text})",
                kind=",".join(s.error_kinds),
                time_s=s.total_s,
            )
        check_comparison(suite, done.record.comparison)
        if result.inconclusive:
            name, kind = (
                ("the runs tell the knee", "inconclusive")
                if result.doubt is not None and result.client_limit is None
                else ("calibrate was not the limit", "client_bound")
            )
            suite.check(name, False, result.inconclusive, kind=kind)
        return suite

    def interrupted(self, done: SweepOutcome) -> Interrupted:
        return Interrupted(
            f"sweep interrupted after {len(done.result.levels)} level(s), recorded as "
            f"not passed; completed levels are kept in {self.ctx.run.path}",
            "Run it again to find the knee: calibrate sweep",
        )

    def detail(self, done: SweepOutcome) -> dict[str, Any]:
        return {"levels_detail": [lv.to_json() for lv in done.result.levels]}

    def verdict(self, done: SweepOutcome) -> None:
        """The knee or the recommendation with how sure it is, or why there is none."""
        out, result, options, knee = self.out, done.result, done.options, done.result.knee
        if result.saturation_text:
            out.warn(result.saturation_text)
        if result.inconclusive:
            out.fail(f"sweep {result.inconclusive}")
            out.say(f"what to do: {result.what_to_do}")
        elif result.under_noise:
            out.warn(result.under_noise.text)
        elif result.recommendation:
            out.ok(f"recommended {result.recommendation}{_cost(result)}")
            if knee is not None and not (result.rate_mode or result.auto or result.find_max):
                self.how_sure(result, options)  # the knee of goodput, as sure as its runs
        elif knee is not None and not (result.rate_mode or result.auto or has_slo(options.slo)):
            out.ok(
                f"knee: concurrency {knee.concurrency} "
                f"({shown_rate(knee.stats.items_per_s, '.2f')} items/s median, range "
                f"{shown_rate(knee.items_per_s_min, '.2f')}–"
                f"{shown_rate(knee.items_per_s_max, '.2f')}, at batch "
                f"size {result.batch_size}); recommended concurrency {knee.concurrency}"
                f"{_cost(result)}"
            )
            self.how_sure(result, options)
        else:
            out.fail(f"sweep failed: {result.reason}")

    def how_sure(self, result: SweepResult, options: SweepOptions) -> None:
        """How sure the knee is (what --json's knee.how_sure says), the machine meanwhile, and
        the levels run again to tell a gain from noise."""
        self.out.say(f"how sure: {result.knee_text}")
        if noise := result.noise_text:
            self.out.say(noise)
        repeated = [
            f"{lv.label} ({len(lv.runs)} runs)"
            for lv in result.levels
            if len(lv.runs) > options.repeats
        ]
        if repeated:
            self.out.say(f"repeated to tell a gain from noise: {', '.join(repeated)}")


def progress(options: SweepOptions) -> Plan:
    """The progress bar's levels (a find-max probes at most 10) of repeats × level_s each."""
    if options.find_max_top:
        levels = 10
    elif options.find_max_rates is not None:
        levels = 10 + (not options.find_max_rates[0])  # the synchronous level first
    elif options.auto_steps:
        levels = options.auto_steps + 2
    else:
        levels = len(options.rates or options.levels)
    return Plan(levels, options.repeats * options.level_s, "levels")


def planned_levels(options: SweepOptions) -> tuple[float, ...]:
    """The levels in the order they run, where known before they do: a concurrency sweep's
    (a find-max searches, an auto sweep's rates come from its first levels: none)."""
    if options.find_max_top or options.find_max_rates is not None or options.auto_steps:
        return ()
    return tuple(options.rates) if options.rates else tuple(map(float, options.levels))


def announce(options: SweepOptions) -> str:
    """What the sweep will send, in one line."""
    at = f"at batch size {options.batch_size}, {options.repeats} run(s) per level"
    stream = "streamed" if options.stream else "not streamed"
    slo = f"; SLOs {describe(options.slo)} (goodput)" if has_slo(options.slo) else ""
    if options.find_max_top:
        return (
            f"sweep --find-max: the largest concurrency in 1–{options.find_max_top} that meets "
            f"{describe(options.slo)}, {at} of ≥ {options.level_s:g} s and ≥ 4×C requests, "
            f"{stream}; {PROBE_RULE}"
        )
    cap = options.max_in_flight
    capped = f", at most {cap} in flight (the ladder's)" if cap else ""
    shape = options.arrival if options.burstiness == 1 else f"gamma k={options.burstiness:g}"
    if options.find_max_rates is not None:
        low, high = options.find_max_rates
        span = f"{low:g}–{high:g} req/s" if low else "the synchronous rate … 1024× it"
        return (
            f"sweep --find-max --rates: the highest offered rate in {span} that meets "
            f"{describe(options.slo)} without saturating, {shape} arrivals, {at} of ≥ "
            f"{options.level_s:g} s, {stream}{capped}; {PROBE_RULE}"
        )
    if options.auto_steps:
        return (
            f"sweep --auto: synchronous (concurrency 1), maximum (concurrency "
            f"{options.levels[-1]}), then {options.auto_steps} {options.arrival} rate(s) "
            f"between, {at} of ≥ {options.level_s:g} s, {stream}{capped}{slo}"
        )
    if options.rates:
        return (
            f"sweep: rates {', '.join(rate_text(r) for r in options.rates)} req/s, {shape} "
            f"arrivals, {at} of ≥ {options.level_s:g} s, {stream}{capped}{slo}"
        )
    return (
        f"sweep: concurrency {', '.join(map(str, options.levels))} {at} of ≥ "
        f"{options.level_s:g} s and ≥ 4×C requests, {stream}{slo}"
    )


def _cost(result: SweepResult) -> str:
    """J per output token and $ per 1M output tokens at the recommended level (SPEC §13)."""
    return cost_text(result.best.stats) if result.best is not None else ""
