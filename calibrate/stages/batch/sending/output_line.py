"""The output line each item leaves in --out: ok with its answer (every choice checked: complete,
and the JSON ``--expect json`` asks for), or failed with why — an error the item met, or one of
calibrate's own while handling it (``internal``). Written where the item was sent: in a worker
process of ``--workers N`` too."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from calibrate.errors import ErrorInfo
from calibrate.http.models import Choice, Completion, incomplete_reason
from calibrate.io.jobs.openai_batch import response_of
from calibrate.io.journal.made import FP_FIELD, fp_text
from calibrate.io.tasks import Task
from calibrate.stages.measure.format_check import Expect, ParsedJson, parse_json_output

MESSAGE_CHARS = 300  # of an internal failure's message


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
