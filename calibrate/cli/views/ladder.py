"""The ladder on the command line: its plan, the tiers as they finish, then its verdict, the
JUnit report and the ``--json`` result (the stage is ``stages.ladder``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from calibrate.cli.views.determinism import say_differs
from calibrate.cli.views.pace import LadderPace
from calibrate.cli.views.tiers import TierView, check_comparison, warn_if_client_bound
from calibrate.errors import Interrupted
from calibrate.gpu.energy import cost_text
from calibrate.io.junit import JUnitCase, JUnitSuite
from calibrate.report.progress import Plan
from calibrate.stages.ladder import LadderOutcome
from calibrate.stages.ladder.context_axis import outcome as context_outcome
from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.ladder.result import LadderResult
from calibrate.stages.ladder.timeouts import timeout_advice
from calibrate.stages.measure.incidents import first_error
from calibrate.stages.measure.slo import describe, has_slo
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.measure.tier import Tier
from calibrate.stages.measure.tier_run import Measuring
from calibrate.stages.measure.tier_stage.compare_tiers import TierComparison
from calibrate.workload import WorkloadSpec


class LadderView(TierView[LadderResult, LadderOptions]):
    """Watches a ladder (``stages.ladder.LadderWatcher``), then says what it found."""

    kind = "ladder"
    cap: ServerCap | None = None  # the server's own cap, when ``planned`` was told it

    def planned(
        self, options: LadderOptions, workload: WorkloadSpec, cap: ServerCap | None
    ) -> None:
        if options.axis == "context":
            steps = f"input length at batch {options.batch_sizes[0]}"
        else:
            steps = f"batch sizes {', '.join(map(str, options.batch_sizes))}"
        warmup = f", {options.warmup_waves} warm-up wave(s) first" if options.warmup_waves else ""
        streamed = ", streamed (TTFT, TPOT, ITL)" if options.stream else ", not streamed"
        if has_slo(options.slo):
            streamed += f"; SLOs {describe(options.slo)}"
        self.say(
            f"ladder: {steps}; {options.rounds} rounds each of ≥ {options.min_round_s:g} s, one "
            f"batch at a time, {options.mode} mode{warmup}{streamed}; workload: "
            f"{workload.describe()}"
        )
        if cap is not None:
            self.say(f"the server's own cap: {cap.slots} ({cap.source}); tiers above it: stop: cap")
        self.cap = cap

    @contextmanager
    def live(
        self, run_id: str, options: LadderOptions, watch: Measuring
    ) -> Iterator[Callable[[Tier], None]]:
        growth = self.growth(self.cap)
        pace = LadderPace(options, growth)
        steps = len(options.batch_sizes)
        progress = Plan(steps, options.rounds * options.min_round_s, pace=pace.step_s)
        self.say_plan(progress, growth)
        with self.out.live_table("ladder", f"ladder {run_id}", progress) as show:

            def on_tier(tier: Tier) -> None:
                pace.observe(tier)  # the tiers left are planned from it before the bar moves
                show(tier.row(options.axis))
                warn_if_client_bound(self.out, watch.selfload)
                say_differs(self.out, tier.determinism, f"batch {tier.batch_size}")

            yield on_tier

    def junit(self, done: LadderOutcome, suite: JUnitSuite) -> JUnitSuite:
        return ladder_junit(suite, done.result, done.record.comparison)

    def interrupted(self, done: LadderOutcome) -> Interrupted:
        return Interrupted(
            f"ladder interrupted after {len(done.result.tiers)} finished tier(s), "
            f"recorded as not passed; completed rounds are kept in {self.ctx.run.path}",
            "Run it again to calibrate: calibrate ladder",
        )

    def detail(self, done: LadderOutcome) -> dict[str, Any]:
        return {"tiers_detail": [t.to_json() for t in done.result.tiers]}

    def verdict(self, done: LadderOutcome) -> None:
        """The last passing tier and the setting, or why the ladder failed."""
        out, result, top = self.out, done.result, done.result.last_passing
        if top is None:
            stop = result.stopped_at
            out.fail(f"ladder failed: {stop.reason if stop else 'no tier ran'}")
            out.say(f"incidents: {self.ctx.run.file('incidents')}")
            self.say_first_error()
        elif result.axis == "context":
            out.ok(context_outcome(result.tiers, result.longest_input_tokens, top.batch_size))
        elif result.inconclusive:
            out.say(f"last passing tier: batch {top.batch_size} (the ceiling reached)")
            out.fail(f"ladder {result.inconclusive}")
            out.say(f"what to do: {result.what_to_do}")
        else:
            stop = result.stopped_at
            why = (
                "every tier passed"
                if result.stopped_by == "completed" or stop is None
                else f"stopped by {result.stopped_by}: {stop.reason}"
            )
            chosen = result.setting or top
            now = done.setting  # the ledger's setting, as status, next: and pin will say it
            concurrency = f"concurrency {chosen.stats.concurrency}"
            if now is not None and now.batch_size == chosen.batch_size:
                concurrency = (
                    f"concurrency {now.concurrency} (from {now.concurrency_from})"
                    if now.measured_concurrency
                    else f"concurrency {now.concurrency} (no sweep at this batch size yet)"
                )
            setting = (
                f"setting: batch {chosen.batch_size}, {concurrency}"
                f"{_goodput(chosen)}{cost_text(chosen.stats)}"
            )
            if chosen.batch_size == top.batch_size:  # one line: the same tier twice says no more
                out.ok(f"{setting} — {result.setting_reason}; the last passing tier ({why})")
            else:
                out.ok(
                    f"last passing tier: batch {top.batch_size}, concurrency "
                    f"{top.stats.concurrency}{_goodput(top)} ({why})"
                )
                out.ok(f"{setting} — {result.setting_reason}")
        if top is not None and result.axis == "batch" and (noise := result.noise_text):
            out.say(noise)
        if top is not None and result.incidents:
            bundles = f"{result.incidents} incident bundle(s) in {self.ctx.run.file('incidents')}"
            message = first_error(self.ctx.run.file("incidents"))
            out.say(f"{bundles}; first error: {message}" if message else bundles)
        if result.axis == "batch":
            timeout_s = self.ctx.config.target.timeout_s
            if advice := timeout_advice(result.standing, timeout_s):
                out.say(advice)
        if result.match_failed:
            out.fail("--require-match: outputs differ from the baseline")

    def say_first_error(self) -> None:
        """The kind alone (http_4xx) does not say why: show the server's own message once."""
        if message := first_error(self.ctx.run.file("incidents")):
            self.out.say(f"first error: {message}")


