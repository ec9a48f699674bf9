"""Stage F: run a tasks file through the server — concurrent, resumable, retrying, format-checked.

Each line of --input is {"id": ..., "text": ..., "prompt"?: ...}; each finished item is one line
of --out (completion order). Rerunning the same command resumes: finished ids are skipped,
failed ones tried again. Ctrl-C stops cleanly (exit 130) and prints the command to resume.
--sample N tries the prompt on the first N items and checks the outputs' shape (--out untouched).
A server outage pauses the run (nothing is marked failed) until it answers again or --outage-s
passes (exit 4); --restart brings back a managed server that died. --base-url may be repeated
(each checked against the baseline first); --shard I/N splits the ids for a cluster scheduler;
--final FILE writes one result per id in input order (the last ok, else the last failure).

example: calibrate batch --input tasks.jsonl --out out.jsonl --final final.jsonl --prompt "一句话概括：" -c 4
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from calibrate.cli.batch_args import check_flags, check_paths
from calibrate.cli.batch_args import register as _register
from calibrate.cli.common import (
    Output,
    junit_suite,
    load_config,
    open_stage,
    output_for,
    save_junit,
)
from calibrate.cli.export import say_export
from calibrate.cli.views.batch import ProgressView, render_summary, say_check
from calibrate.config import Config, split_endpoint
from calibrate.engines.redaction import shown_command
from calibrate.errors import ExitCode, ServerUnreachable, StageFailed, UsageError
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.http.client import OpenAIClient
from calibrate.http.error_kinds import DESCRIPTORS_HINT, OutOfDescriptors
from calibrate.load.retry import RetryPolicy
from calibrate.stages.batch import (
    MAX_CONCURRENCY,
    BatchPlan,
    BatchSpec,
    open_batch,
    run_batch,
)
from calibrate.stages.batch.endpoints import (
    ServedModelWatch,
    baseline_served_model,
    check_endpoints,
    endpoints_for,
)
from calibrate.stages.batch.lanes import Lane, make_lane
from calibrate.stages.batch.length_check import length_warning
from calibrate.stages.batch.outage import OutageEvent, OutagePolicy
from calibrate.stages.batch.restart import ManagedRestart
from calibrate.stages.batch.result import BatchResult, summary_json
from calibrate.stages.batch.shard import Shard
from calibrate.stages.batch.worker import BatchControl
from calibrate.stages.context import StageContext, sampling_params
from calibrate.stages.export import export_final
from calibrate.stages.measure.format_check import shape_checks
from calibrate.state.ledger import Ledger
from calibrate.state.setting import Endpoint
from calibrate.state.weights_gate import check_batch


def register(subparsers: Any) -> None:
    _register(subparsers, __doc__ or "", run)


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    check_flags(args)
    urls: list[str] = list(args.base_url or [])
    args.base_url = split_endpoint(urls[0])[0] if urls else None  # the target: the first one
    cfg = load_config(args)
    endpoints = endpoints_for(cfg, urls, args.concurrency, Ledger(cfg.runs_dir), MAX_CONCURRENCY)
    check_batch(cfg, Ledger(cfg.runs_dir), endpoints)  # the setting's weights, before anything
    concurrency = sum(e.concurrency for e in endpoints)
    if concurrency > MAX_CONCURRENCY:
        raise UsageError(
            f"the endpoints' concurrency adds up to {concurrency}; at most "
            f"{MAX_CONCURRENCY} in all",
            "Lower URL#c=N or -c.",
        )
    source = endpoints[0].concurrency_source if len(endpoints) == 1 else "per endpoint"
    check_paths(args, cfg)  # no output overwrites what the batch reads: before anything is sent
    restarter = ManagedRestart(cfg) if args.restart else None
    if restarter is not None and not restarter.managed():
        raise UsageError(
            "--restart needs a server that calibrate manages (runs/server.json)",
            "Start it with: calibrate server start (or drop --restart)",
        )
    params = sampling_params(cfg)
    if args.max_tokens is not None or args.temperature is not None:
        params = type(params)(
            temperature=params.temperature if args.temperature is None else args.temperature,
            max_tokens=params.max_tokens if args.max_tokens is None else args.max_tokens,
            top_p=params.top_p,
            seed=params.seed,
        )
    spec = BatchSpec(
        input_path=Path(args.input),
        out_path=Path(args.out) if args.out else None,
        model=cfg.target.model,
        params=params,
        prompt=args.prompt,
        concurrency=concurrency,
        retry=RetryPolicy(retries=args.retries, base_s=args.backoff_s),
        grace_s=args.grace_s,
        fsync=args.fsync,
        sample=args.sample,
        limit=args.limit,
        max_chars=args.max_chars,
        expect=args.expect,
        allow_foreign=args.allow_foreign,
        shard=Shard.parse(args.shard) if args.shard else None,
    )
    outage = OutagePolicy(after=args.outage_after, limit_s=args.outage_s)
    try:
        # exit 2 on bad input, a busy or unwritable --out: before anything is sent
        with open_batch(spec) as plan:
            return _run(args, out, spec, plan, source, endpoints, outage, restarter)
    except MemoryError as exc:  # e.g. an absurd input line: end cleanly, never spin
        raise StageFailed(
            "ran out of memory; what completed is in --out",
            "Rerun with a lower -c, or on a machine with more memory; finished items are kept.",
        ) from exc


def _client(cfg: Config, endpoint: Endpoint) -> OpenAIClient:
    """A client for one more endpoint, set up like the target's (open_stage)."""
    t = cfg.target
    return OpenAIClient(
        endpoint.base_url,
        api_key=cfg.api_key,
        metrics_key=cfg.gpu_metrics_key,
        timeout_s=t.timeout_s,
        connect_timeout_s=t.connect_timeout_s,
        max_response_mib=t.max_response_mib,
        max_connections=endpoint.concurrency,
    )


