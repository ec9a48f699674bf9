"""Stage C: step the batch size (1→2→4→8), two rounds per tier, VRAM sampled throughout.

A warm-up wave ([ladder].warmup_waves) goes first, not counted; each round repeats waves of B
until it has lasted [ladder].min_round_s. Stops on the first failing tier, on an [slo] bound
exceeded at p99 (that tier is not kept), on VRAM pressure at [ladder].vram_limit, or when the
time per item (round wall time / items) rises by more than [ladder].latency_rise over the
previous tier; records the last passing tier. Exit 0 when a tier
passed, 1 when even the first failed or --require-match / --compare failed.

example: calibrate ladder --junit runs/ladder.xml --compare baselines/ladder.csv
"""

from __future__ import annotations

import argparse
from typing import Any

from calibrate.cli.common import (
    Output,
    add_command,
    add_force,
    add_junit,
    junit_suite,
    kept_on_write_error,
    load_lock,
    open_stage,
    output_for,
    save_junit,
)
from calibrate.cli.tier_output import (
    add_tier_args,
    finish_run,
    measure_spec,
    shown_by,
    tasks_from,
    watching,
)
from calibrate.errors import ExitCode, Interrupted
from calibrate.junit import JUnitCase, JUnitSuite
from calibrate.pipeline import next_after
from calibrate.report import live_rows
from calibrate.selfload import SelfLoadMonitor
from calibrate.stages.compare_tiers import TierComparison
from calibrate.stages.context import StageContext
from calibrate.stages.incidents import first_error
from calibrate.stages.ladder import Ladder, LadderOptions, LadderResult
from calibrate.stages.tier_run import MeasureSpec
from calibrate.stages.waves import Sender


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "ladder", __doc__ or "", run)
    parser.add_argument("--require-match", action="store_true",
                        help="fail when any output differs from the single-call baseline")  # fmt: skip
    add_tier_args(parser, "ladder")
    add_force(parser)
    add_junit(parser)


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    spec = measure_spec(args)
    tasks = tasks_from(args)
    ctx = open_stage(args, "ladder", out)
    options = LadderOptions.from_config(ctx.config, tasks=tasks, require_match=args.require_match)
    with load_lock(ctx), kept_on_write_error(ctx), watching(spec, ctx, out) as watch:
        ladder = Ladder(ctx, options, watch.monitor, watch.incidents, Sender(ctx.client))
        out.say(f"ladder: batch sizes {', '.join(map(str, options.batch_sizes))}, {options.rounds} "
                f"rounds each of ≥ {options.min_round_s:g} s, one batch at a time, {options.mode} mode"
                + (f", {options.warmup_waves} warm-up wave(s) first" if options.warmup_waves else "")
                + (", streamed for the SLOs" if options.stream else ""))  # fmt: skip
        try:
            with live_rows(out.console, "ladder", f"ladder {ctx.run.run_id}", out.is_tty) as show:
                ladder.on_tier = shown_by(watch, show, out)
                result = ladder.run()
        except KeyboardInterrupt:
            result = ladder.result()
            _finish(args, spec, out, ctx, result, watch.selfload, interrupted=True)
            raise Interrupted(f"ladder interrupted after {len(result.tiers)} finished tier(s), "
                              f"recorded as not passed; completed rounds are kept in {ctx.run.path}",
                              "Run it again to calibrate: calibrate ladder") from None  # fmt: skip
        return _finish(args, spec, out, ctx, result, watch.selfload)


def _finish(
    args: argparse.Namespace,
    spec: MeasureSpec,
    out: Output,
    ctx: StageContext,
    result: LadderResult,
    selfload: SelfLoadMonitor,
    *,
    interrupted: bool = False,
) -> int:
    rows = [{**t.to_json(), "vram_source": result.vram_source} for t in result.tiers]
    comparison, entry = finish_run(
        spec,
        out,
        ctx,
        "ladder",
        rows,
        result.vram_source,
        passed=result.passed,
        summary=result.summary().to_json(),
        notes=list(result.notes),
        selfload=selfload,
        interrupted=interrupted,
    )
    suite = _junit(ctx, result, comparison)
    if interrupted:
        suite.check("the ladder ran to the end", False, "interrupted", kind="interrupted")
        save_junit(args, suite)
        return int(ExitCode.INTERRUPTED)
    save_junit(args, suite)
    top = result.last_passing
    if top is not None:
        why = (
            "every tier passed"
            if result.stopped_by == "completed"
            else f"stopped by {result.stopped_by}: {result.tiers[-1].reason}"
        )
        out.ok(
            f"last passing tier: batch {top.batch_size}, concurrency {top.stats.concurrency} ({why})"
        )
        if result.incidents:
            out.say(f"{result.incidents} incident bundle(s) in {ctx.run.file('incidents')}")
            _say_first_error(out, ctx)
    else:
        out.fail(f"ladder failed: {result.tiers[-1].reason if result.tiers else 'no tier ran'}")
        out.say(f"incidents: {ctx.run.file('incidents')}")
        _say_first_error(out, ctx)
    if result.match_failed:
        out.fail("--require-match: outputs differ from the baseline")
    if entry.passed:
        out.say(f"next: {next_after('ladder')}")
    out.result({"passed": entry.passed, "run_id": ctx.run.run_id, **entry.summary,
                "tiers_detail": [t.to_json() for t in result.tiers]})  # fmt: skip
    return 0 if entry.passed else 1


def _say_first_error(out: Output, ctx: StageContext) -> None:
    """The kind alone (http_4xx) does not say why: show the server's own message once."""
    if message := first_error(ctx.run.file("incidents")):
        out.say(f"first error: {message}")


def _junit(
    ctx: StageContext, result: LadderResult, comparison: TierComparison | None
) -> JUnitSuite:
    """One testcase per tier and round; rounds not run after a failure are skipped."""
    suite = junit_suite("ladder", ctx.run, ctx.target)
    for tier in result.tiers:
        for stats in tier.rounds:
            name = f"batch {tier.batch_size} round {stats.round}"
            reason = (f"batch {tier.batch_size} round {stats.round}: {stats.errors} of "
                      f"{stats.items} requests failed ({stats.kinds_text})")  # fmt: skip
            suite.check(name, not stats.errors, reason, kind=",".join(stats.error_kinds),
                        time_s=stats.total_s)  # fmt: skip
        for skipped in range(len(tier.rounds) + 1, tier.rounds_planned + 1):
            suite.add(JUnitCase(f"batch {tier.batch_size} round {skipped}", "calibrate.ladder",
                                skipped="not run: an earlier round of this tier failed"))  # fmt: skip
    if result.require_match:
        suite.check("outputs match the single-call baseline", not result.match_failed,
                    "; ".join(result.notes), kind="baseline_mismatch")  # fmt: skip
    if comparison is not None:
        suite.check(f"no regression against {comparison.baseline_path}", comparison.passed,
                    "; ".join(comparison.problems), kind="regression")  # fmt: skip
    return suite
