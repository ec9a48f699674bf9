"""Stage B: run the fixed prompt again and diff it with the baseline; or diff two files.

Volatile fields are removed by a jq program first (default: del(.run_id, .ts, .elapsed_s,
.ttft_s, .stage, .target and the tier fields)); records are compared with sorted keys.

example: calibrate repro --runs 3 --ignore system_fingerprint
example: calibrate repro baselines/single.jsonl runs/20261129T164129Z-single-a1b2c3/records.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from calibrate.cli import flags
from calibrate.cli.flags import resolve
from calibrate.cli.output import output_for
from calibrate.cli.views.comparison import show_comparison
from calibrate.config import MAX_ROUNDS
from calibrate.errors import UsageError
from calibrate.io.baseline import after_failure
from calibrate.io.output_paths import check_outputs
from calibrate.io.store import RunDir
from calibrate.stages.env import guarded
from calibrate.stages.repro import ReproResult, between_files, run_repro


def register(subparsers: Any) -> None:
    parser = flags.add_command(subparsers, "repro", __doc__ or "", run)
    parser.add_argument(
        "files", nargs="*", metavar="FILE", help="two JSONL files to compare offline"
    )
    parser.add_argument("--runs", type=int, default=2, help="fresh runs to compare (default 2)")
    parser.add_argument("--stream", action="store_true", help="stream the requests (SSE)")
    flags.add_check_flags(parser)


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    normaliser = resolve.normaliser_for(args)
    if args.files:
        if len(args.files) != 2:
            raise UsageError(
                "repro takes exactly two files to compare offline",
                "example: calibrate repro a.jsonl b.jsonl",
            )
        flags.check_junit_path(args)
        check_outputs(
            [("--junit", Path(args.junit) if args.junit else None)],
            [("the file", Path(name)) for name in args.files],
        )
        result = between_files(Path(args.files[0]), Path(args.files[1]), normaliser)
        return _report(out, args, result, run=None)
    if not 1 <= args.runs <= MAX_ROUNDS:
        raise UsageError(f"--runs must be in [1, {MAX_ROUNDS}], got {args.runs}")
    ctx = resolve.open_stage(args, "repro", out, normaliser=normaliser)
    with guarded(ctx):
        result = run_repro(ctx, normaliser, runs=args.runs, stream=args.stream, say=out.say)
        return _report(out, args, result, run=ctx.run)


def _report(
    out: Any,
    args: argparse.Namespace,
    result: ReproResult,
    *,
    run: RunDir | None,
) -> int:
    for n, comparison in enumerate(result.comparisons, 1):
        if comparison.verdict != "identical" or comparison.notes:  # the verdict counts the rest
            show_comparison(out, f"run {n}", comparison)
    suite = resolve.junit_suite("repro", run)
    result.add_checks(suite)
    resolve.save_junit(args, suite)
    if result.passed:
        out.ok(result.verdict_line())
        if run is not None:  # a live run; two files compared offline have no next step
            out.say(f"next: {result.next_command}")
    else:
        out.fail(result.verdict_line())
        again = after_failure(result.comparisons, again="calibrate repro", cause=result.cause)
        out.say(f"next: {again}")
    out.result(result.to_json(run.run_id if run else None))
    return 0 if result.passed else 1
