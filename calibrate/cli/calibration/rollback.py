"""Stage D: return the server to the last passing tier (concurrency 1), with proof.

Stops the server (or tells you how and waits), checks its VRAM was released, writes the active
setting, restarts it (managed) or waits for your restart, then compares the fixed prompt with the
baseline. Every step goes to steps.jsonl and the ledger; a failing step leaves an incident.

example: calibrate rollback --wait 600 --junit rollback.xml
"""

from __future__ import annotations

import argparse
from typing import Any

from calibrate.cli import flags
from calibrate.cli.flags import resolve
from calibrate.cli.output import output_for
from calibrate.cli.views.comparison import show_comparison
from calibrate.config import MAX_TIMEOUT_S
from calibrate.errors import UsageError
from calibrate.gpu.nvml import gpu_snapshot
from calibrate.stages.rollback import NOT_CAPACITY, StepResult, run_rollback

BATCH_NOTE = "(batch uses concurrency 1; calibrate pin writes this setting into scripts/launch.sh)"


def register(subparsers: Any) -> None:
    parser = flags.add_command(subparsers, "rollback", __doc__ or "", run)
    parser.add_argument(
        "--wait",
        type=float,
        default=300.0,
        metavar="S",
        help="unmanaged server: how long to wait for you to stop and restart it (default 300)",
    )
    flags.add_check_flags(parser)


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    if not 0 <= args.wait <= MAX_TIMEOUT_S:  # NaN fails this too
        raise UsageError(f"--wait must be in [0, {MAX_TIMEOUT_S:g}] seconds, got {args.wait}")
    normaliser = resolve.normaliser_for(args)
    ctx = resolve.open_stage(args, "rollback", out, normaliser=normaliser)

    def on_step(step: StepResult) -> None:
        line = f"[{step.n}/5] {step.name}: {step.message}"
        (out.ok if step.ok else out.fail)(line if step.ok else f"{line}  (FAILED)")

    result = run_rollback(
        ctx, normaliser, wait_s=args.wait, notify=out.say, on_step=on_step, vram_probe=gpu_snapshot
    )
    if result.comparison is not None and not result.comparison.passed:
        show_comparison(out, "fixed prompt vs baseline", result.comparison)
    suite = resolve.junit_suite("rollback", ctx.run, ctx.target)
    result.add_checks(suite)
    resolve.save_junit(args, suite)
    if result.passed:
        out.ok(f"rollback passed (run {ctx.run.run_id})")
        out.say(NOT_CAPACITY.format(batch=result.batch_size))
        out.say(f"next: {result.next_command}   {BATCH_NOTE}")
    elif failed := result.failed:
        out.fail(
            f"rollback failed at step {failed.n} ({failed.name}); "
            f"incident: {ctx.run.file(f'incidents/{failed.n}-{failed.name}.json')}"
        )
    out.result(
        {
            "passed": result.passed,
            "run_id": ctx.run.run_id,
            **result.summary().to_json(),
            "messages": [s.message for s in result.steps],
        }
    )
    return result.exit_code
