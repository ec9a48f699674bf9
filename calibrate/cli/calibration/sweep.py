"""Stage C′: at the verified batch size, step concurrency (1, 2, 4, 8, 16…) and find the knee.

Each level keeps that many requests in flight (a new one as each answer arrives) for at least
[sweep].level_s seconds and 4×C requests, [sweep].repeats times; throughput is counted over the
steady window (all C in flight, before the drain) and shown as the median with its range. Each
level is judged against the best level so far, not only its neighbour: it counts as a gain when
its median adds at least [sweep].gain_min and its range sits above the best's; when the ranges
overlap but the medians differ by more than gain_min it runs again (up to [sweep].max_repeats).
The knee is the smallest level within gain_min of the best; its concurrency is the
recommendation, said with how sure it is. A level at which calibrate itself was the bottleneck
is never recommended: if that leaves the best unknown, the sweep is inconclusive (exit 1).
Stops at the first failing level.

--find-max finds the SLO boundary instead: the largest concurrency that meets every SLO
([slo] or --slo), probing 1, 8, 64, 512, 1024 until a level breaks an SLO or errors, then
bisecting between the last passing and the first failing level to within 5 % (or 1): at most 10
probes on [1, 1024]. Each probe runs [sweep].repeats times and passes when none of its requests
failed and the median over its runs of each p99 meets every SLO. The last passing level is the
recommended concurrency (pin takes it). Concurrency only: --find-max with --rates is not built.

example: calibrate sweep --stream --junit runs/sweep.xml
example: calibrate sweep --find-max --slo ttft:0.5 --beyond-ladder
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
    TierView,
    add_tier_args,
    announce,
    live_table,
    measure_spec,
    show_record,
    warn_if_client_bound,
    warn_if_not_streamed,
    warn_stream_check,
)
from calibrate.cli.workload_flags import task_pool, workload_spec
from calibrate.config import MAX_BATCH_SIZE, Config
from calibrate.errors import ExitCode, GateClosed, Interrupted, UsageError
from calibrate.gpu.energy import cost_text
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.load.arrivals import parse_counts, parse_rates, rate_text
from calibrate.load.waves import Sender
from calibrate.report.progress import Plan
from calibrate.stages.context import StageContext
from calibrate.stages.env import kept_on_write_error, load_lock
from calibrate.stages.measure.slo import describe, has_slo, parse_slo_flags
from calibrate.stages.measure.tier_finish import finish_tiers, write_determinism
from calibrate.stages.measure.tier_run import MeasureSpec, measuring
from calibrate.stages.prepare.server_cap import run_at_cap
from calibrate.stages.prepare.stream_probe import probe_stream
from calibrate.stages.prepare.task_pick import TaskPool
from calibrate.stages.prepare.workload_plan import prepare_workload
from calibrate.stages.sweep.auto import DEFAULT_AUTO_STEPS, MAX_AUTO_STEPS
from calibrate.stages.sweep.find_max import PROBE_RULE, TOP
from calibrate.stages.sweep.run import Level, Sweep, SweepResult, read_server_cap, safe_levels
from calibrate.stages.sweep.spec import SweepOptions
from calibrate.state.gates import next_step
from calibrate.state.setting import latest_passing_ladder
from calibrate.workload import WorkloadSpec


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "sweep", __doc__ or "", run)
    parser.add_argument(
        "--stream", action="store_true", help="stream (SSE): the default now (--no-stream: off)"
    )
    parser.add_argument(
        "--concurrency",
        metavar="C,…",
        help="closed loop (the default mode) at these levels, e.g. 1,2,4,8 (over [sweep])",
    )
    parser.add_argument(
        "--rates",
        metavar="R,…",
        help="open loop at these request rates (req/s), e.g. 1,2,4,8,inf; stops where saturated",
    )
    parser.add_argument(
        "--auto",
        action="store_true",
        help="synchronous (concurrency 1), then maximum throughput (the in-flight count the "
        "ladder proved), then --auto-steps rates between: latency against throughput",
    )
    parser.add_argument(
        "--auto-steps",
        type=int,
        default=DEFAULT_AUTO_STEPS,
        metavar="N",
        help=f"with --auto: how many rates between synchronous and maximum (default "
        f"{DEFAULT_AUTO_STEPS})",
    )
    parser.add_argument(
        "--find-max",
        action="store_true",
        help=f"the largest concurrency that meets every SLO ([slo] or --slo, required): "
        f"exponential probe then bisection on [1, {TOP}] to 5 %%, ≤ 10 probes; concurrency "
        "only (not with --rates, --concurrency or --auto)",
    )
    parser.add_argument(
        "--arrival",
        choices=("poisson", "constant"),
        default="poisson",
        help="with --rates: how requests arrive (default poisson, seeded)",
    )
    parser.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        metavar="K",
        help="with --rates: gamma inter-arrival shape k, mean 1/rate (1 = Poisson, <1 burstier)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="with --rates: the arrival schedule's seed"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        metavar="N",
        help="override the verified batch size (default: the ladder's last passing)",
    )
    parser.add_argument(
        "--beyond-ladder",
        action="store_true",
        help="against a server calibrate does not manage, also try concurrency levels above the "
        "most requests the ladder passed with in flight (said and recorded)",
    )
    add_tier_args(parser, "sweep")
    add_wide(parser)
    add_force(parser)
    add_junit(parser)


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    spec = measure_spec(args)
    _check_load_flags(args)
    if args.batch_size is not None and not 1 <= args.batch_size <= MAX_BATCH_SIZE:
        raise UsageError(f"--batch-size must be in [1, {MAX_BATCH_SIZE}], got {args.batch_size}")
    cfg = load_config(args)
    _check_find_max(args, cfg)
    workload = workload_spec(args, cfg, "sweep")
    pool = task_pool(workload)  # a bad tasks file is exit 2 before anything is written
    ctx = open_stage(args, "sweep", out)
    with load_lock(ctx):  # held from the restart at cap B to the last level
        options = _plan(args, ctx, out)
        return _measure(args, spec, ctx, out, options, (workload, pool))


def _check_load_flags(args: argparse.Namespace) -> None:
    """One load mode at a time, and --auto's step count in range (exit 2 before anything runs)."""
    given = [f for f, on in (("--concurrency", args.concurrency), ("--rates", args.rates)) if on]
    if args.find_max and (given or args.auto):
        named = " or ".join([*given, *(["--auto"] if args.auto else [])])
        rates = " (--find-max searches concurrency only; over rates it is not built)"
        raise UsageError(
            f"--find-max picks its own levels: it cannot be given with {named}"
            + (rates if args.rates else ""),
            "Drop one: calibrate sweep --find-max --slo ttft:0.5   or   calibrate sweep "
            "--concurrency 1,2,4",
        )
    if args.auto and given:
        raise UsageError(
            f"--auto picks its own levels: it cannot be given with {' or '.join(given)}",
            "Drop one: calibrate sweep --auto   or   calibrate sweep --rates 1,2,4",
        )
    if given == ["--concurrency", "--rates"]:
        raise UsageError(
            "--concurrency and --rates are two load modes: give one",
            "calibrate sweep --concurrency 1,2,4   or   calibrate sweep --rates 1,2,4,inf",
        )
    if not 1 <= args.auto_steps <= MAX_AUTO_STEPS:
        raise UsageError(
            f"--auto-steps must be in [1, {MAX_AUTO_STEPS}], got {args.auto_steps}",
            f"e.g. --auto --auto-steps {DEFAULT_AUTO_STEPS}",
        )


