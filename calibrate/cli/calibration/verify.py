"""Stage E′: after a restart, check the server still gives the baseline answer.

Runs the fixed prompt once and compares it with baselines/single.jsonl (as repro does):
"config consistent" (exit 0) or the diff (exit 1).

example: calibrate server start --script scripts/launch.sh && calibrate verify --junit verify.xml
"""

from __future__ import annotations

import argparse
from typing import Any

from calibrate.cli import flags
from calibrate.cli.flags import resolve
from calibrate.cli.output import Output, output_for
from calibrate.cli.views.comparison import show_comparison
from calibrate.io.baseline import Normaliser, after_failure
from calibrate.stages.context import StageContext
from calibrate.stages.env import guarded
from calibrate.stages.repro import check_reason
from calibrate.stages.verify import run_verify


def register(subparsers: Any) -> None:
    parser = flags.add_command(subparsers, "verify", __doc__ or "", run)
    flags.add_check_flags(parser)


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    normaliser = resolve.normaliser_for(args)
    ctx = resolve.open_stage(args, "verify", out, normaliser=normaliser)
    with guarded(ctx):
        return _run(args, out, ctx, normaliser)


def _run(args: argparse.Namespace, out: Output, ctx: StageContext, normaliser: Normaliser) -> int:
    result = run_verify(ctx, normaliser, force=bool(getattr(args, "force", False)), say=out.say)
    comparison = result.repro.comparisons[0]
    suite = resolve.junit_suite("verify", ctx.run, ctx.target)
    reason = check_reason(comparison)
    suite.check(
        "fixed prompt matches the baseline", comparison.passed, reason, kind=comparison.verdict
    )
    if result.cap is not None and result.setting is not None:
        suite.check(
            "the server runs at the verified batch size", not result.cap_differs, result.cap_line
        )
    resolve.save_junit(args, suite)
    if result.passed:  # the verdict names the setting
        out.ok(result.verdict_line(ctx.run.run_id))
        for note in comparison.notes:
            out.say(f"note: {note}")
        if result.cap_line:
            out.say(result.cap_line)
        out.say(f"next: {result.next_command}")
    else:
        if result.setting is not None:
            out.say(f"expected setting: {result.setting.describe()}")
        if not comparison.passed:
            show_comparison(out, "fixed prompt vs baseline", comparison)
        out.fail(result.verdict_line(ctx.run.run_id))
        if comparison.passed:  # the answer matched; the server's cap did not
            out.say("next: restart it at the verified setting, then run calibrate verify again")
        else:
            repro = result.repro
            again = after_failure(repro.comparisons, again="calibrate verify", cause=repro.cause)
            out.say(f"next: {again}")
    out.result(
        {
            "passed": result.passed,
            "run_id": ctx.run.run_id,
            **result.summary(),
            **({"cause": result.repro.cause} if result.repro.cause else {}),
            "comparison": comparison.to_json(),
        }
    )
    return 0 if result.passed else 1
