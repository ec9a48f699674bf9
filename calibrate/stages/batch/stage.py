"""Stage F, the production run (SPEC §5.9): tasks JSONL → results JSONL, concurrent, resumable.

``run(request, env)`` is the whole stage: the request resolved and checked (request.py), the
input validated and --out locked (``open_batch``, plan.py), the endpoints checked
(endpoints.py) and the items sent under watch (send.py) by the engine (``run_items``,
sending/items.py; by N processes with --workers N, sending/workers.py), --final exported, the
verdict recorded in the ledger. It returns a ``BatchOutcome``; the command shows it.
Everything the user sees on the way goes through ``env`` (env.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from calibrate.errors import CalibrateError, ExitCode, ServerUnreachable, StageFailed, os_error_text
from calibrate.http.error_kinds import reach_hint
from calibrate.load.procs.worker_count import workers_for
from calibrate.stages.batch.endpoints import endpoint_target
from calibrate.stages.batch.env import BatchEnv, QuietEnv
from calibrate.stages.batch.lengths import length_warning
from calibrate.stages.batch.plan import (
    DEFAULT_CONCURRENCY,
    MAX_CONCURRENCY,
    BatchPlan,
    BatchSpec,
    open_batch,
    plan_batch,
)
from calibrate.stages.batch.request import (
    PIPED,
    BatchRequest,
    BatchSetup,
    prepare,
    resume_command,
    said,
    stopped_error,
)
from calibrate.stages.batch.result import BatchOutcome, BatchResult
from calibrate.stages.batch.send import send_items
from calibrate.stages.batch.sending.control import BatchControl
from calibrate.stages.batch.sending.items import run_batch
from calibrate.stages.batch.summary import BatchNotes, summary_json, verdict_of
from calibrate.stages.context import StageContext
from calibrate.stages.env import StageRequest, load_lock, open_stage
from calibrate.stages.export import export_final
from calibrate.stages.measure.format_check import shape_checks
from calibrate.state.summaries import PlainSummary

__all__ = [  # the stage's public face; plans are made in plan.py, sent in sending.py
    "DEFAULT_CONCURRENCY",
    "MAX_CONCURRENCY",
    "BatchControl",
    "BatchEnv",
    "BatchOutcome",
    "BatchPlan",
    "BatchRequest",
    "BatchSpec",
    "QuietEnv",
    "open_batch",
    "plan_batch",
    "run",
    "run_batch",
]


def run(request: BatchRequest, env: BatchEnv) -> BatchOutcome:
    """Run one batch as ``request`` asks; its outcome says how it ended.

    Raises what ends it before there is a summary to show: a usage or input problem (exit 2,
    nothing sent), refused endpoints (exit 1), no server at all (exit 4).
    """
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
    stage = StageRequest(
        "batch",
        request.config,
        request.argv,
        gate=False,
        junit=request.junit_path,
        max_connections=min(setup.endpoints[0].concurrency, max(plan.to_run, 1)),
        ledger=setup.ledger,
    )
    ctx = open_stage(stage, env.warn)
    try:
        spec = setup.spec
        # --sample tries the prompt: its outputs must not count as done for the real run
        out_path = (
            spec.out_path if spec.out_path and not spec.sample else ctx.run.file("sample.jsonl")
        )
        servers = [endpoint_target(ctx.config, e.base_url) for e in setup.endpoints]
        # every server it sends to: beside other batches, never beside a stage that measures
        with load_lock(ctx, shared=True, also=servers):
            return _dispatch(_Batch(request, env, setup, plan, ctx, out_path))
    finally:
        ctx.run.close()  # also when refused or unreachable: no run file is left open


@dataclass(frozen=True)
class _Batch:
    """One batch under way: what was asked, how it talks, what it resolved to, its run folder."""

    request: BatchRequest
    env: BatchEnv
    setup: BatchSetup
    plan: BatchPlan
    ctx: StageContext
    out_path: Path

    @property
    def spec(self) -> BatchSpec:
        return self.plan.spec  # the setup's, with what the plan found (the input's format)


def _dispatch(b: _Batch) -> BatchOutcome:
    """The plan said, the items sent, --final written, the verdict recorded."""
    spec, ctx = b.spec, b.ctx
    b.env.on_plan(b.plan, b.setup.source)
    long_items = length_warning(
        ctx.ledger, ctx.target, b.plan.source_path, spec.prompt, shown=spec.input_path
    )
    if long_items:
        b.env.warn(long_items)
    slots = sum(min(e.concurrency, max(b.plan.to_run, 1)) for e in b.setup.endpoints)
    workers = workers_for(b.request.workers, slots)  # one rule with the sweep's and ladder's
    notes = BatchNotes(
        shard=str(spec.shard) if spec.shard else None,
        workers=workers if b.request.workers != 1 else None,  # said only when asked for
    )
    result, notes = send_items(
        b.ctx, b.env, b.setup, b.plan, b.out_path, b.request.outage, workers, notes
    )
    changed = b.plan.input_changed()
    if changed is not None:  # what was sent may not be what was validated: say so, keep all
        notes = replace(notes, input_changed=f"{spec.input_path} changed during the run: {changed}")
        b.env.warn(
            f"{notes.input_changed}; {result.finished} result(s) of this run are in "
            f"{b.out_path}, nothing is lost"
        )
    if b.plan.piped and (result.remaining or result.interrupted):
        b.env.warn(PIPED.format(path=spec.input_path))
    if result.stopped_by == "unreachable":
        raise ServerUnreachable(
            result.stop_detail,
            f"{reach_hint(result.stop_detail).removesuffix('.')}; then rerun the same command.",
        )
    return _verdict(b, result, _final(b, notes))


def _final(b: _Batch, notes: BatchNotes) -> BatchNotes:
    """--final written (said in the summary), or why it could not be, in the notes."""
    final_text, plan = b.request.final, b.plan
    if not final_text or b.spec.sample:
        return notes
    if notes.input_changed is not None:  # its items are not those the run was given
        final_error = f"--final {final_text} not written: the input changed during the run"
        b.env.warn(f"{final_error}; it is written by the resume that completes the run")
        return replace(notes, final_error=final_error)
    try:
        final = export_final(
            plan.source_path,
            [b.out_path],
            Path(final_text),
            shard=b.spec.shard,
            input_name=b.spec.input_path,
        )
    except (OSError, CalibrateError) as exc:  # the verdict is still recorded; the export is not
        why = os_error_text(exc) if isinstance(exc, OSError) else said(exc)
        final_error = f"--final {final_text} could not be written: {why}"
        words = ["export", "--input", str(b.spec.input_path), "--out", str(b.out_path)]
        again = resume_command([*words, "--to", final_text], b.spec.input_path, plan.piped)
        b.env.warn(f"{final_error}; write it later with: {again}")
        return replace(notes, final_error=final_error)
    b.env.on_export(final)
    return replace(notes, final=final)


def _verdict(b: _Batch, result: BatchResult, notes: BatchNotes) -> BatchOutcome:
    """Passed or not, recorded in the ledger (and --junit); the outcome to show."""
    spec, ctx = b.spec, b.ctx
    checks = shape_checks(result.shapes, max_chars=spec.max_chars, expect=spec.expect)
    shown = tuple(checks) if spec.sample else ()
    sample = shown if spec.sample else None
    # the endpoints the run sent to: one benched by the fixed-prompt check had no slot in it
    ran = sum(e.concurrency for e in result.endpoints) or spec.concurrency
    summary = summary_json(result, ran, b.setup.source, notes, sample)
    summary["input_format"] = spec.format
    verdict = verdict_of(result, notes, not spec.sample or all(c.passed for c in checks))
    passed = verdict.passed
    resume = resume_command(b.request.argv, spec.input_path, b.plan.piped)  # no password in it
    outcome = BatchOutcome(result, spec, shown, resume, None, None, ExitCode.FAILED)
    try:
        ctx.record_result(passed, PlainSummary(summary), interrupted=result.interrupted)
        ctx.run.close()
        b.env.write_junit(ctx.run, ctx.target, result, shown, verdict)
    except OSError as exc:
        unrecorded = StageFailed(
            f"the batch ran, but its report could not be written: {os_error_text(exc)}",
            f"The results are in {b.out_path} ({result.ok} ok, {result.failed} failed); "
            "fix the path and rerun to record the verdict.",
        )
        unrecorded.__cause__ = exc
        return replace(outcome, error=unrecorded)
    report = {"passed": passed, "run_id": ctx.run.run_id, "resume_command": resume, **summary}
    code = (
        ExitCode.INTERRUPTED if result.interrupted else ExitCode.OK if passed else ExitCode.FAILED
    )
    error = stopped_error(result, spec, resume, notes.input_changed)
    return replace(outcome, report=report, error=error, exit_code=code)
