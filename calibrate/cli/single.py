"""Stage A: send the fixed prompt once at temperature 0 and check the answer is complete.

The first passing run also writes the baseline (baselines/single.jsonl).

example: calibrate single --base-url http://127.0.0.1:8000/v1 --model internlm-s2 --stream
"""

from __future__ import annotations

import argparse
from typing import Any

from calibrate.cli.common import (
    Output,
    add_command,
    add_junit,
    guarded,
    junit_suite,
    open_stage,
    output_for,
    save_junit,
)
from calibrate.ledger import baseline_path
from calibrate.pipeline import next_step
from calibrate.stages.context import StageContext
from calibrate.stages.single import run_single


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "single", __doc__ or "", run)
    parser.add_argument("--stream", action="store_true", help="stream (SSE) and measure TTFT")
    parser.add_argument(
        "--save-baseline",
        action="store_true",
        help="replace baselines/single.jsonl with this answer (the old one is kept)",
    )
    parser.add_argument(
        "--accept-model",
        action="store_true",
        help="pass although the server serves another model name (an intended alias; recorded)",
    )
    add_junit(parser)


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    ctx = open_stage(args, "single", out, gate=False)
    with guarded(ctx):
        return _run(args, out, ctx)


def _run(args: argparse.Namespace, out: Output, ctx: StageContext) -> int:
    result = run_single(
        ctx, stream=args.stream, save_baseline=args.save_baseline, accept_model=args.accept_model
    )
    record = result.record
    for warning in result.warnings:
        out.warn(warning)
    usage = record.usage
    tokens = f"{usage.prompt_tokens}+{usage.completion_tokens} tokens" if usage else "no usage"
    ttft = f", ttft {record.ttft_s:.3f}s" if record.ttft_s is not None else ""
    if record.text is not None:
        out.say(f"answer: {record.text.strip()}")
    finish = f"finish_reason {record.finish_reason}" if record.finish_reason else "no finish_reason"
    served = f"served model '{record.served_model}'" if record.served_model else "no model named"
    out.say(f"{finish}, {tokens}, {record.elapsed_s:.3f}s{ttft}, {served}")
    summary = result.summary()
    suite = junit_suite("single", ctx.run, ctx.target)
    kind = record.error.kind if record.error else ""
    suite.check(
        "fixed prompt answered completely",
        result.passed,
        "; ".join(result.problems),
        kind=kind,
        time_s=record.elapsed_s,
    )
    save_junit(args, suite)
    if result.passed:
        out.ok(f"single passed (run {ctx.run.run_id})")
        if result.baseline:
            out.say(f"baseline {result.baseline}: {baseline_path(ctx.config)}")
        out.say(f"next: {next_step(ctx.config, ctx.ledger, ctx.target)}")
    else:
        for problem in result.problems:
            out.fail(f"single failed: {problem}")
        out.say(f"records: {ctx.run.file('records.jsonl')}")
    out.result(
        {
            "passed": result.passed,
            "run_id": ctx.run.run_id,
            "record": record.to_json(),
            "baseline": result.baseline,
            **summary,
        }
    )
    return 0 if result.passed else 1
