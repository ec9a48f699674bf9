"""Stage E: write scripts/launch.sh for your engine with the verified batch size and concurrency.

MAX_CONCURRENCY is the sweep's recommendation (1 when no sweep passed); BATCH_SIZE the last
passing ladder tier (or a rollback's setting). Every value is shell-quoted. Records the pin.
llama.cpp's -c (shared by its slots) is sized for the job: your -c in [server] args, else
--tasks FILE (the batch input: its longest item + max_tokens, a slot each), else a ladder that
sent the job's inputs; after a ladder of the fixed prompt alone it stays at 4096 a slot.

example: calibrate pin --kind vllm --out scripts/launch.sh
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from calibrate.cli.flags import add_command, add_force
from calibrate.cli.flags.resolve import load_config, open_stage
from calibrate.cli.output import output_for
from calibrate.engines.builders import SERVER_KINDS
from calibrate.errors import UsageError
from calibrate.io.output_paths import check_outputs, stage_files
from calibrate.stages.pin import run_pin
from calibrate.stages.pin_context import job_input


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "pin", __doc__ or "", run)
    parser.add_argument(
        "--kind", choices=SERVER_KINDS, help="engine kind (overrides [server] kind)"
    )
    parser.add_argument(
        "--out", metavar="PATH", help="where to write it (default scripts/launch.sh)"
    )
    parser.add_argument(
        "--tasks", metavar="FILE", help="the batch input: llama.cpp's -c is sized for its items"
    )
    parser.add_argument(
        "--prompt", default="", help="with --tasks: put before each item's text, as batch does"
    )
    parser.add_argument(
        "--max-tokens", type=int, metavar="N", help="with --tasks: default [prompt].max_tokens"
    )
    add_force(parser)


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    cfg = load_config(args)  # --out is never what pin reads, checked before its gate
    script = Path(args.out) if args.out else cfg.scripts_dir / "launch.sh"
    tasks = Path(args.tasks) if args.tasks else None
    reads = [*stage_files(cfg.runs_dir, cfg.baselines_dir, cfg.source), ("--tasks", tasks)]
    check_outputs([("--out", script)], reads)
    max_tokens = args.max_tokens if args.max_tokens is not None else cfg.prompt.max_tokens
    if max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1, got {max_tokens}")
    job = job_input(tasks, args.prompt, max_tokens) if tasks else None
    ctx = open_stage(args, "pin", out, cfg)
    result = run_pin(ctx, kind=args.kind, out=script, job=job)
    v = result.values
    out.ok(f"pinned batch {v.batch_size}, concurrency {v.concurrency} ({v.kind}) → {result.script}")
    flags = ", ".join(f"{k}={value}" for k, value in result.tuned)
    tuned_by = result.tuned_by or "tune"
    if flags and v.verified_by.startswith(tuned_by) and v.concurrency_from.startswith(tuned_by):
        out.say(f"  batch size, concurrency and engine flags ({flags}) from {tuned_by}")
    else:
        out.say(f"  batch size from {v.verified_by}; concurrency from {v.concurrency_from}")
        if flags:
            out.say(f"  engine flags from {tuned_by}: {flags}")
    if v.context:
        out.say(f"  context: {v.context}")
    if result.model_from:
        out.say(f"  {result.model_from} ([server] model_path is empty)")
    out.say(f"  exec {result.command.display()}")
    if result.above_cap:
        out.warn(result.above_cap)
    out.say(f"next: {result.next_command}")
    out.result({"run_id": ctx.run.run_id, **result.summary().to_json()})
    return 0
