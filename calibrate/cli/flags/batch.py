"""The flags of ``calibrate batch``, their bounds (SPEC §11: every size and count bounded), and
the request they make."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from calibrate.cli.flags import add_command, add_junit, check_junit_path
from calibrate.cli.flags.workers import workers_count
from calibrate.config import Config
from calibrate.errors import UsageError
from calibrate.load.procs.worker_count import SLOTS_PER_WORKER
from calibrate.load.retry import RetryPolicy
from calibrate.stages.batch.plan import DRIFT_WINDOW_S, DRIFT_WINDOW_S_RANGE, MAX_CONCURRENCY
from calibrate.stages.batch.request import BatchRequest
from calibrate.stages.batch.sending.outage import (
    DEFAULT_OUTAGE_AFTER,
    DEFAULT_OUTAGE_S,
    OutagePolicy,
)

MAX_RETRIES = 100
MAX_WAIT_S = 3600.0
MAX_OUTAGE_S = 7 * 86_400.0
MAX_OUTAGE_AFTER = 10_000


def register(subparsers: Any, doc: str, run: Any) -> None:
    low, high = DRIFT_WINDOW_S_RANGE
    p = add_command(subparsers, "batch", doc, run, target=False)
    p.add_argument(
        "--base-url",
        action="append",
        metavar="URL[#c=N]",
        help="server URL, e.g. http://host:8000/v1; repeat for several servers, each "
        "optionally with its own concurrency (URL#c=8)",
    )
    p.add_argument("--model", metavar="NAME", help="model name the server registered")
    p.add_argument(
        "--input",
        required=True,
        metavar="PATH",
        help="tasks JSONL (id, text, prompt?) or OpenAI Batch API request lines (custom_id, "
        "method, url, body)",
    )
    p.add_argument("--out", metavar="PATH", help="results JSONL (appended; resumed when rerun)")
    p.add_argument(
        "--final",
        metavar="PATH",
        help="also write one result per input id in input order (last ok, else last "
        "failure): .jsonl, .csv or .parquet; ids not ok → PATH's name + .failed.jsonl",
    )
    p.add_argument("--prompt", default="", help="put before each item's text (its own line)")
    p.add_argument(
        "-c",
        "--concurrency",
        type=int,
        metavar="N",
        help="requests in flight (default: the pinned concurrency, else 4; "
        f"at most {MAX_CONCURRENCY}); with several --base-url, the fallback for those "
        "without #c=N or a calibrated setting",
    )
    p.add_argument(
        "--workers",
        type=workers_count,
        default=1,
        metavar="N|auto",
        help="send from N processes that split the concurrency (auto: one per "
        f"{SLOTS_PER_WORKER} in flight, at most the cores; 1, the default: this process only); "
        "for when calibrate itself is the bottleneck",
    )
    p.add_argument(
        "--shard",
        metavar="I/N",
        help="take only the ids whose stable hash mod N is I (0-based); one journal "
        "per shard, merged by calibrate export",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=3,
        help=f"retries of transient errors (3; at most {MAX_RETRIES})",
    )
    p.add_argument(
        "--backoff-s",
        type=float,
        default=1.0,
        metavar="S",
        help="first retry wait; doubles each retry, plus jitter (1)",
    )
    p.add_argument(
        "--outage-after",
        type=int,
        default=DEFAULT_OUTAGE_AFTER,
        metavar="N",
        help="this many refused/reset/overloaded requests in a row pause an endpoint "
        f"and probe it until it answers ({DEFAULT_OUTAGE_AFTER})",
    )
    p.add_argument(
        "--outage-s",
        type=float,
        default=DEFAULT_OUTAGE_S,
        metavar="S",
        help=f"how long to wait for a server in an outage before exit 4 ({DEFAULT_OUTAGE_S:g})",
    )
    p.add_argument(
        "--restart",
        action="store_true",
        help="restart the server calibrate manages (calibrate server start) if its "
        "process dies mid-run",
    )
    p.add_argument(
        "--grace-s",
        type=float,
        default=10.0,
        metavar="S",
        help="on Ctrl-C, how long in-flight items may finish (10)",
    )
    p.add_argument("--fsync", action="store_true", help="also fsync each output line")
    p.add_argument(
        "--sample",
        type=int,
        metavar="N",
        help="run only the first N items and check the outputs' shape",
    )
    p.add_argument("--limit", type=int, metavar="N", help="run at most N pending items this time")
    p.add_argument("--max-chars", type=int, metavar="N", help="flag outputs longer than this")
    p.add_argument(
        "--expect",
        choices=("text", "json"),
        default="text",
        help="json: strip ```json fences, parse into 'parsed', else a format failure",
    )
    p.add_argument(
        "--allow-foreign",
        action="store_true",
        help="append even if --out holds ids that are not in --input",
    )
    p.add_argument(
        "--allow-mixed",
        action="store_true",
        help="resume even if --out holds results made with another --prompt, --model, "
        "--max-tokens, sampling or server: keep them, run the rest with these",
    )
    p.add_argument("--max-tokens", type=int, metavar="N", help="default: [prompt].max_tokens")
    p.add_argument("--temperature", type=float, help="default: [prompt].temperature")
    p.add_argument(
        "--drift-window-s",
        type=float,
        default=DRIFT_WINDOW_S,
        metavar="S",
        help=f"the drift watch's shortest window ({DRIFT_WINDOW_S:g}; {low:g} to {high:g}): "
        "shorter lets a batch of a few seconds be judged, each window noisier",
    )
    p.add_argument(
        "--progress-s",
        type=float,
        default=5.0,
        metavar="S",
        help="without a terminal, a progress line every S seconds (5)",
    )
    add_junit(p)


def check_flags(args: argparse.Namespace) -> None:
    """Every size and count is bounded (SPEC §11): exit 2 naming the flag and its range."""
    problems = [
        _out_of_range(flag, value, low, high)
        for flag, value, low, high in (
            ("-c/--concurrency", args.concurrency, 1, MAX_CONCURRENCY),
            ("--retries", args.retries, 0, MAX_RETRIES),
            ("--sample", args.sample, 1, math.inf),
            ("--limit", args.limit, 1, math.inf),
            ("--max-chars", args.max_chars, 1, math.inf),
            ("--max-tokens", args.max_tokens, 1, math.inf),
            ("--backoff-s", args.backoff_s, 0, MAX_WAIT_S),
            ("--grace-s", args.grace_s, 0, MAX_WAIT_S),
            ("--progress-s", args.progress_s, 0, MAX_WAIT_S),
            ("--outage-after", args.outage_after, 1, MAX_OUTAGE_AFTER),
            ("--outage-s", args.outage_s, 0, MAX_OUTAGE_S),
            ("--drift-window-s", args.drift_window_s, *DRIFT_WINDOW_S_RANGE),
        )
        if value is not None and not low <= value <= high  # NaN fails this too
    ]
    if problems:
        raise UsageError("; ".join(problems), "See: calibrate batch --help")
    if args.out is None and args.sample is None:
        raise UsageError(
            "--out is required (or --sample N to try the prompt first)",
            "example: calibrate batch --input tasks.jsonl --out out.jsonl",
        )
    if args.final and args.sample is not None:
        raise UsageError(
            "--final goes with a real run, not --sample",
            "Drop --final, or drop --sample and give --out.",
        )
    check_junit_path(args)


def _out_of_range(flag: str, value: float, low: float, high: float) -> str:
    if value > high:
        return f"{flag} must be ≤ {high:g} (the maximum), got {value:g}"
    return f"{flag} must be ≥ {low:g}" + (f" and ≤ {high:g}" if math.isfinite(high) else "")


def request_for(args: argparse.Namespace, urls: list[str], cfg: Config) -> BatchRequest:
    """The batch the flags ask for, under ``cfg`` (resolved with the first URL as the target)."""
    junit = getattr(args, "junit", None)
    return BatchRequest(
        config=cfg,
        input_path=Path(args.input),
        out_path=Path(args.out) if args.out else None,
        urls=tuple(urls),
        concurrency=args.concurrency,
        final=args.final,
        junit_path=Path(junit) if junit else None,
        argv=args.argv,
        prompt=args.prompt,
        retry=RetryPolicy(retries=args.retries, base_s=args.backoff_s),
        outage=OutagePolicy(after=args.outage_after, limit_s=args.outage_s),
        restart=args.restart,
        grace_s=args.grace_s,
        fsync=args.fsync,
        sample=args.sample,
        limit=args.limit,
        max_chars=args.max_chars,
        expect=args.expect,
        allow_foreign=args.allow_foreign,
        allow_mixed=args.allow_mixed,
        shard=args.shard,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        workers=args.workers,
        drift_window_s=args.drift_window_s,
    )
