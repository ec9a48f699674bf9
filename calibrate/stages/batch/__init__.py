"""Stage F: the production run — tasks JSONL → results JSONL, concurrent and resumable (SPEC §5.9).

``run(request, env)`` is the whole stage: the request resolved and checked (request.py), the
input validated and --out locked (``open_batch``, plan.py), the endpoints checked
(endpoints.py), the items sent by the worker pool (``run_batch``, pool.py), --final exported,
the verdict recorded in the ledger. It returns a ``BatchOutcome``; the command shows it.
Everything the user sees on the way goes through ``env`` (request.py).
"""

from __future__ import annotations

import shlex
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from calibrate.engines.redaction import shown_command
from calibrate.errors import (
    CalibrateError,
    ExitCode,
    ServerUnreachable,
    StageFailed,
)
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.http.client import OpenAIClient
from calibrate.http.error_kinds import DESCRIPTORS_HINT, OutOfDescriptors
from calibrate.stages import env as stage_env
from calibrate.stages import export  # a module, not its names: export imports batch's shard
from calibrate.stages.batch.endpoints import (
    ServedModelWatch,
    baseline_served_model,
    usable_endpoints,
)
from calibrate.stages.batch.lanes import client_for, make_lane
from calibrate.stages.batch.outage import OutageEvent
from calibrate.stages.batch.plan import (
    DEFAULT_CONCURRENCY,
    MAX_CONCURRENCY,
    BatchPlan,
    BatchSpec,
    length_warning,
    open_batch,
    plan_batch,
)
from calibrate.stages.batch.pool import close_later, run_batch, stop_on_signals
from calibrate.stages.batch.request import BatchEnv, BatchRequest, BatchSetup, prepare
from calibrate.stages.batch.result import BatchOutcome, BatchResult, summary_json
from calibrate.stages.batch.worker import BatchControl
from calibrate.stages.context import StageContext
from calibrate.stages.measure.format_check import shape_checks

__all__ = [  # the stage's public face; plans are made in plan.py, workers in worker.py
    "DEFAULT_CONCURRENCY",
    "MAX_CONCURRENCY",
    "BatchControl",
    "BatchEnv",
    "BatchOutcome",
    "BatchPlan",
    "BatchRequest",
    "BatchSpec",
    "open_batch",
    "plan_batch",
    "run",
    "run_batch",
]


def run(request: BatchRequest, env: BatchEnv) -> BatchOutcome:
    """Run one batch as ``request`` asks; raise (exit 2) on a problem found before sending."""
    setup = prepare(request)
    try:
        # exit 2 on bad input, a busy or unwritable --out: before anything is sent
        with open_batch(setup.spec) as plan:
            return _opened(request, env, setup, plan)
    except MemoryError as exc:  # e.g. an absurd input line: end cleanly, never spin
        raise StageFailed(
            "ran out of memory; what completed is in --out",
            "Rerun with a lower -c, or on a machine with more memory; finished items are kept.",
        ) from exc


def _opened(
    request: BatchRequest, env: BatchEnv, setup: BatchSetup, plan: BatchPlan
) -> BatchOutcome:
    if setup.source == "default":
        env.warn(
            f"concurrency {setup.spec.concurrency} is not calibrated (nothing pinned for this "
            "target); run calibrate sweep and calibrate pin, or pass -c"
        )
    stage = stage_env.StageRequest(
        "batch",
        request.config,
        request.argv,
        gate=False,
        junit=request.junit_path,
        max_connections=min(setup.endpoints[0].concurrency, max(plan.to_run, 1)),
    )
    ctx = stage_env.open_stage(stage, env.warn)
    try:
        return _dispatch(request, env, setup, plan, ctx)
    finally:
        ctx.run.close()  # also when refused or unreachable: no run file is left open


def _dispatch(
    request: BatchRequest, env: BatchEnv, setup: BatchSetup, plan: BatchPlan, ctx: StageContext
) -> BatchOutcome:
    spec = setup.spec
    clients = [ctx.client, *(client_for(ctx.config, e) for e in setup.endpoints[1:])]
    # --sample tries the prompt: its outputs must not count as done for the real run
    out_path = spec.out_path if spec.out_path and not spec.sample else ctx.run.file("sample.jsonl")
    env.on_plan(plan, setup.source)
    long_items = length_warning(
        ctx.ledger, ctx.target, plan.source_path, spec.prompt, shown=spec.input_path
    )
    if long_items:
        env.warn(long_items)
    extra: dict[str, Any] = {"shard": str(spec.shard) if spec.shard else None}
    result = _send(request, env, setup, plan, ctx, clients, out_path, extra)
    if result.stopped_by == "unreachable":
        raise ServerUnreachable(
            result.stop_detail,
            "Start it (or try the built-in one: make mock), then rerun the same command.",
        )
    final_error = _final(request, env, plan, out_path, extra)
    return _verdict(request, env, setup, ctx, result, extra, final_error)