def _check_find_max(args: argparse.Namespace, cfg: Config) -> None:
    """--find-max searches for the SLO boundary: without an SLO there is none (exit 2)."""
    if args.find_max and not has_slo(parse_slo_flags(args.slo, cfg.slo)):
        raise UsageError(
            "--find-max needs an SLO: add [slo] ttft_p99_s = 0.1 (or tpot_p99_s, e2e_p99_s) to "
            "the config, or --slo ttft:0.1",
            "e.g. calibrate sweep --find-max --slo ttft:0.1",
        )


def _plan(args: argparse.Namespace, ctx: StageContext, out: Output) -> SweepOptions:
    """The levels to run at the verified batch size, within what the ladder proved (SPEC §5.0)."""
    ladder = latest_passing_ladder(ctx.ledger, ctx.target)
    if ladder is None and not args.batch_size:
        raise GateClosed(
            "no verified batch size: no passing ladder found a passing tier for this target",
            "Run first: calibrate ladder   (or give --batch-size N with --force)",
        )
    top = ladder[0].last_passing if ladder else None
    batch = args.batch_size or (top.batch_size if top else 1)
    wanted = parse_counts(args.concurrency) if args.concurrency else ctx.config.sweep.concurrency
    wanted = (TOP,) if args.find_max else wanted
    managed = run_at_cap(ctx, batch, out.say, max(wanted, default=batch))
    proved = ladder[0].max_in_flight if ladder else 0
    levels, skipped = safe_levels(
        wanted,
        proved,
        managed=managed,
        beyond_ladder=args.beyond_ladder,
    )
    rates = parse_rates(args.rates) if args.rates else ()
    if rates or args.auto or args.find_max:
        skipped = ()
    if args.auto:
        levels = (1, max(1, proved or batch))
    if args.burstiness <= 0:
        raise UsageError(f"--burstiness must be above 0, got {args.burstiness:g}")
    if skipped:
        out.warn(
            f"concurrency {', '.join(map(str, skipped))} skipped: the ladder passed with at most "
            f"{ladder[0].max_in_flight if ladder else 0} requests in flight, and calibrate does "
            "not manage this server to cap it (--beyond-ladder to send them anyway)"
        )
    if args.beyond_ladder and not managed:
        out.warn("--beyond-ladder: sending more requests at once than the ladder proved (recorded)")
    capped = not managed and not args.beyond_ladder and proved > 0
    search_top = min(TOP, proved) if capped else TOP
    if args.find_max and search_top < TOP:
        out.warn(
            f"find-max searches concurrency 1–{search_top} only: the ladder passed with at most "
            f"{proved} requests in flight and calibrate does not manage this server "
            f"(--beyond-ladder to search up to {TOP})"
        )
    options = SweepOptions.from_config(
        ctx.config,
        batch,
        stream=not args.no_stream,
        ladder_run_id=ladder[1].run_id if ladder else "",
        skipped_levels=skipped,
        beyond_ladder=args.beyond_ladder and not managed,
        slo=parse_slo_flags(args.slo, ctx.config.slo),
        rates=rates,
        arrival=args.arrival,
        burstiness=args.burstiness,
        seed=args.seed,
        max_in_flight=proved if capped and (rates or args.auto) else None,
        auto_steps=args.auto_steps if args.auto else 0,
    )
    if args.find_max:  # each probe runs its repeats, no more: the knee's repeat rule is not asked
        return dataclasses.replace(
            options, levels=(search_top,), find_max_top=search_top, max_repeats=options.repeats
        )
    return dataclasses.replace(options, levels=levels)