def _usable(
    ctx: StageContext,
    out: Output,
    endpoints: tuple[Endpoint, ...],
    clients: list[OpenAIClient],
    summary: dict[str, Any],
) -> list[tuple[Endpoint, OpenAIClient]]:
    """Several endpoints: each must answer the fixed prompt like the baseline (exit 1 if not)."""
    pairs = list(zip(endpoints, clients, strict=True))
    if len(endpoints) == 1:
        return pairs
    check = check_endpoints(ctx, endpoints, clients)
    summary["endpoint_check"] = check.to_json()
    say_check(out, check)
    if check.differing:
        names = ", ".join(e.label for e, _ in check.differing)
        ctx.record_result(False, {**summary, "refused": names})
        raise StageFailed(
            f"endpoint(s) {names} answer the fixed prompt differently from the baseline: "
            "different weights or settings behind them?",
            "Fix or drop those --base-url entries (the diff is above); nothing was dispatched.",
        )
    if not check.usable:
        raise ServerUnreachable(
            "no endpoint answered the fixed prompt",
            "Start the servers, then rerun the same command.",
        )
    return [(e, c) for e, c in pairs if e in check.usable]


def _run(
    args: argparse.Namespace,
    out: Output,
    spec: BatchSpec,
    plan: BatchPlan,
    source: str,
    endpoints: tuple[Endpoint, ...],
    outage: OutagePolicy,
    restarter: ManagedRestart | None,
) -> int:
    if source == "default":
        out.warn(
            f"concurrency {spec.concurrency} is not calibrated (nothing pinned for this "
            "target); run calibrate sweep and calibrate pin, or pass -c"
        )
    ctx = open_stage(
        args,
        "batch",
        out,
        gate=False,
        max_connections=min(endpoints[0].concurrency, max(plan.to_run, 1)),
    )
    try:
        return _dispatch(args, out, spec, plan, source, endpoints, outage, restarter, ctx)
    finally:
        ctx.run.close()  # also when refused or unreachable: no run file is left open


