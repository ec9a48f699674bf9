"""The flags ladder and sweep share: the workload (SPEC §5.11), the ladder's context axis, and
the measuring flags (``--vram-source``, ``--compare`` …) as a ``MeasureSpec``."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from calibrate.cli.flags import add_force, add_junit, add_wide
from calibrate.cli.flags.workers import workers_count
from calibrate.config import Config, normal_url
from calibrate.gpu.energy import PRICE_HELP
from calibrate.io.journal.replay import read_job_trace
from calibrate.load.procs.worker_count import RATE_PER_WORKER, SLOTS_PER_WORKER
from calibrate.stages.measure.tier_run import MeasureSpec, preflight
from calibrate.stages.measure.tier_stage.compare_tiers import TableKind, read_table
from calibrate.workload import (
    MAX_INPUT_TOKENS,
    MAX_OUTPUT_TOKENS,
    PICKS,
    AxisFlags,
    ResolvedWorkload,
    WorkloadFlags,
    resolve_workload_flags,
)


def add_workload_args(parser: argparse.ArgumentParser, kind: str) -> None:
    add = parser.add_argument
    pick = "longest" if kind == "ladder" else "sample"
    add(
        "--tasks",
        metavar="FILE",
        help="real inputs: a batch input file (id, text, prompt?), sent as batch sends them "
        "(default: the fixed prompt, every output also compared with the baseline)",
    )
    add(
        "--pick",
        choices=PICKS,
        default=None,
        help=f"which tasks: longest (the worst case for memory) or a seeded sample "
        f"(default {pick})",
    )
    add(
        "--prompt",
        default=None,
        metavar="TEXT",
        help="with --tasks: put before each item's text, as batch --prompt does",
    )
    add(
        "--input-tokens",
        metavar="N|A:B",
        help=f"synthetic prompts of N tokens (or uniform in A:B; at most {MAX_INPUT_TOKENS}), "
        "sized against the server's own token count",
    )
    add(
        "--output-tokens",
        type=int,
        metavar="M",
        help=f"force answers to M tokens where the engine allows (at most {MAX_OUTPUT_TOKENS}; "
        "default with --input-tokens: [prompt].max_tokens)",
    )
    add(
        "--shared-prefix",
        type=float,
        metavar="F",
        help="synthetic prompts share their first fraction F (0–1; default 0: all unique)",
    )
    add(
        "--prefix-tokens",
        type=int,
        metavar="P",
        help="synthetic or replayed prompts all start with the same P tokens (a long system "
        "prompt, a few-shot block), as a job with one instruction before every item: an engine's "
        "prefix cache is measured as the job will use it (with --tasks the shared prefix is "
        "--prompt)",
    )
    add(
        "--replay",
        metavar="JOURNAL",
        help="measure on a finished batch's own items: each one's input and output tokens "
        "(and, for --rates, when each was sent) from its journal (batch --out, or a Batch API "
        "output file)",
    )
    if kind == "ladder":
        add(
            "--axis",
            choices=("batch", "context"),
            default="batch",
            help="batch: step the batch size (default); context: step the input length",
        )
        add(
            "--context-lengths",
            metavar="N,N,…",
            help="with --axis context: the input lengths (default 512, 1024, 2048, … up to "
            "the server's max_model_len)",
        )
        add(
            "--batch",
            type=int,
            metavar="B",
            help="with --axis context: the batch size to step the length at (default 1)",
        )


def resolved_workload(args: argparse.Namespace, cfg: Config, kind: str) -> ResolvedWorkload:
    """The workload flags (and the ladder's axis flags), read once, over [workload]: exit 2 on
    anything out of bounds."""
    flags = WorkloadFlags(
        tasks=args.tasks,
        pick=args.pick,
        input_tokens=args.input_tokens,
        output_tokens=args.output_tokens,
        shared_prefix=args.shared_prefix,
        prompt=args.prompt,
        prefix_tokens=args.prefix_tokens,
        replay=args.replay,
    )
    ladder = kind == "ladder"
    resolved = resolve_workload_flags(
        cfg.workload.flags(),
        flags,
        AxisFlags(args.axis, args.context_lengths, args.batch) if ladder else AxisFlags(),
        default_pick="longest" if ladder else "sample",
        max_tokens=cfg.prompt.max_tokens,
    )
    if resolved.replay is None:
        return resolved
    # the journal is read now, once: a file with nothing to replay is exit 2 before anything
    trace = read_job_trace(resolved.replay, seed=resolved.spec.seed)
    return replace(resolved, spec=replace(resolved.spec, trace=trace))


def add_slo_arg(parser: argparse.ArgumentParser) -> None:
    """``--slo NAME:S …``: latency SLOs per request over [slo] (ladder, sweep, tune alike)."""
    parser.add_argument(
        "--slo",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME:S",
        help="latency SLOs per request over [slo], e.g. --slo ttft:0.5 tpot:0.05 e2e:20; "
        "goodput counts the requests that met every one",
    )


def add_tier_args(parser: argparse.ArgumentParser, kind: str) -> None:
    """The flags ladder and sweep share: the workload, streaming, SLOs, measuring, --compare."""
    add = parser.add_argument
    add_workload_args(parser, kind)
    add(
        "--no-stream",
        action="store_true",
        help="do not stream (SSE): no TTFT, TPOT or ITL (default: streamed where the server can)",
    )
    add_slo_arg(parser)
    add(
        "--vram-source",
        choices=("auto", "nvml", "metrics", "none"),
        default="auto",
        help="where VRAM comes from (default auto: NVML and the server's /metrics when they answer)",
    )
    add(
        "--gpu",
        metavar="ID",
        action="append",
        default=None,
        help="NVML device index, GPU- or MIG- UUID the server uses (repeatable; default: the "
        "managed server's CUDA_VISIBLE_DEVICES, else all). NVML numbers devices in nvidia-smi "
        "order and ignores CUDA_VISIBLE_DEVICES: UUIDs are safest",
    )
    add(
        "--gpu-metrics-url",
        metavar="URL",
        help="a DCGM exporter (…/metrics) for GPUs on another machine",
    )
    add("--gpu-price-per-hour", type=float, metavar="USD", help=PRICE_HELP)
    add(
        "--conservative",
        action="store_true",
        help="when the machine's noise leaves the verdict inconclusive (exit 1), take the "
        "conservative answer instead — the smaller setting the runs cannot tell from the best — "
        "recorded in the ledger as taken under noise",
    )
    add(
        "--server-pid",
        metavar="PID",
        type=int,
        help="the server's process id, recorded in incidents (default: runs/server.pid, or NVML)",
    )
    add(
        "--compare",
        metavar="CSV",
        help=f"fail when worse than this committed tier table (e.g. baselines/{kind}.csv)",
    )
    add(
        "--tolerance",
        type=float,
        default=0.2,
        metavar="FRACTION",
        help="with --compare: allowed worsening per tier (default 0.2 = 20%%)",
    )
    add(
        "--save-baseline",
        action="store_true",
        help=f"write this run's table to baselines/{kind}.csv (the old one is kept)",
    )
    add(
        "--workers",
        type=workers_count,
        default=1,
        metavar="N|auto",
        help=(
            "send each level from N processes that split its concurrency or rate (auto: one "
            f"per {SLOTS_PER_WORKER} in flight or {RATE_PER_WORKER:g} req/s of the highest level"
            if kind == "sweep"
            else "send each wave from N processes that split it (auto: one per "
            f"{SLOTS_PER_WORKER} requests of the largest wave"
        )
        + ", at most the cores; 1, the default: this process only); for when calibrate itself "
        "is the bottleneck",
    )
    add_wide(parser)
    add_force(parser)
    add_junit(parser)


def metrics_url(args: argparse.Namespace) -> str | None:
    """--gpu-metrics-url in the form every transport sends, or exit 2 (as base_url)."""
    url = args.gpu_metrics_url
    return normal_url(url, "--gpu-metrics-url") if url is not None else None


def measure_spec(args: argparse.Namespace, kind: TableKind) -> MeasureSpec:
    """The measuring flags as a typed spec; mistakes in them are exit 2 before anything is sent
    (a --compare table that is not one of ``kind``'s too: it is read here, once)."""
    spec = MeasureSpec(
        vram_source=args.vram_source,
        gpus=tuple(args.gpu) if args.gpu else None,
        gpu_metrics_url=metrics_url(args),
        server_pid=args.server_pid,
        tolerance=args.tolerance,
        save_baseline=args.save_baseline,
        gpu_price_per_hour=args.gpu_price_per_hour,
    )
    preflight(spec)
    if not args.compare:
        return spec
    compare = Path(args.compare)  # read here, once: a table that is not one is exit 2 now
    return replace(spec, compare=compare, baseline=read_table(compare, kind))
