"""Stage A: send the fixed prompt once at temperature 0 and check the answer is complete.

The first passing run also writes the baseline (baselines/single.jsonl). --determinism N then
sends N copies of the fixed prompt one after another and N at once, and says how many distinct
answers came back and where the first differs (informative; exit 1 only with --require-match).

example: calibrate single --base-url http://127.0.0.1:8000/v1 --model internlm-s2 --stream
"""

from __future__ import annotations

import argparse
from typing import Any

from calibrate.cli.common import (
    Output,
    add_command,
    add_junit,
    junit_suite,
    open_stage,
    output_for,
    save_junit,
)
from calibrate.errors import UsageError
from calibrate.load.waves import Sender
from calibrate.stages.context import StageContext
from calibrate.stages.env import guarded
from calibrate.stages.ladder.run import item_record
from calibrate.stages.measure.determinism_wave import CopiesWave, managed_switch, send_copies
from calibrate.stages.single import run_single
from calibrate.state.gates import next_step
from calibrate.state.ledger import baseline_path


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
    parser.add_argument(
        "--determinism",
        type=int,
        metavar="N",
        help="also send N copies one after another and N at once: distinct answers, first "
        "differing token (N ≥ 2)",
    )
    parser.add_argument(
        "--require-match",
        action="store_true",
        help="with --determinism: fail (exit 1) when the copies' answers differ",
    )
    add_junit(parser)


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    if args.determinism is not None and not 2 <= args.determinism <= 1024:
        raise UsageError(
            f"--determinism {args.determinism}: must be 2–1024 copies",
            "e.g. --determinism 8",
        )
    if args.require_match and args.determinism is None:
        raise UsageError("--require-match compares copies: give --determinism N with it")
    ctx = open_stage(args, "single", out, gate=False)
    with guarded(ctx):
        return _run(args, out, ctx)


def _run(args: argparse.Namespace, out: Output, ctx: StageContext) -> int:
    found: dict[str, Any] = {}

    def after() -> tuple[bool, dict[str, Any]]:
        found["determinism"] = _copies(args, out, ctx)
        same = bool(found["determinism"]["deterministic"])
        return same or not args.require_match, {"determinism": found["determinism"]}

    result = run_single(
        ctx,
        stream=args.stream,
        save_baseline=args.save_baseline,
        accept_model=args.accept_model,
        after=after if args.determinism else None,
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
    copies = found.get("determinism")
    if copies is not None and args.require_match:
        suite.check(
            "copies of the fixed prompt answer alike",
            copies["deterministic"],
            "the copies' answers differ",
            kind="nondeterministic",
        )
    save_junit(args, suite)
    differ = copies is not None and args.require_match and not copies["deterministic"]
    if differ:
        out.fail("--require-match: the copies' answers differ")
    if result.passed and not differ:
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
            **found,
        }
    )
    return 0 if result.passed and not differ else 1


def _copies(args: argparse.Namespace, out: Output, ctx: StageContext) -> dict[str, Any]:
    """N copies one after another, then N at once: what each set of answers says."""
    n = int(args.determinism)
    how = CopiesWave(n, stream=args.stream)
    sender = Sender(ctx.client)
    found: dict[str, Any] = {}
    differed = False
    for key, where, batch in (
        ("one_by_one", "one after another", 1),
        ("at_once", f"{n} at once", n),
    ):
        check = send_copies(
            ctx,
            sender,
            None,
            how,
            batch,
            lambda item, in_flight: item_record(ctx, item, 1, in_flight, None),
        )
        (out.warn if check.divergence else out.say)(check.describe(where))
        differed = differed or check.divergence is not None
        found[key] = {**check.to_json(), "in_flight": batch}
    switch = managed_switch(ctx.config)
    if differed and switch is not None:
        out.say(switch.advice())
    return {
        **found,
        "deterministic": not differed,
        "switch": switch.to_json() if switch is not None else None,
    }
