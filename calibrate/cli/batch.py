"""Stage F: run a tasks file through the server — concurrent, resumable, retrying, format-checked.

Each line of --input is {"id": ..., "text": ..., "prompt"?: ...}; each finished item is one line
of --out (completion order). Rerunning the same command resumes: finished ids are skipped,
failed ones tried again. Ctrl-C stops cleanly (exit 130) and prints the command to resume.
--sample N tries the prompt on the first N items and checks the outputs' shape (--out untouched).

example: calibrate batch --input tasks.jsonl --out out.jsonl --prompt "一句话概括：" -c 4
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from calibrate.cli.batch_view import ProgressView, render_summary
from calibrate.cli.common import (
    Output,
    add_command,
    add_junit,
    junit_suite,
    load_config,
    open_stage,
    output_for,
    save_junit,
)
from calibrate.errors import ExitCode, ServerUnreachable, StageFailed, UsageError
from calibrate.ledger import Ledger, target_fingerprint
from calibrate.selfload import SelfLoadMonitor
from calibrate.setting import resolve
from calibrate.stages.batch import (
    DEFAULT_CONCURRENCY,
    MAX_CONCURRENCY,
    BatchPlan,
    BatchSpec,
    open_batch,
    run_batch,
)
from calibrate.stages.batch_result import BatchResult, summary_json
from calibrate.stages.batch_worker import BatchControl
from calibrate.stages.context import sampling_params
from calibrate.stages.format_check import shape_checks
from calibrate.stages.length_check import length_warning
from calibrate.stages.retry import RetryPolicy


def register(subparsers: Any) -> None:
    p = add_command(subparsers, "batch", __doc__ or "", run)
    p.add_argument("--input", required=True, metavar="PATH", help="tasks JSONL: id, text, prompt?")
    p.add_argument("--out", metavar="PATH", help="results JSONL (appended; resumed when rerun)")
    p.add_argument("--prompt", default="", help="put before each item's text (its own line)")
    p.add_argument("-c", "--concurrency", type=int, metavar="N",
                   help="requests in flight (default: the pinned concurrency, else 4; "
                   f"at most {MAX_CONCURRENCY})")  # fmt: skip
    p.add_argument("--retries", type=int, default=3,
                   help=f"retries of transient errors (3; at most {MAX_RETRIES})")  # fmt: skip
    p.add_argument("--backoff-s", type=float, default=1.0, metavar="S",
                   help="first retry wait; doubles each retry, plus jitter (1)")  # fmt: skip
    p.add_argument("--grace-s", type=float, default=10.0, metavar="S",
                   help="on Ctrl-C, how long in-flight items may finish (10)")  # fmt: skip
    p.add_argument("--fsync", action="store_true", help="also fsync each output line")
    p.add_argument("--sample", type=int, metavar="N",
                   help="run only the first N items and check the outputs' shape")  # fmt: skip
    p.add_argument("--limit", type=int, metavar="N", help="run at most N pending items this time")
    p.add_argument("--max-chars", type=int, metavar="N", help="flag outputs longer than this")
    p.add_argument("--expect", choices=("text", "json"), default="text",
                   help="json: strip ```json fences, parse into 'parsed', else a format failure")  # fmt: skip
    p.add_argument("--allow-foreign", action="store_true",
                   help="append even if --out holds ids that are not in --input")  # fmt: skip
    p.add_argument("--max-tokens", type=int, metavar="N", help="default: [prompt].max_tokens")
    p.add_argument("--temperature", type=float, help="default: [prompt].temperature")
    p.add_argument("--progress-s", type=float, default=5.0, metavar="S",
                   help="without a terminal, a progress line every S seconds (5)")  # fmt: skip
    add_junit(p)


MAX_RETRIES = 100
MAX_WAIT_S = 3600.0


def _check_flags(args: argparse.Namespace) -> None:
    """Every size and count is bounded (SPEC §11): exit 2 naming the flag and its range."""
    problems = [
        _out_of_range(flag, value, low, high)
        for flag, value, low, high in (
            ("-c/--concurrency", args.concurrency, 1, MAX_CONCURRENCY),
            ("--retries", args.retries, 0, MAX_RETRIES),
            ("--sample", args.sample, 1, math.inf), ("--limit", args.limit, 1, math.inf),
            ("--max-chars", args.max_chars, 1, math.inf),
            ("--max-tokens", args.max_tokens, 1, math.inf),
            ("--backoff-s", args.backoff_s, 0, MAX_WAIT_S),
            ("--grace-s", args.grace_s, 0, MAX_WAIT_S),
            ("--progress-s", args.progress_s, 0, MAX_WAIT_S),
        )
        if value is not None and not low <= value <= high  # NaN fails this too
    ]  # fmt: skip
    if problems:
        raise UsageError("; ".join(problems), "See: calibrate batch --help")
    if args.out is None and args.sample is None:
        raise UsageError("--out is required (or --sample N to try the prompt first)",
                         "example: calibrate batch --input tasks.jsonl --out out.jsonl")  # fmt: skip
    if getattr(args, "junit", None):
        _check_writable(Path(args.junit), "--junit")


def _out_of_range(flag: str, value: float, low: float, high: float) -> str:
    if value > high:
        return f"{flag} must be ≤ {high:g} (the maximum), got {value:g}"
    return f"{flag} must be ≥ {low:g}" + (f" and ≤ {high:g}" if math.isfinite(high) else "")


def _check_writable(path: Path, flag: str) -> None:
    """A file can be written at ``path`` (checked before anything is sent)."""
    if path.is_dir():
        raise UsageError(
            f"{flag} {path} is a folder", f"Give a file path, e.g. {path / 'batch.xml'}"
        )
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # the report writer creates missing folders below this one
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {flag} {path}: {folder} is not a writable folder",
                         "Choose a writable place for it; nothing was sent.")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    _check_flags(args)
    cfg = load_config(args)
    concurrency, source = args.concurrency, "flag"
    if concurrency is None:
        setting = resolve(Ledger(cfg.runs_dir), target_fingerprint(cfg))
        concurrency, source = (
            (setting.concurrency, setting.set_by) if setting else (DEFAULT_CONCURRENCY, "default")
        )
        concurrency = min(concurrency, MAX_CONCURRENCY)  # a ledger line is not trusted blindly
    params = sampling_params(cfg)
    if args.max_tokens is not None or args.temperature is not None:
        params = type(params)(
            temperature=params.temperature if args.temperature is None else args.temperature,
            max_tokens=params.max_tokens if args.max_tokens is None else args.max_tokens,
            top_p=params.top_p, seed=params.seed,
        )  # fmt: skip
    spec = BatchSpec(
        input_path=Path(args.input), out_path=Path(args.out) if args.out else None,
        model=cfg.target.model, params=params, prompt=args.prompt, concurrency=concurrency,
        retry=RetryPolicy(retries=args.retries, base_s=args.backoff_s), grace_s=args.grace_s,
        fsync=args.fsync, sample=args.sample, limit=args.limit, max_chars=args.max_chars,
        expect=args.expect, allow_foreign=args.allow_foreign,
    )  # fmt: skip
    try:
        # exit 2 on bad input, a busy or unwritable --out: before anything is sent
        with open_batch(spec) as plan:
            return _run(args, out, spec, plan, source)
    except MemoryError as exc:  # e.g. an absurd input line: end cleanly, never spin
        raise StageFailed(
            "ran out of memory; what completed is in --out",
            "Rerun with a lower -c, or on a machine with more memory; finished items are kept.",
        ) from exc


def _run(args: argparse.Namespace, out: Output, spec: BatchSpec, plan: BatchPlan,
         source: str) -> int:  # fmt: skip
    if source == "default":
        out.warn(f"concurrency {spec.concurrency} is not calibrated (nothing pinned for this "
                 "target); run calibrate sweep and calibrate pin, or pass -c")  # fmt: skip
    ctx = open_stage(args, "batch", out, gate=False,
                     max_connections=min(spec.concurrency, max(plan.to_run, 1)))  # fmt: skip
    # --sample tries the prompt: its outputs must not count as done for the real run
    out_path = spec.out_path if spec.out_path and not spec.sample else ctx.run.file("sample.jsonl")
    resume = shlex.join(["calibrate", *getattr(args, "argv", [])])
    _say_plan(out, plan.total, plan.skipped, plan.to_run, spec, source, plan.scan)
    long_items = length_warning(
        ctx.ledger, ctx.target, plan.source_path, spec.prompt, shown=spec.input_path
    )
    if long_items:
        out.warn(long_items)
    control = BatchControl()
    monitor = SelfLoadMonitor().start()
    view = ProgressView(out, plan.to_run, args.progress_s, spec.grace_s)
    try:
        with view, _signals(control, out):
            result = run_batch(
                plan, ctx.client, out_path, control=control, on_progress=view.update,
                progress_every_s=view.every_s, monitor=monitor, warn=out.warn,
            )  # fmt: skip
    finally:
        monitor.stop()
        ctx.client.close()
    if result.stopped_by == "unreachable":
        raise ServerUnreachable(
            result.stop_detail,
            "Start it (or try the built-in one: make mock), then rerun the same command.",
        )
    summary = summary_json(result, spec.concurrency, source)
    checks = shape_checks(result.shapes, max_chars=spec.max_chars, expect=spec.expect)
    if spec.sample:
        summary["checks"] = [{"name": c.name, "passed": c.passed, "detail": c.detail}
                             for c in checks]  # fmt: skip
    # items count: a pass needs an ok line for every item this run was to do
    passed = result.ok == result.to_run and result.stopped_by is None
    if spec.sample:
        passed = passed and all(c.passed for c in checks)
    try:
        ctx.record_result(passed, summary)
        ctx.run.close()
        _junit(args, ctx, result, checks if spec.sample else [])
    except OSError as exc:
        render_summary(out, result, spec, checks if spec.sample else [], resume)
        raise StageFailed(
            f"the batch ran, but its report could not be written: {exc}",
            f"The results are in {out_path} ({result.ok} ok, {result.failed} failed); "
            "fix the path and rerun to record the verdict.",
        ) from exc
    render_summary(out, result, spec, checks if spec.sample else [], resume)
    out.result({"passed": passed, "run_id": ctx.run.run_id, "resume_command": resume, **summary})
    if result.interrupted:
        return ExitCode.INTERRUPTED
    return ExitCode.OK if passed else ExitCode.FAILED


def _say_plan(
    out: Output, total: int, skipped: int, to_run: int, spec: BatchSpec, source: str, scan: Any
) -> None:
    what = f"sample of {to_run}" if spec.sample else f"{to_run} to run"
    out.say(f"batch: {total} total, {skipped} already done, {what} "
            f"(concurrency {spec.concurrency} from {source}, retries {spec.retry.retries})")  # fmt: skip
    if scan is not None and scan.retry:
        out.say(f"retrying {scan.retry} item(s) that failed in an earlier run")
    if scan is not None and scan.torn_tail:
        out.warn(f"the last line of {spec.out_path} was torn (a crash mid-write); it was cut "
                 "off and its item runs again")  # fmt: skip
    if scan is not None and scan.unreadable:
        out.warn(f"{scan.unreadable} unreadable line(s) in {spec.out_path} skipped")
    if scan is not None and scan.foreign:
        out.warn(f"{scan.foreign} line(s) in {spec.out_path} are not items of {spec.input_path} "
                 "(kept, --allow-foreign)")  # fmt: skip


@contextmanager
def _signals(control: BatchControl, out: Output) -> Iterator[None]:
    """Ctrl-C / SIGTERM stop the batch cleanly; a second one abandons what is in flight."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        control.request_stop()

    previous: dict[signal.Signals, Callable[..., Any] | int | None] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _junit(args: argparse.Namespace, ctx: Any, result: BatchResult, checks: list[Any]) -> None:
    if not getattr(args, "junit", None):
        return
    suite = junit_suite("batch", ctx.run, ctx.target)
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(result.failed_by_kind.items()))
    suite.check(
        "all items ok",
        result.failed == 0 and not result.interrupted,
        f"{result.failed} of {result.finished} items failed ({kinds}); {result.remaining} remaining"
        if result.failed
        else "interrupted before the end",
        kind=",".join(sorted(result.failed_by_kind)) or "interrupted",
        time_s=result.seconds,
    )
    for kind, count in sorted(result.failed_by_kind.items()):
        ids = [repr(f["id"]) for f in result.failures if f["kind"] == kind]
        message = next((f["message"] for f in result.failures if f["kind"] == kind), "")
        suite.check(f"items failed: {kind}", False,
                    f"{count} item(s) failed with {kind}: {message} (e.g. {', '.join(ids)})",
                    kind=kind)  # fmt: skip
    for check in checks:
        suite.check(f"sample: {check.name}", check.passed, check.detail, kind="format")
    save_junit(args, suite)
