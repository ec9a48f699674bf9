"""Stage C″: search the engine's own flags — restart per candidate, measure, rank, keep the best.

Needs a passing ladder and [server] (calibrate starts and stops the engine). First the memory
fraction (vLLM --gpu-memory-utilization, SGLang --mem-fraction-static, a custom
{memory_fraction}): the highest of [tune] memory_fractions at which the engine starts and serves
one request. Then each candidate — defaults per engine kind around the ladder's batch size;
[tune] grid and --grid KEY=V1,V2,… replace an axis (for a custom command: any {placeholder}) —
is started, warmed up, measured like the sweep at increasing concurrency (goodput under [slo]),
stopped, and proven gone. Each result is on disk as it finishes: run the same command again to
resume. --search refine measures only what the results so far point to (the neighbours of the
best, the steps halving) and stops on --patience or when no neighbour is better; --restarts caps
the restarts of any search. The ranked table goes to tiers.csv/jsonl and plot.svg, then the
Pareto front (tokens/s per user against tokens/s in all) and the point pin takes, and why.

example: calibrate tune --grid max_num_seqs=8,16,32 --grid max_num_batched_tokens=4096,8192 \\
           --budget-s 3600
example: calibrate tune --slo ttft:0.5 tpot:0.05
example: calibrate tune --search refine --restarts 12 --patience 3
"""

from __future__ import annotations

import argparse
from typing import Any

from calibrate.cli import flags, output
from calibrate.cli.flags import resolve
from calibrate.cli.flags.workload import (
    add_slo_arg,
    add_workload_args,
    metrics_url,
    resolved_workload,
)
from calibrate.cli.views.tune import show_finished, tune_env
from calibrate.config import MAX_RESTARTS, MAX_TIMEOUT_S, Config
from calibrate.engines.builders import SERVER_KINDS
from calibrate.engines.redaction import shown_command
from calibrate.errors import UsageError
from calibrate.gpu.energy import PRICE_HELP, RANK_BY
from calibrate.io.tasks import pool_for
from calibrate.stages import tune
from calibrate.stages.measure.slo import parse_slo_flags
from calibrate.stages.measure.tier_run import MeasureSpec, preflight


def register(subparsers: Any) -> None:
    parser = flags.add_command(subparsers, "tune", __doc__ or "", run)
    add = parser.add_argument
    add("--kind", choices=SERVER_KINDS, help="engine kind (overrides [server] kind)")
    add(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2,…",
        help="values to try for one flag (repeatable; replaces that axis of the defaults and "
        "[tune] grid), e.g. --grid parallel=1,2,4",
    )
    add(
        "--search",
        choices=("grid", "halving", "refine"),
        help="refine (default, [tune] search): start in the middle of every axis, then the "
        "neighbours of the best so far, the steps halving, until no neighbour is better or "
        "--patience runs out; grid: every candidate; halving: all at a short window, the better "
        "half again at twice the window, … the last two at the full window",
    )
    add(
        "--restarts",
        type=int,
        metavar="N",
        help="at most N candidate restarts in the run (a rerun continues with what is left; "
        "default [tune] restarts, 0 = none)",
    )
    add(
        "--patience",
        type=int,
        metavar="K",
        help="refine: stop after K candidates in a row without a significant gain (at least "
        "[sweep] gain_min, its interval above zero; default [tune] patience, 6)",
    )
    add(
        "--rank-by",
        choices=RANK_BY,
        default="goodput",
        help="goodput: the most requests/s within the SLOs (default; with no SLOs set, every "
        "answer counts); joules_per_token: the "
        "fewest J per output token at the best level (needs NVML or DCGM energy); usd_per_1m: "
        "the fewest $ per 1M output tokens (needs --gpu-price-per-hour or [cost]); ties and "
        "candidates not measured so go by goodput",
    )
    add(
        "--budget-s",
        type=float,
        metavar="S",
        help="cap the whole run (checked before each start; says what was left untested; "
        "default [tune] budget_s, 0 = none)",
    )
    new_help = "start a new tune run even if an unfinished one with the same grid exists"
    add("--new", action="store_true", help=new_help)
    add(
        "--stream",
        action="store_true",
        help="stream (SSE) and measure TTFT (on by itself with a TTFT or TPOT SLO)",
    )
    add_slo_arg(parser)
    add(
        "--conservative",
        action="store_true",
        help="when the runs cannot tell the first two candidates apart (noise), take the one "
        "with the smaller cap instead of exit 1; recorded as taken under noise",
    )
    add_workload_args(parser, "sweep")
    add(
        "--vram-source",
        choices=("auto", "nvml", "metrics", "none"),
        default="auto",
        help="where VRAM comes from (default auto)",
    )
    gpu_help = "NVML device index or UUID the server uses (repeatable)"
    add("--gpu", metavar="ID", action="append", default=None, help=gpu_help)
    add("--gpu-metrics-url", metavar="URL", help="a DCGM exporter for GPUs on another machine")
    add("--gpu-price-per-hour", type=float, metavar="USD", help=PRICE_HELP)
    flags.add_wide(parser)
    flags.add_force(parser)


def _request(args: argparse.Namespace, cfg: Config) -> tune.TuneRequest:
    """The flags as a typed request; mistakes in them are exit 2 before anything is sent."""
    workload = resolved_workload(args, cfg, "sweep").spec
    pool = pool_for(workload)  # a bad tasks file is exit 2 before anything is started
    if args.budget_s is not None and not 0 <= args.budget_s <= MAX_TIMEOUT_S:
        raise UsageError(f"--budget-s must be in [0, {MAX_TIMEOUT_S:g}], got {args.budget_s}")
    if args.restarts is not None and not 0 <= args.restarts <= MAX_RESTARTS:
        raise UsageError(f"--restarts must be in [0, {MAX_RESTARTS}], got {args.restarts}")
    if args.patience is not None and not 1 <= args.patience <= MAX_RESTARTS:
        raise UsageError(f"--patience must be in [1, {MAX_RESTARTS}], got {args.patience}")
    gpus, price = tuple(args.gpu) if args.gpu else None, args.gpu_price_per_hour
    spec = MeasureSpec(args.vram_source, gpus, metrics_url(args), gpu_price_per_hour=price)
    preflight(spec)
    return tune.TuneRequest(
        spec,
        kind=args.kind,
        grid=tuple(args.grid),
        search=args.search,
        budget_s=args.budget_s,
        new_run=args.new,
        stream=args.stream,
        workload=workload,
        pool=pool,
        rank_by=args.rank_by,
        slo=parse_slo_flags(args.slo, cfg.slo) if args.slo else None,
        conservative=args.conservative,
        restarts=args.restarts,
        patience=args.patience,
    )


def resume_command(args: argparse.Namespace) -> str:
    return shown_command(["calibrate", *(w for w in args.argv if w != "--new")])  # no password


def run(args: argparse.Namespace) -> int:
    out = output.output_for(args)
    cfg = resolve.load_config(args)
    request = _request(args, cfg)  # a bad flag is exit 2 before the run folder is opened
    env = tune_env(out, resolve.open_stage(args, "tune", out, cfg), resume_command(args))
    finished = tune.run(request, env)
    show_finished(out, finished)
    out.result(finished.to_json())
    return 0 if finished.passed else 1
