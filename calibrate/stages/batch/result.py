"""What a batch produces: one output line per item, live counters, the final result and outcome."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from calibrate.errors import CalibrateError, ErrorInfo, ExitCode
from calibrate.gpu.selfload import SelfLoadReport
from calibrate.http.models import Choice, Completion, incomplete_reason
from calibrate.io.jobs.openai_batch import response_of
from calibrate.io.journal.made import FP_FIELD, fp_text
from calibrate.io.tasks import Task
from calibrate.numbers import rate_text
from calibrate.stages.batch.endpoints import EndpointCheck
from calibrate.stages.batch.journal import Tally
from calibrate.stages.batch.plan import BatchPlan, BatchSpec
from calibrate.stages.batch.sending.lanes import EndpointReport
from calibrate.stages.batch.sending.outage import OutageEvent
from calibrate.stages.export import ExportResult
from calibrate.stages.measure.format_check import (
    Expect,
    OutputShape,
    ParsedJson,
    ShapeCheck,
    parse_json_output,
)
from calibrate.state.drift import DriftRecord, records_json

MAX_EVENTS = 100  # outage events in the summary (all of them are in outages.jsonl)
MESSAGE_CHARS = 300  # of an internal failure's message


def pace_text(ok: int, failed: int, seconds: float) -> str:
    """A rate as the summary says it: items/s, and with failed items among them, the ok ones'
    own rate beside it (items that failed fast are no work done: 0 ok read "893 items/s")."""
    finished_per_s = (ok + failed) / seconds if seconds > 0 else 0.0
    if not failed:
        return f"{rate_text(finished_per_s, '.1f')} items/s"
    ok_per_s = ok / seconds if seconds > 0 else 0.0
    return f"{rate_text(finished_per_s, '.1f')} items/s finished, {rate_text(ok_per_s, '.1f')} ok/s"


@dataclass(frozen=True)
class BatchProgress:
    to_run: int
    finished: int
    ok: int
    failed: int
    in_flight: int
    elapsed_s: float
    stopping: bool
    down: tuple[tuple[str, float], ...] = ()  # endpoints in an outage: (label, seconds down)
    outage_limit_s: float = 0.0
    endpoints: int = 1  # endpoints the run sends to

    def __post_init__(self) -> None:
        # the counts are read without a lock: a slot still busy with an item the journal has
        # just counted (or one sent ahead to a worker) would show more in flight than are left
        left = max(self.to_run - self.finished, 0)
        object.__setattr__(self, "in_flight", min(self.in_flight, left))

    @property
    def items_per_s(self) -> float:
        return self.finished / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """The time left at the run's rate so far; None when nothing says it: no rate yet,
        stopping, or every endpoint in an outage (nothing is sent until one answers)."""
        rate = self.items_per_s
        if rate <= 0 or self.stopping or len(self.down) >= self.endpoints:
            return None
        return (self.to_run - self.finished) / rate


@dataclass(frozen=True)
class BatchResult:
    total: int
    skipped: int
    to_run: int
    ok: int
    failed_by_kind: dict[str, int]
    interrupted: bool
    abandoned: int  # in flight when the grace period ended
    stopped_by: str | None  # control.StopReason, or None (ran to the end)
    stop_detail: str  # what stopped it, for the user (or why items were not reached)
    seconds: float
    output_tokens: int  # over the ok answers that said theirs
    retried_items: int
    attempts: int
    failures: tuple[dict[str, Any], ...]  # examples: id, kind, message
    preamble: tuple[int, tuple[str, ...]]  # count, examples
    too_long: tuple[int, tuple[str, ...]]
    shapes: tuple[OutputShape, ...]  # sample mode only
    selfload: SelfLoadReport | None
    out_path: Path
    endpoints: tuple[EndpointReport, ...] = ()
    outage_events: tuple[OutageEvent, ...] = ()
    untold: int = 0  # ok answers without usage: their output tokens are unknown, not 0

    @classmethod
    def of(
        cls,
        plan: BatchPlan,
        tally: Tally,
        stopped_by: str | None,
        stop_detail: str,
        *,
        abandoned: int,
        seconds: float,
        selfload: SelfLoadReport | None,
        out_path: Path,
        endpoints: tuple[EndpointReport, ...],
        events: list[OutageEvent],
    ) -> BatchResult:
        """The result of a run (pool and worker processes alike) from its plan and tally."""
        return cls(
            total=plan.total,
            skipped=plan.skipped,
            to_run=plan.to_run,
            ok=tally.ok,
            failed_by_kind=dict(tally.kinds),
            interrupted=stopped_by == "interrupted",
            abandoned=abandoned,
            stopped_by=stopped_by,
            stop_detail=stop_detail,
            seconds=seconds,
            output_tokens=tally.output_tokens,
            retried_items=tally.retried,
            attempts=tally.attempts,
            failures=tuple(tally.failures),
            preamble=(tally.preamble_n, tuple(tally.preamble)),
            too_long=(tally.too_long_n, tuple(tally.too_long)),
            shapes=tuple(tally.shapes),
            selfload=selfload,
            out_path=out_path,
            endpoints=endpoints,
            outage_events=tuple(events),
            untold=tally.untold,
        )

    @property
    def failed(self) -> int:
        return sum(self.failed_by_kind.values())

    @property
    def finished(self) -> int:
        return self.ok + self.failed

    @property
    def unfinished(self) -> int:
        """Items this run should have finished that have neither an ok nor a failed line."""
        return max(self.to_run - self.finished, 0)

    @property
    def remaining(self) -> int:
        """Items a rerun would still do (failed ones and those not reached)."""
        return self.total - self.skipped - self.ok

    @property
    def items_per_s(self) -> float:
        """Items finished (ok or failed) per second: the pace the run went through its input."""
        return self.finished / self.seconds if self.seconds > 0 else 0.0

    @property
    def ok_per_s(self) -> float:
        """Items answered ok per second: the work done (failed items are not)."""
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    def pace_text(self) -> str:
        return pace_text(self.ok, self.failed, self.seconds)

    @property
    def output_tokens_per_s(self) -> float | None:
        """Over the answers that said their tokens; None when none of the ok ones did (the
        server sent no usage: the figure is unknown, never 0)."""
        if self.ok and self.untold >= self.ok:
            return None
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0

    def tokens_text(self) -> str:
        """The output tokens/s as the summary says it, with what it leaves out."""
        rate = self.output_tokens_per_s
        if rate is None:
            return "output tokens not reported (the server sent no usage)"
        if not self.untold:
            return f"{rate_text(rate, '.0f')} output tokens/s"
        told = self.ok - self.untold
        return f"{rate_text(rate, '.0f')} output tokens/s from the {told} answers with usage"


@dataclass(frozen=True)
class BatchOutcome:
    """How a batch ended, for the command to show and exit with.

    ``checks``: the sample's shape checks (none without --sample). ``report``: the --json
    payload, None when the verdict could not be recorded. ``error``: raised once the summary is
    shown; without one the command exits with ``exit_code``.
    """

    result: BatchResult
    spec: BatchSpec
    checks: tuple[ShapeCheck, ...]
    resume: str  # the command that resumes this batch (no secret in it)
    report: dict[str, Any] | None
    error: CalibrateError | None
    exit_code: ExitCode


def internal_line(task: Task, exc: BaseException, attempts: int) -> dict[str, Any]:
    """The failure line of an item whose handling raised ``exc`` (kind ``internal``)."""
    text = str(exc)
    if len(text) > MESSAGE_CHARS:
        text = text[: MESSAGE_CHARS - 1] + "…"
    info = ErrorInfo("internal", f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
    return {
        "id": task.id,
        "ok": False,
        FP_FIELD: fp_text(task.digest),
        "error": info.to_json(),
        "attempts": max(attempts, 1),
    }


def result_line(
    task: Task,
    completion: Completion | None,
    error: ErrorInfo | None,
    attempts: int,
    retried: tuple[str, ...],
    expect: Expect,
    max_tokens: int | None,
) -> dict[str, Any]:
    """The output line of one item; ``id`` first, ``ok`` second, then the item's digest,
    ``attempts`` last (io/journal/scan.py reads them so). A Batch API request's line also
    keeps its answer's ``response`` (io/jobs/openai_batch.py), and its body's max_tokens."""
    line: dict[str, Any] = {"id": task.id, "ok": False, FP_FIELD: fp_text(task.digest)}
    if task.request is not None:
        max_tokens = task.request.max_tokens
    if completion is not None and error is None:
        problem, parsed = _checked(completion, max_tokens, expect)
        if problem:
            error = ErrorInfo("incomplete", problem)
        elif parsed is not None and not parsed.ok:
            error = ErrorInfo("format", parsed.message)
        line["ok"] = error is None
        if error is not None:
            line["error"] = error.to_json()
        line["output"] = completion.text
        if parsed is not None and parsed.ok:
            line["parsed"] = parsed.value
        line["finish_reason"] = completion.finish_reason
        line["usage"] = completion.usage.to_json() if completion.usage else None
        line["seconds"] = round(completion.elapsed_s, 4)
        if completion.times is not None:  # when it was sent: what a replay's open loop follows
            line["sent_at"] = round(completion.times.sent_at, 6)
    else:
        line["ok"] = False
        line["error"] = (error or ErrorInfo("invalid_response", "no answer")).to_json()
    if task.request is not None:  # after the short fields: its body is the answer whole
        line["response"] = response_of(completion, error)
    if retried:
        line["retried"] = list(retried)
    line["attempts"] = attempts
    return line


def _checked(
    completion: Completion, max_tokens: int | None, expect: Expect
) -> tuple[str | None, ParsedJson | None]:
    """Every choice of an answer checked (a prompt list or ``n`` gives several): the first
    that is incomplete, else the first whose text is not the JSON ``--expect json`` asked for
    (``choice 1 of 2: …``, by its index, when there are several); and the first choice's
    parsed JSON."""
    choices = completion.choices
    usage = completion.usage if len(choices) == 1 else None  # else the sum of every choice's

    def where(choice: Choice) -> str:
        return f"choice {choice.index} of {len(choices)}: " if len(choices) > 1 else ""

    for choice in choices:
        tokens = usage.completion_tokens if usage else None
        if problem := incomplete_reason(choice, max_tokens, completion_tokens=tokens):
            return where(choice) + problem, None
    if expect != "json":
        return None, None
    found = [(choice, parse_json_output(choice.text)) for choice in choices]
    for choice, parsed in found:
        if not parsed.ok:
            return None, replace(parsed, message=where(choice) + parsed.message)
    return None, found[0][1] if found else None


@dataclass(frozen=True)
class BatchNotes:
    """What a batch's summary says beside its counts, found on the way: its shard, the worker
    processes (only when --workers was given), the endpoints' fixed-prompt check (several
    endpoints), what became of --final, and its drift from the calibration (not --sample)."""

    shard: str | None = None
    workers: int | None = None
    endpoint_check: EndpointCheck | None = None
    final: ExportResult | None = None
    final_error: str | None = None  # --final could not be written: why
    input_changed: str | None = None  # --input changed while the run read it: how
    drift: tuple[DriftRecord, ...] | None = None  # each endpoint against its calibration

    def to_json(self) -> dict[str, Any]:
        said = {  # each only when there is something to say (a plain run's summary is as it was)
            "workers": self.workers,
            "endpoint_check": self.endpoint_check.to_json() if self.endpoint_check else None,
            "input_changed": self.input_changed,
            "final_error": self.final_error,
            "final": self.final.to_json() if self.final else None,
            "drift": records_json(self.drift) if self.drift is not None else None,
        }
        return {"shard": self.shard, **{k: v for k, v in said.items() if v is not None}}


def summary_json(
    result: BatchResult,
    concurrency: int,
    concurrency_source: str,
    notes: BatchNotes,
    checks: Sequence[ShapeCheck] | None = None,
) -> dict[str, Any]:
    """The summary for ``--json``, summary.json and the ledger (``checks``: --sample's)."""
    sample = {"checks": [c.to_json() for c in checks]} if checks is not None else {}
    return {
        "out": str(result.out_path),
        "total": result.total,
        "skipped": result.skipped,
        "to_run": result.to_run,
        "done": result.ok,
        "failed": result.failed,
        "failed_by_kind": dict(sorted(result.failed_by_kind.items())),
        "remaining": result.remaining,
        "interrupted": result.interrupted,
        "abandoned": result.abandoned,
        "unfinished": result.unfinished,
        "stopped_by": result.stopped_by,
        "seconds": round(result.seconds, 3),
        "items_per_s": round(result.items_per_s, 3),
        "ok_per_s": round(result.ok_per_s, 3),
        "output_tokens": result.output_tokens,
        "output_tokens_per_s": _rounded(result.output_tokens_per_s),
        **({"answers_without_usage": result.untold} if result.untold else {}),
        "attempts": result.attempts,
        "retried_items": result.retried_items,
        "failures": list(result.failures),
        "preamble": {"count": result.preamble[0], "examples": list(result.preamble[1])},
        "too_long": {"count": result.too_long[0], "examples": list(result.too_long[1])},
        "concurrency": concurrency,
        "concurrency_source": concurrency_source,
        "selfload": result.selfload.to_json() if result.selfload else None,
        "endpoints": [e.to_json() for e in result.endpoints],
        "outages": [e.to_json() for e in result.outage_events[:MAX_EVENTS]],
        **notes.to_json(),
        **sample,
    }


@dataclass(frozen=True)
class BatchVerdict:
    """Whether a batch passed — one rule for its exit code, its ledger line and --junit — and,
    when not, why in words and the kind of its first reason (a JUnit failure's type); ``drift``:
    the endpoints' drift records its summary says (--junit says them too), none or not."""

    passed: bool
    why: str = ""
    kind: str = ""
    drift: tuple[DriftRecord, ...] = ()


def verdict_of(result: BatchResult, notes: BatchNotes, checks_passed: bool = True) -> BatchVerdict:
    """A pass needs an ok line for every item this run was to do, nothing that stopped it, an
    input that did not change under it, --final written and (--sample) every shape check."""
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(result.failed_by_kind.items()))
    reasons = (
        ("interrupted", result.interrupted, "interrupted before the end"),
        (
            ",".join(sorted(result.failed_by_kind)),
            result.failed > 0,
            f"{result.failed} of {result.finished} items failed ({kinds})",
        ),
        (
            result.stopped_by or "stopped",
            result.stopped_by is not None and not result.interrupted,  # said just above
            f"stopped: {result.stop_detail or result.stopped_by}",
        ),
        ("unfinished", result.unfinished > 0, "items left without a line"),
        ("input_changed", notes.input_changed is not None, notes.input_changed or ""),
        ("final", notes.final_error is not None, notes.final_error or ""),
        ("format", not checks_passed, "a sample output failed its shape check"),
    )
    said = [(kind, text) for kind, wrong, text in reasons if wrong]
    drift = tuple(r for r in notes.drift or () if r.said)  # a warning: it fails nothing
    if not said:
        return BatchVerdict(True, drift=drift)
    left = f"; {result.remaining} remaining" if result.remaining else ""
    return BatchVerdict(False, "; ".join(text for _, text in said) + left, said[0][0], drift)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
