"""The flags of ``calibrate sweep``, and the one typed ``SweepSpec`` they make (exit 2 on a
mistake, before anything is written or sent)."""

from __future__ import annotations

import argparse
from typing import Any

from calibrate.cli.flags import Runner, add_command
from calibrate.cli.flags.workload import add_tier_args, measure_spec, resolved_workload
from calibrate.config import MAX_BATCH_SIZE, Config, SloConfig
from calibrate.errors import UsageError
from calibrate.io.tasks import pool_for
from calibrate.load.arrivals import ARRIVALS, Arrival
from calibrate.stages.measure.slo import has_slo, parse_slo_flags
from calibrate.stages.measure.tier_run import MeasureSpec
from calibrate.stages.sweep.auto import DEFAULT_AUTO_STEPS, MAX_AUTO_STEPS
from calibrate.stages.sweep.find_max import TOP
from calibrate.stages.sweep.rates import parse_rate_range
from calibrate.stages.sweep.spec import SweepSpec
from calibrate.workload import JobTrace


def register(subparsers: Any, doc: str, run: Runner) -> None:
    """The sweep's sub-command and its flags (the measuring ones shared with the ladder)."""
    parser = add_command(subparsers, "sweep", doc, run)
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
        f"exponential probe then bisection on [1, {TOP}] to 5 %%, ≤ 10 probes; with --rates "
        "auto (from the synchronous rate, up to 1024× it) or --rates LO:HI (req/s), the highest "
        "offered rate that meets them without saturating (not with --concurrency or --auto)",
    )
    parser.add_argument(
        "--arrival",
        choices=ARRIVALS,
        default=None,
        help="with --rates: how requests arrive (default poisson, seeded; with --replay of a "
        "journal that recorded when each item was sent, job: the job's own gaps between sends, "
        "rescaled to each rate)",
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


def check_sweep_flags(args: argparse.Namespace) -> MeasureSpec:
    """The checks that need no configuration: a flag's mistake comes before the config's."""
    measure = measure_spec(args, "sweep")
    _check_load_flags(args)
    if args.batch_size is not None and not 1 <= args.batch_size <= MAX_BATCH_SIZE:
        raise UsageError(f"--batch-size must be in [1, {MAX_BATCH_SIZE}], got {args.batch_size}")
    return measure


def sweep_spec(args: argparse.Namespace, measure: MeasureSpec, cfg: Config) -> SweepSpec:
    """The flags as one typed spec (after ``check_sweep_flags``), under ``cfg``."""
    slo = parse_slo_flags(args.slo, cfg.slo) if args.slo else None
    _check_find_max(args, slo if slo is not None else cfg.slo)
    workload = resolved_workload(args, cfg, "sweep").spec
    return SweepSpec(
        measure=measure,
        workload=workload,
        pool=pool_for(workload),  # a bad tasks file is exit 2 before anything is written
        streaming=not args.no_stream,
        slo=slo,
        batch_size=args.batch_size,
        concurrency=args.concurrency or None,
        rates=None if args.find_max else args.rates or None,
        auto_steps=args.auto_steps if args.auto else 0,
        find_max=args.find_max,
        find_max_rates=parse_rate_range(args.rates) if args.find_max and args.rates else None,
        arrival=job_arrival(args.arrival, workload.trace),
        burstiness=args.burstiness,
        seed=args.seed,
        beyond_ladder=args.beyond_ladder,
        workers=args.workers,
        conservative=args.conservative,
    )


def job_arrival(given: Arrival | None, trace: JobTrace | None) -> Arrival:
    """``--arrival``, else the replayed job's own pattern where its journal recorded one."""
    times = trace is not None and bool(trace.gaps_s())
    if given == "job" and trace is None:
        raise UsageError(
            "--arrival job follows a replayed batch's own send times: add --replay JOURNAL"
        )
    if given == "job" and not times:
        raise UsageError(
            "--arrival job: the journal records no send times (written before calibrate "
            "recorded them, or a Batch API output file)",
            "Use --arrival poisson or constant; a batch run now records them.",
        )
    return given or ("job" if times else "poisson")


def _check_load_flags(args: argparse.Namespace) -> None:
    """One load mode at a time, and --auto's step count in range (exit 2 before anything runs)."""
    given = [f for f, on in (("--concurrency", args.concurrency), ("--rates", args.rates)) if on]
    if args.find_max and (args.concurrency or args.auto):
        named = " or ".join(
            f for f, on in (("--concurrency", args.concurrency), ("--auto", args.auto)) if on
        )
        raise UsageError(
            f"--find-max picks its own levels: it cannot be given with {named}",
            "Drop one: calibrate sweep --find-max --slo ttft:0.5   or   calibrate sweep "
            "--concurrency 1,2,4",
        )
    if args.find_max and args.rates:
        parse_rate_range(args.rates)  # exit 2 before anything is written
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


def _check_find_max(args: argparse.Namespace, slo: SloConfig) -> None:
    """--find-max searches for the SLO boundary: without an SLO there is none (exit 2)."""
    if args.find_max and not has_slo(slo):
        raise UsageError(
            "--find-max needs an SLO: add [slo] ttft_p99_s = 0.1 (or tpot_p99_s, e2e_p99_s) to "
            "the config, or --slo ttft:0.1",
            "e.g. calibrate sweep --find-max --slo ttft:0.1",
        )