def _goodput(tier: Tier) -> str:
    good = tier.stats.goodput_per_s
    return f", goodput {good:.2f} req/s within the SLOs" if good is not None else ""


def ladder_junit(
    suite: JUnitSuite, result: LadderResult, comparison: TierComparison | None
) -> JUnitSuite:
    """One testcase per tier and round; rounds not run after a failure are skipped."""
    found = result.last_passing is not None  # a failure above it is the ceiling, not a failure
    for tier in result.tiers:
        for stats in tier.rounds:
            name = f"batch {tier.batch_size} round {stats.round}"
            reason = (
                f"batch {tier.batch_size} round {stats.round}: {stats.errors} of "
                f"{stats.items} requests failed ({stats.kinds_text})"
            )
            if stats.errors and found:
                suite.add(
                    JUnitCase(
                        name,
                        "calibrate.ladder",
                        time_s=stats.total_s,
                        skipped=f"the ceiling, not a failure: {reason}",
                    )
                )
                suite.properties["ceiling"] = reason
                continue
            suite.check(
                name,
                not stats.errors,
                reason,
                kind=",".join(stats.error_kinds),
                time_s=stats.total_s,
            )
        for skipped in range(len(tier.rounds) + 1, tier.rounds_planned + 1):
            suite.add(
                JUnitCase(
                    f"batch {tier.batch_size} round {skipped}",
                    "calibrate.ladder",
                    skipped="not run: an earlier round of this tier failed",
                )
            )
    if found:
        suite.properties["stopped_by"] = result.stopped_by
        if result.stopped_by != "completed" and (stop := result.stopped_at) is not None:
            suite.properties.setdefault("ceiling", stop.reason)
    if found and (chosen := result.setting) is not None and result.axis == "batch":
        suite.properties["setting_batch_size"] = str(chosen.batch_size)
        suite.properties["setting_reason"] = result.setting_reason
    if result.inconclusive:
        suite.check("the rounds tell the setting", False, result.inconclusive, kind="inconclusive")
    if result.require_match:
        suite.check(
            "outputs match the single-call baseline",
            not result.match_failed,
            "; ".join(result.notes),
            kind="baseline_mismatch",
        )
    check_comparison(suite, comparison)
    return suite