def _dispatch(
    args: argparse.Namespace,
    out: Output,
    spec: BatchSpec,
    plan: BatchPlan,
    source: str,
    endpoints: tuple[Endpoint, ...],
    outage: OutagePolicy,
    restarter: ManagedRestart | None,
    ctx: StageContext,
) -> int:
    clients = [ctx.client, *(_client(ctx.config, e) for e in endpoints[1:])]
    # --sample tries the prompt: its outputs must not count as done for the real run
    out_path = spec.out_path if spec.out_path and not spec.sample else ctx.run.file("sample.jsonl")
    resume = shown_command(["calibrate", *getattr(args, "argv", [])])  # no password in it
    _say_plan(out, plan.total, plan.skipped, plan.to_run, spec, source, plan.scan)
    long_items = length_warning(
        ctx.ledger, ctx.target, plan.source_path, spec.prompt, shown=spec.input_path
    )
    if long_items:
        out.warn(long_items)
    extra: dict[str, Any] = {"shard": str(spec.shard) if spec.shard else None}
    events: list[OutageEvent] = []
    events_lock = threading.Lock()  # events come from the workers' threads

    def on_event(event: OutageEvent) -> None:
        with events_lock:
            events.append(event)
            ctx.run.append("outages.jsonl", event.to_json())
        out.warn(f"{event.endpoint}: {event.event.replace('_', ' ')} — {event.detail}")

    control = BatchControl()
    monitor = SelfLoadMonitor().start()
    view = ProgressView(out, plan.to_run, args.progress_s, spec.grace_s, len(endpoints))
    try:
        usable = _usable(ctx, out, endpoints, clients, extra)
        if len(endpoints) == 1:  # no fixed-prompt check: its answers are held to one model
            watch = ServedModelWatch(
                baseline_served_model(ctx), lambda why: control.fail("other_model", why)
            )
            control.served = watch.note
        lanes: list[Lane] = [
            make_lane(
                e, c, outage, restarter=restarter if e is endpoints[0] else None, on_event=on_event
            )
            for e, c in usable
        ]
        with view, _signals(control, out):
            result = run_batch(
                plan,
                None,
                out_path,
                lanes=lanes,
                control=control,
                on_progress=view.update,
                progress_every_s=view.every_s,
                monitor=monitor,
                warn=out.warn,
                outage=outage,
                events=events,
            )
    finally:
        monitor.stop()
        _close_later(clients)
    if result.stopped_by == "unreachable":
        raise ServerUnreachable(
            result.stop_detail,
            "Start it (or try the built-in one: make mock), then rerun the same command.",
        )
    final_error = None
    if args.final and not spec.sample:
        try:
            final = export_final(plan.source_path, [out_path], Path(args.final), shard=spec.shard)
        except OSError as exc:  # the batch's verdict is still recorded; the export is not
            final_error = f"--final {args.final} could not be written: {exc}"
            paths = ("--input", plan.source_path, "--out", out_path, "--to", args.final)
            again = shlex.join(["calibrate", "export", *map(str, paths)])
            out.warn(f"{final_error}; write it later with: {again}")
            extra["final_error"] = final_error
        else:
            say_export(out, final)
            extra["final"] = final.to_json()
    summary = {**summary_json(result, spec.concurrency, source), **extra}
    checks = shape_checks(result.shapes, max_chars=spec.max_chars, expect=spec.expect)
    if spec.sample:
        summary["checks"] = [
            {"name": c.name, "passed": c.passed, "detail": c.detail} for c in checks
        ]
    # items count: a pass needs an ok line for every item this run was to do
    passed = result.ok == result.to_run and result.stopped_by is None and final_error is None
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
    if result.stopped_by == "other_model":
        raise StageFailed(
            f"{result.stop_detail}; stopped after {result.ok} ok",
            f"Check what serves {spec.model!r} there, then resume with: {resume}",
        )
    if result.stopped_by == "descriptors":
        raise OutOfDescriptors(result.stop_detail, f"{DESCRIPTORS_HINT} Resume with: {resume}")
    if result.stopped_by == "outage":
        raise ServerUnreachable(
            f"{result.stop_detail}; {result.ok} done this run, {result.remaining} remaining",
            f"When the server answers again, resume with: {resume}",
        )
    if result.interrupted:
        return ExitCode.INTERRUPTED
    return ExitCode.OK if passed else ExitCode.FAILED


def _close_later(clients: list[OpenAIClient]) -> None:
    """Close the pooled connections (one per slot: 512 at -c 512) off the path to the summary;
    a daemon thread, so the process never waits for it (the kernel closes what is left)."""

    def close_all() -> None:
        for client in clients:
            with contextlib.suppress(Exception):  # nothing left to tell anyone
                client.close()

    threading.Thread(target=close_all, name="batch-close", daemon=True).start()


def _say_plan(
    out: Output, total: int, skipped: int, to_run: int, spec: BatchSpec, source: str, scan: Any
) -> None:
    what = f"sample of {to_run}" if spec.sample else f"{to_run} to run"
    shard = f" (shard {spec.shard})" if spec.shard else ""
    out.say(
        f"batch{shard}: {total} total, {skipped} already done, {what} "
        f"(concurrency {spec.concurrency} from {source}, retries {spec.retry.retries})"
    )
    if scan is not None and scan.retry:
        out.say(f"retrying {scan.retry} item(s) that failed in an earlier run")
    if scan is not None and scan.torn_tail:
        out.warn(
            f"the last line of {spec.out_path} was torn (a crash mid-write); it was cut "
            "off and its item runs again"
        )
    if scan is not None and scan.unreadable:
        out.warn(f"{scan.unreadable} unreadable line(s) in {spec.out_path} skipped")
    if scan is not None and scan.foreign:
        out.warn(
            f"{scan.foreign} line(s) in {spec.out_path} are not items of {spec.input_path} "
            "(kept, --allow-foreign)"
        )


@contextmanager
def _signals(control: BatchControl, out: Output) -> Iterator[None]:
    """Ctrl-C / SIGTERM stop the batch cleanly; a second one abandons what is in flight."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        control.request_stop()

    previous: dict[signal.Signals, Callable[..., Any] | int | None] = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
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
        suite.check(
            f"items failed: {kind}",
            False,
            f"{count} item(s) failed with {kind}: {message} (e.g. {', '.join(ids)})",
            kind=kind,
        )
    for check in checks:
        suite.check(f"sample: {check.name}", check.passed, check.detail, kind="format")
    save_junit(args, suite)
