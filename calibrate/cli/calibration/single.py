"""Stage A: send the fixed prompt once at temperature 0 and check the answer is complete.

The first passing run also writes the baseline (baselines/single.jsonl). --determinism N then
sends N copies of the fixed prompt one after another and N at once, and says how many distinct
answers came back and where the first differs (informative; exit 1 only with --require-match).

example: calibrate single --base-url http://127.0.0.1:8000/v1 --model internlm-s2 --stream
"""

from __future__ import annotations

import argparse
from typing import Any

from calibrate.cli.flags import add_command, add_junit
from calibrate.cli.flags.resolve import junit_suite, open_stage, save_junit
from calibrate.cli.output import output_for
from calibrate.stages import single_run
from calibrate.stages.env import guarded
from calibrate.stages.single_run import SingleSpec


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
    spec = SingleSpec(
        stream=args.stream,
        save_baseline=args.save_baseline,
        accept_model=args.accept_model,
        determinism=args.determinism,
        require_match=args.require_match,
    )
    spec.check()
    ctx = open_stage(args, "single", out, gate=False)
    with guarded(ctx):
        outcome = single_run.run(ctx, spec, out.say, out.warn)
        out.tell(outcome.answer_lines())
        suite = junit_suite("single", ctx.run, ctx.target)
        outcome.add_checks(suite)
        save_junit(args, suite)
        out.tell(outcome.verdict_lines(ctx))
        out.result(outcome.to_json())
        return 0 if outcome.passed else 1