def _measure(
    args: argparse.Namespace,
    spec: MeasureSpec,
    ctx: StageContext,
    out: Output,
    options: SweepOptions,
    workload: tuple[WorkloadSpec, TaskPool | None],
) -> int:
    with kept_on_write_error(ctx), measuring(spec, ctx) as watch:
        announce(out, watch.monitor)
        cap = read_server_cap(ctx.client.get_text)
        plan = prepare_workload(
            ctx.config, ctx.client, workload[0], options.mode, ctx.params, pool=workload[1]
        )
        for note in plan.notes:
            out.warn(note)
        if options.stream:  # a server that refuses streaming is measured unstreamed, said so
            check = probe_stream(ctx, options.mode)
            options = options.probed(check)
            warn_stream_check(out, check, options.slo)
        sweep = Sweep(
            ctx,
            options,
            watch.monitor,
            watch.incidents,
            Sender(ctx.client),
            cap,
            plan=plan,
            selfload=watch.selfload,
        )
        out.say(f"workload: {plan.spec.describe()}")
        out.say(_announce(options) + (f"; server cap {cap.slots} ({cap.source})" if cap else ""))
        try:
            with live_table(out, "sweep", f"sweep {ctx.run.run_id}", _progress(options)) as show:

                def on_level(level: Level) -> None:
                    show({**level.to_json(), "vram_source": watch.monitor.source})
                    warn_if_client_bound(out, watch.selfload)
                    say_differs(out, level.determinism, level.label)

                sweep.on_level = on_level
                sweep.note = out.say
                result = sweep.run()
        except KeyboardInterrupt:
            _finish(args, spec, out, ctx, sweep.result(), options, watch.selfload, interrupted=True)
            raise Interrupted(
                f"sweep interrupted after {len(sweep.levels)} level(s), recorded as "
                f"not passed; completed levels are kept in {ctx.run.path}",
                "Run it again to find the knee: calibrate sweep",
            ) from None
        return _finish(args, spec, out, ctx, result, options, watch.selfload)