def _send(
    request: BatchRequest,
    env: BatchEnv,
    setup: BatchSetup,
    plan: BatchPlan,
    ctx: StageContext,
    clients: list[OpenAIClient],
    out_path: Path,
    extra: dict[str, Any],
) -> BatchResult:
    """The endpoints checked, then the items sent through a lane each; the run's result."""
    endpoints = setup.endpoints
    events: list[OutageEvent] = []
    events_lock = threading.Lock()  # events come from the workers' threads

    def on_event(event: OutageEvent) -> None:
        with events_lock:
            events.append(event)
            ctx.run.append("outages.jsonl", event.to_json())
        env.warn(f"{event.endpoint}: {event.event.replace('_', ' ')} — {event.detail}")

    control = BatchControl()
    monitor = SelfLoadMonitor().start()
    view = env.progress(plan.to_run, len(endpoints))
    try:
        usable = usable_endpoints(ctx, endpoints, clients, extra, env.on_check)
        if len(endpoints) == 1:  # no fixed-prompt check: its answers are held to one model
            watch = ServedModelWatch(
                baseline_served_model(ctx), lambda why: control.fail("other_model", why)
            )
            control.served = watch.note
        lanes = [
            make_lane(
                e,
                c,
                request.outage,
                restarter=setup.restarter if e is endpoints[0] else None,
                on_event=on_event,
            )
            for e, c in usable
        ]
        with view, stop_on_signals(control):
            return run_batch(
                plan,
                None,
                out_path,
                lanes=lanes,
                control=control,
                on_progress=view.update,
                progress_every_s=view.every_s,
                monitor=monitor,
                warn=env.warn,
                outage=request.outage,
                events=events,
            )
    finally:
        monitor.stop()
        close_later(clients)


def _final(
    request: BatchRequest, env: BatchEnv, plan: BatchPlan, out_path: Path, extra: dict[str, Any]
) -> str | None:
    """--final written (into ``extra``); why it could not be, else None."""
    spec = plan.spec
    if not request.final or spec.sample:
        return None
    try:
        final = export.export_final(
            plan.source_path, [out_path], Path(request.final), shard=spec.shard
        )
    except OSError as exc:  # the batch's verdict is still recorded; the export is not
        final_error = f"--final {request.final} could not be written: {exc}"
        paths = ("--input", plan.source_path, "--out", out_path, "--to", request.final)
        again = shlex.join(["calibrate", "export", *map(str, paths)])
        env.warn(f"{final_error}; write it later with: {again}")
        extra["final_error"] = final_error
        return final_error
    env.on_export(final)
    extra["final"] = final.to_json()
    return None


def _verdict(
    request: BatchRequest,
    env: BatchEnv,
    setup: BatchSetup,
    ctx: StageContext,
    result: BatchResult,
    extra: dict[str, Any],
    final_error: str | None,
) -> BatchOutcome:
    """Passed or not, recorded in the ledger (and --junit); the outcome to show."""
    spec = setup.spec
    summary = {**summary_json(result, spec.concurrency, setup.source), **extra}
    checks = shape_checks(result.shapes, max_chars=spec.max_chars, expect=spec.expect)
    shown = tuple(checks) if spec.sample else ()
    if spec.sample:
        summary["checks"] = [
            {"name": c.name, "passed": c.passed, "detail": c.detail} for c in checks
        ]
    # items count: a pass needs an ok line for every item this run was to do
    passed = result.ok == result.to_run and result.stopped_by is None and final_error is None
    if spec.sample:
        passed = passed and all(c.passed for c in checks)
    resume = shown_command(["calibrate", *request.argv])  # no password in it
    outcome = BatchOutcome(result, spec, shown, resume, None, None, ExitCode.FAILED)
    try:
        ctx.record_result(passed, summary)
        ctx.run.close()
        if env.junit is not None:
            env.junit(ctx.run, ctx.target, result, shown)
    except OSError as exc:
        unrecorded = StageFailed(
            f"the batch ran, but its report could not be written: {exc}",
            f"The results are in {result.out_path} ({result.ok} ok, {result.failed} failed); "
            "fix the path and rerun to record the verdict.",
        )
        unrecorded.__cause__ = exc
        return replace(outcome, error=unrecorded)
    report = {"passed": passed, "run_id": ctx.run.run_id, "resume_command": resume, **summary}
    error = _stopped(result, spec, resume)
    code = (
        ExitCode.INTERRUPTED if result.interrupted else ExitCode.OK if passed else ExitCode.FAILED
    )
    return replace(outcome, report=report, error=error, exit_code=code)


def _stopped(result: BatchResult, spec: BatchSpec, resume: str) -> CalibrateError | None:
    """The error a run that stopped early ends with, once its summary is shown."""
    if result.stopped_by == "other_model":
        return StageFailed(
            f"{result.stop_detail}; stopped after {result.ok} ok",
            f"Check what serves {spec.model!r} there, then resume with: {resume}",
        )
    if result.stopped_by == "descriptors":
        return OutOfDescriptors(result.stop_detail, f"{DESCRIPTORS_HINT} Resume with: {resume}")
    if result.stopped_by == "outage":
        return ServerUnreachable(
            f"{result.stop_detail}; {result.ok} done this run, {result.remaining} remaining",
            f"When the server answers again, resume with: {resume}",
        )
    return None
