"""Stage C: step the batch size (1→2→4→8), two rounds per tier, VRAM sampled throughout.

A warm-up wave ([ladder].warmup_waves) goes first, not counted; each round repeats waves of B
until it has lasted [ladder].min_round_s. Stops on the first failing tier, on an [slo] bound
exceeded at p99, above the server's own cap, when the server preempts requests (those three are
not kept), on VRAM pressure at [ladder].vram_limit, or when the time per item (round wall time /
items) rises by more than [ladder].latency_rise over the previous tier beyond the spread of the
rounds. The setting is the smallest kept batch within noise of the fastest kept tier, not the
last; the ladder says which and why. Exit 0 when a tier passed, 1 when even the first failed or
--require-match / --compare failed.

The workload (SPEC §5.11): the fixed prompt (default), --tasks FILE (the longest items), or
synthetic --input-tokens N --output-tokens M; the fixed prompt is then sent alone once per round,
between the measured waves, as a canary. A managed llama.cpp restarts at --parallel B per tier.
--axis context steps the input length (512, 1k, 2k, … up to max_model_len) instead.

example: calibrate ladder --input-tokens 3000 --output-tokens 200 --junit runs/ladder.xml
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from calibrate.cli.common import (
    Output,
    add_command,
    add_force,
    add_junit,
    add_wide,
    junit_suite,
    load_config,
    open_stage,
    output_for,
    save_junit,
)
from calibrate.cli.views.determinism import say_differs, say_overall
from calibrate.cli.views.tiers import (
    add_tier_args,
    finish_run,
    live_table,
    measure_spec,
    shown_by,
    warn_if_not_streamed,
    warn_stream_check,
    watching,
)
from calibrate.cli.workload_flags import context_lengths, sized, task_pool, workload_spec
from calibrate.errors import ExitCode, Interrupted
from calibrate.gpu.energy import cost_text
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.io.junit import JUnitCase, JUnitSuite
from calibrate.load.waves import Sender
from calibrate.report.progress import Plan
from calibrate.stages.context import StageContext
from calibrate.stages.env import kept_on_write_error, load_lock
from calibrate.stages.ladder.context_axis import outcome
from calibrate.stages.ladder.run import Ladder, LadderOptions, LadderResult
from calibrate.stages.measure.compare_tiers import TierComparison
from calibrate.stages.measure.incidents import first_error
from calibrate.stages.measure.slo import describe, has_slo, parse_slo_flags
from calibrate.stages.measure.tier_run import MeasureSpec
from calibrate.stages.measure.tiers import Tier
from calibrate.stages.prepare.server_cap import ladder_cap
from calibrate.stages.prepare.stream_probe import probe_stream
from calibrate.stages.prepare.workload_plan import prepare_workload
from calibrate.state.gates import next_step
from calibrate.workload import WorkloadSpec


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "ladder", __doc__ or "", run)
    parser.add_argument(
        "--require-match",
        action="store_true",
        help="fail when any output differs from the single-call baseline",
    )
    add_tier_args(parser, "ladder")
    add_wide(parser)
    add_force(parser)
    add_junit(parser)


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    spec = measure_spec(args)
    workload = workload_spec(args, load_config(args), "ladder")
    pool = task_pool(workload)  # a bad tasks file is exit 2 before anything is written
    ctx = open_stage(args, "ladder", out)
    options = dataclasses.replace(
        LadderOptions.from_config(ctx.config, require_match=args.require_match),
        streaming=not args.no_stream,
        slo=parse_slo_flags(args.slo, ctx.config.slo),
    )
    with load_lock(ctx), kept_on_write_error(ctx), watching(spec, ctx, out) as watch:
        if args.axis == "context":
            options, workload = _context_axis(args, ctx, out, options, workload)
        plan = prepare_workload(
            ctx.config,
            ctx.client,
            workload,
            options.mode,
            ctx.params,
            pool=pool,
            probe_tokens=next(iter(options.context_lengths), None),
        )
        for note in plan.notes:
            out.warn(note)
        if options.stream:  # a server that refuses streaming is measured unstreamed, said so
            check = probe_stream(ctx, options.mode)
            options = dataclasses.replace(options, stream_check=check)
            warn_stream_check(out, check, options.slo)
        cap, restart = ladder_cap(ctx, out.say) if options.axis == "batch" else (None, None)
        ladder = Ladder(
            ctx,
            options,
            watch.monitor,
            watch.incidents,
            Sender(ctx.client),
            plan=plan,
            cap=cap,
            before_tier=restart or (lambda batch: False),
        )
        _announce(out, options, plan.spec)
        if cap is not None:
            out.say(f"the server's own cap: {cap.slots} ({cap.source}); tiers above it: stop: cap")
        axis = {"axis": options.axis}
        try:
            progress = Plan(len(options.batch_sizes), options.rounds * options.min_round_s)
            with live_table(out, "ladder", f"ladder {ctx.run.run_id}", progress) as show:
                shown = shown_by(watch, show, out, axis)

                def on_tier(tier: Tier) -> None:
                    shown(tier)
                    say_differs(out, tier.determinism, f"batch {tier.batch_size}")

                ladder.on_tier = on_tier
                result = ladder.run()
        except KeyboardInterrupt:
            result = ladder.result()
            _finish(args, spec, out, ctx, result, watch.selfload, interrupted=True)
            raise Interrupted(
                f"ladder interrupted after {len(result.tiers)} finished tier(s), "
                f"recorded as not passed; completed rounds are kept in {ctx.run.path}",
                "Run it again to calibrate: calibrate ladder",
            ) from None
        return _finish(args, spec, out, ctx, result, watch.selfload)


def _context_axis(
    args: argparse.Namespace,
    ctx: StageContext,
    out: Output,
    options: LadderOptions,
    workload: WorkloadSpec,
) -> tuple[LadderOptions, WorkloadSpec]:
    """The input lengths to step (from --context-lengths or the server's max_model_len)."""
    output = workload.output_tokens or ctx.config.prompt.max_tokens
    lengths, limit = context_lengths(args, ctx, output)
    where = f"max_model_len {limit} from /v1/models" if limit else "no max_model_len reported"
    out.say(f"context axis: input lengths {', '.join(map(str, lengths))} tokens ({where})")
    return options.on_context_axis(lengths, args.batch or 1), sized(workload, lengths)


def _announce(out: Output, options: LadderOptions, workload: WorkloadSpec) -> None:
    if options.axis == "context":
        steps = f"input length at batch {options.batch_sizes[0]}"
    else:
        steps = f"batch sizes {', '.join(map(str, options.batch_sizes))}"
    warmup = f", {options.warmup_waves} warm-up wave(s) first" if options.warmup_waves else ""
    streamed = ", streamed (TTFT, TPOT, ITL)" if options.stream else ", not streamed"
    if has_slo(options.slo):
        streamed += f"; SLOs {describe(options.slo)}"
    out.say(
        f"ladder: {steps}, {options.rounds} rounds each of ≥ {options.min_round_s:g} s, one batch "
        f"at a time, {options.mode} mode{warmup}{streamed}; workload: {workload.describe()}"
    )


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
    rows = [
        {**t.to_json(), "vram_source": result.vram_source, "axis": result.axis}
        for t in result.tiers
    ]
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
    check = result.stream_check
    warn_if_not_streamed(out, rows, not args.no_stream and (check is None or check.stream))
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
        if result.axis == "context":
            out.ok(outcome(result.tiers, result.longest_input_tokens, top.batch_size))
        else:
            chosen = result.setting or top
            out.ok(
                f"last passing tier: batch {top.batch_size}, concurrency "
                f"{top.stats.concurrency}{_goodput(top)} ({why})"
            )
            out.ok(
                f"setting: batch {chosen.batch_size}, concurrency {chosen.stats.concurrency}"
                f"{_goodput(chosen)}{cost_text(chosen.stats)} — {result.setting_reason}"
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
    checks = [(f"batch {t.batch_size}", t.determinism) for t in result.tiers if t.determinism]
    determinism = say_overall(out, ctx.config, checks)
    if determinism:  # the switch as read, beside the tiers (SPEC §13)
        ctx.run.write_json("determinism.json", determinism)
    if entry.passed:
        out.say(f"next: {next_step(ctx.config, ctx.ledger, ctx.target)}")
    out.result(
        {
            "passed": entry.passed,
            "run_id": ctx.run.run_id,
            **entry.summary,
            "tiers_detail": [t.to_json() for t in result.tiers],
            **({"determinism": determinism} if determinism else {}),
        }
    )
    return 0 if entry.passed else 1


def _goodput(tier: Tier) -> str:
    good = tier.stats.goodput_per_s
    return f", goodput {good:.2f} req/s within the SLOs" if good is not None else ""


def _say_first_error(out: Output, ctx: StageContext) -> None:
    """The kind alone (http_4xx) does not say why: show the server's own message once."""
    if message := first_error(ctx.run.file("incidents")):
        out.say(f"first error: {message}")


def _junit(
    ctx: StageContext, result: LadderResult, comparison: TierComparison | None
) -> JUnitSuite:
    """One testcase per tier and round; rounds not run after a failure are skipped."""
    suite = junit_suite("ladder", ctx.run, ctx.target)
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
        if result.stopped_by != "completed" and result.tiers:
            suite.properties.setdefault("ceiling", result.tiers[-1].reason)
    if found and (chosen := result.setting) is not None and result.axis == "batch":
        suite.properties["setting_batch_size"] = str(chosen.batch_size)
        suite.properties["setting_reason"] = result.setting_reason
    if result.require_match:
        suite.check(
            "outputs match the single-call baseline",
            not result.match_failed,
            "; ".join(result.notes),
            kind="baseline_mismatch",
        )
    if comparison is not None:
        suite.check(
            f"no regression against {comparison.baseline_path}",
            comparison.passed,
            "; ".join(comparison.problems),
            kind="regression",
        )
    return suite