def _finish(
    args: argparse.Namespace,
    spec: MeasureSpec,
    out: Output,
    ctx: StageContext,
    result: SweepResult,
    options: SweepOptions,
    selfload: SelfLoadMonitor,
    *,
    interrupted: bool = False,
) -> int:
    rows = [{**lv.to_json(), "vram_source": result.vram_source} for lv in result.levels]
    view = TierView(out, ctx)
    view.kind = "sweep"
    record = finish_tiers(
        spec,
        ctx,
        "sweep",
        rows,
        tables=view.tables,
        source=result.vram_source,
        passed=result.passed,
        summary=result.summary(options).to_json(),
        notes=result.notes(llamacpp=ctx.config.server.kind == "llamacpp"),
        selfload=selfload,
        interrupted=interrupted,
    )
    show_record(out, record)
    comparison, entry = record.comparison, record.entry
    warn_if_not_streamed(out, rows, options.stream)
    suite = junit_suite("sweep", ctx.run, ctx.target)
    for lv in result.levels:
        s = lv.stats
        suite.check(
            lv.label,
            lv.verdict != "fail",  # a find-max probe over an SLO is how the search ends
            f"{lv.label}: {s.errors} of {s.items} requests failed ({s.kinds_text})",
            kind=",".join(s.error_kinds),
            time_s=s.total_s,
        )
    if comparison is not None:
        suite.check(
            f"no regression against {comparison.baseline_path}",
            comparison.passed,
            "; ".join(comparison.problems),
            kind="regression",
        )
    if result.inconclusive:
        suite.check("calibrate was not the limit", False, result.inconclusive, kind="client_bound")
    if interrupted:
        suite.check("the sweep ran to the end", False, "interrupted", kind="interrupted")
    save_junit(args, suite)
    if interrupted:
        return int(ExitCode.INTERRUPTED)
    if result.saturation_text:
        out.warn(result.saturation_text)
    knee = result.knee
    if result.inconclusive:
        out.fail(f"sweep {result.inconclusive}")
        out.say(f"what to do: {result.what_to_do}")
    elif result.recommendation:
        out.ok(f"recommended {result.recommendation}{_cost(result)}")
    elif knee is not None and not (result.rate_mode or result.auto or has_slo(options.slo)):
        out.ok(
            f"knee: concurrency {knee.concurrency} ({knee.stats.items_per_s:.2f} items/s median, "
            f"range {knee.items_per_s_min:.2f}–{knee.items_per_s_max:.2f}, at batch size "
            f"{result.batch_size}); recommended concurrency {knee.concurrency}{_cost(result)}"
        )
        out.say(f"how sure: {result.knee_text}")
        repeated = [
            f"{lv.label} ({len(lv.runs)} runs)"
            for lv in result.levels
            if len(lv.runs) > options.repeats
        ]
        if repeated:
            out.say(f"repeated to tell a gain from noise: {', '.join(repeated)}")
    else:
        out.fail(f"sweep failed: {result.reason}")
    checks = [(lv.label, lv.determinism) for lv in result.levels if lv.determinism]
    found = write_determinism(ctx, checks)
    say_overall(out, found)
    determinism = found.to_json() if found else None
    if entry.passed:
        out.say(f"next: {next_step(ctx.config, ctx.ledger, ctx.target)}")
    out.result(
        {
            "passed": entry.passed,
            "run_id": ctx.run.run_id,
            **entry.summary,
            "levels_detail": [lv.to_json() for lv in result.levels],
            **({"determinism": determinism} if determinism else {}),
        }
    )
    return 0 if entry.passed else 1


def _progress(options: SweepOptions) -> Plan:
    """The progress bar's levels (a find-max probes at most 10) of repeats × level_s each."""
    if options.find_max_top:
        levels = 10
    elif options.auto_steps:
        levels = options.auto_steps + 2
    else:
        levels = len(options.rates or options.levels)
    return Plan(levels, options.repeats * options.level_s, "levels")


def _announce(options: SweepOptions) -> str:
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
    if options.auto_steps:
        cap = options.max_in_flight
        return (
            f"sweep --auto: synchronous (concurrency 1), maximum (concurrency "
            f"{options.levels[-1]}), then {options.auto_steps} {options.arrival} rate(s) "
            f"between, {at} of ≥ {options.level_s:g} s, {stream}"
            + (f", at most {cap} in flight (the ladder's)" if cap else "")
            + slo
        )
    if options.rates:
        cap = options.max_in_flight
        shape = options.arrival if options.burstiness == 1 else f"gamma k={options.burstiness:g}"
        return (
            f"sweep: rates {', '.join(rate_text(r) for r in options.rates)} req/s, {shape} "
            f"arrivals, {at} of ≥ {options.level_s:g} s, {stream}"
            + (f", at most {cap} in flight (the ladder's)" if cap else "")
            + slo
        )
    return (
        f"sweep: concurrency {', '.join(map(str, options.levels))} {at} of ≥ "
        f"{options.level_s:g} s and ≥ 4×C requests, {stream}{slo}"
    )


def _cost(result: SweepResult) -> str:
    """J per output token and $ per 1M output tokens at the recommended level (SPEC §13)."""
    return cost_text(result.best.stats) if result.best is not None else ""
