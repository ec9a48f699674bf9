"""Stage A: one fixed prompt at temperature 0, checked for completeness (SPEC §5.1)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from calibrate.errors import ErrorInfo, InputError, RequestError, ServerUnreachable
from calibrate.http.error_kinds import reach_hint, refusal_cause
from calibrate.http.models import ServerIdentity, incomplete_reason
from calibrate.http.request_times import RequestTimes, monotonic
from calibrate.http.server_context import props_model_path
from calibrate.io.atomic import copy_atomic, write_atomic
from calibrate.io.baseline import read_baseline
from calibrate.io.jsonl import dumps_line
from calibrate.io.records import RequestRecord
from calibrate.numbers import finite, seconds_text
from calibrate.redact import one_line, redact_url
from calibrate.stages.context import StageContext
from calibrate.stages.measure.item_records import unanswered_record
from calibrate.state.ledger import baseline_path
from calibrate.state.summaries import PlainSummary

log = logging.getLogger("calibrate")


def baseline_answer_s(path: Path) -> float | None:
    """How long the baseline's answer took (its record's ``elapsed_s``); None without one (or
    with one that cannot be read: the stage that needs it says so, not its progress line)."""
    try:
        record = read_baseline(path)  # bounded, and its JSON read as every file's is
    except InputError:
        return None
    took = finite(record.get("elapsed_s"))
    return took if took is not None and took > 0 else None


def waiting_line(ctx: StageContext, stage: str, runs: int = 1) -> str:
    """The one line said before a stage waits for the fixed prompt's answer: how long the
    baseline's took, or how long it may wait — so a slow server does not look like a hung one."""
    what = "the fixed prompt" if runs == 1 else f"the fixed prompt {runs} times, one after another"
    took = baseline_answer_s(baseline_path(ctx.config))
    if took is None:
        limit = ctx.config.target.timeout_s
        return f"{stage}: sending {what}; waiting for the first answer (timeout_s {limit:g})"
    return f"{stage}: sending {what} (the baseline's answer took {seconds_text(took)} s)"


def unreachable(info: ErrorInfo | None, base_url: str) -> ServerUnreachable:
    """Exit 4 with the client's own words (refused, name not resolved, no route, no TLS) and
    the hint that fits them."""
    message = info.message if info is not None else f"no server at {redact_url(base_url)}"
    return ServerUnreachable(message, reach_hint(message))


def fixed_prompt_call(ctx: StageContext, *, stream: bool = False) -> RequestRecord:
    """Send the fixed prompt once and return its record (also for failures; ``ok`` tells)."""
    cfg = ctx.config
    params = ctx.params
    sent = monotonic()
    try:
        completion = ctx.client.chat(cfg.target.model, cfg.prompt.text, params, stream=stream)
    except RequestError as exc:
        if exc.kind == "connect":
            raise unreachable(exc.info, cfg.target.base_url) from exc
        times = RequestTimes.of(sent, monotonic())
        return _unanswered(ctx, exc.info, times, times.elapsed_s)
    problem = incomplete_reason(
        completion.choices[0],
        params.max_tokens,
        completion_tokens=completion.usage.completion_tokens if completion.usage else None,
    )
    error = ErrorInfo("incomplete", problem) if problem else None
    return replace(
        _unanswered(ctx, error, completion.times, completion.elapsed_s),
        text=completion.text,
        finish_reason=completion.finish_reason,
        usage=completion.usage,
        ttft_s=completion.ttft_s,
        served_model=completion.served_model,
        system_fingerprint=completion.system_fingerprint,
        ok=error is None,
    )


def _unanswered(
    ctx: StageContext, error: ErrorInfo | None, times: RequestTimes | None, elapsed_s: float
) -> RequestRecord:
    """The fixed prompt's record with no answer in it: ``error`` says why (or none yet)."""
    prompt = ctx.config.prompt.text
    return unanswered_record(ctx, prompt, ctx.params, elapsed_s=elapsed_s, error=error, times=times)


def server_identity(ctx: StageContext) -> tuple[ServerIdentity, list[str]]:
    """``GET /v1/models``; no server there ends the stage with exit 4."""
    try:
        models, more = ctx.client.model_list(keep=ctx.config.target.model)
        return ServerIdentity(models=models, more_models=more), []
    except RequestError as exc:
        if exc.kind == "connect":
            raise unreachable(exc.info, ctx.config.target.base_url) from exc
        return ServerIdentity(), [f"GET /v1/models failed ({exc.info.message}); identity unknown"]


@dataclass(frozen=True)
class SingleResult:
    record: RequestRecord
    identity: ServerIdentity
    problems: tuple[str, ...]
    warnings: tuple[str, ...]
    baseline: str | None  # what happened to the baseline: "written", "replaced", None
    accepted_model: str | None = None  # what the server serves, accepted by --accept-model

    @property
    def passed(self) -> bool:
        return not self.problems

    def summary(self) -> dict[str, Any]:
        record = self.record
        return {
            "finish_reason": record.finish_reason,
            "elapsed_s": round(record.elapsed_s, 6),
            "served_model": record.served_model,
            "problems": list(self.problems),
            "identity": self.identity.to_json(),
            "accepted_model": self.accepted_model,
        }


def diagnose(
    record: RequestRecord,
    identity: ServerIdentity,
    model: str,
    *,
    streamed: bool = False,
    timeout_s: float | None = None,
) -> list[str]:
    """Why the single call failed, one specific diagnosis per cause (SPEC §5.1)."""
    if record.error is not None and record.error.kind != "incomplete":
        info = record.error
        known = known_cause(info, identity, model, streamed=streamed, timeout_s=timeout_s)
        return [known or f"the request failed ({info.kind}): {info.message}"]
    problems: list[str] = []
    if record.error is not None:
        problems.append(record.error.message)
    if record.usage is None or not record.usage.complete:
        problems.append("the server did not report token usage (prompt and completion tokens)")
    return problems


def known_cause(
    info: ErrorInfo,
    identity: ServerIdentity,
    model: str,
    *,
    streamed: bool = False,
    timeout_s: float | None = None,
) -> str | None:
    """What a failed request says of its cause, where the request itself is the likely one
    (the prompt, the model name, streaming, the client's own timeout) and what to change; None
    where only the server can tell (an error it answered, a reset, a crash)."""
    cause = refusal_cause(info) if info.kind == "http_4xx" else None
    if cause == "context_length":  # vLLM's 400 names "This model's maximum context length"
        return (
            f"the server refused the prompt as too long for its context ({info.message}); "
            "shorten [prompt].text or lower max_tokens, or serve a longer context"
        )
    if info.kind == "http_4xx" and identity.model_ids and model not in identity.model_ids:
        return f"the server does not serve {model!r}; it serves: {identity.models_text}"
    unknown = cause == "unknown_model" or (info.status == 404 and "model" in info.message.lower())
    if info.status in (404, 400) and unknown:
        served = identity.models_text or "unknown (GET /v1/models gave nothing)"
        return f"the server does not serve {model!r}; it serves: {served}"
    if streamed and info.kind == "http_4xx":  # --stream asked for it: said, not worked around
        return (
            f"the streamed request was refused ({info.message}): the server (or a proxy) may "
            "not accept streaming; try without --stream (ladder and sweep fall back by themselves)"
        )
    if info.kind == "timeout" and timeout_s is not None:  # whose limit it was, said
        return (
            f"the request failed (timeout): {info.message} — the client's own limit, [target] "
            f"timeout_s = {timeout_s:g} s: raise it if the server needs longer (a long answer, a "
            "cold engine), else check the server (calibrate server status; calibrate server logs)"
        )
    return None


def model_mismatch(identity: ServerIdentity, served_model: str | None, model: str) -> str | None:
    """What the server serves when it is not the configured model ("right endpoint, wrong
    weights"): the answer's own ``model``, else ``/v1/models`` when it lists others only."""
    if served_model and served_model != model:
        return one_line(served_model)  # a name is shown on calibrate's line, never its own
    if not served_model and identity.model_ids and model not in identity.model_ids:
        return identity.models_text
    return None


def mismatch_problem(served: str, model: str) -> str:
    return (
        f"the server serves {served!r}, the config names {model!r} (right endpoint, wrong "
        f"weights?): fix target.model (or the server's weights), or pass --accept-model if "
        f"{model!r} is meant as an alias of {served!r}"
    )


def run_single(
    ctx: StageContext,
    *,
    stream: bool = False,
    save_baseline: bool = False,
    accept_model: bool = False,
    after: Callable[[], tuple[bool, dict[str, Any]]] | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> SingleResult:
    """The fixed prompt once; ``after`` (``--determinism``) runs when it passed, before the
    ledger line: (whether it passed, what it adds to the summary). ``say`` is told before the
    wait for the answer (``waiting_line``)."""
    identity, warnings = server_identity(ctx)
    model = ctx.config.target.model
    say(waiting_line(ctx, "single"))
    record = fixed_prompt_call(ctx, stream=stream)
    ctx.run.append("records.jsonl", record.to_json())
    identity = replace(
        identity, served_model=record.served_model, system_fingerprint=record.system_fingerprint
    )
    problems = diagnose(
        record, identity, model, streamed=stream, timeout_s=ctx.config.target.timeout_s
    )
    answered = record.error is None or record.error.kind == "incomplete"
    if answered and identity.model_ids and model not in identity.model_ids:  # else the failure says
        warnings.append(f"the server lists {identity.models_text} but the config names {model!r}")
    served = model_mismatch(identity, record.served_model, model) if answered else None
    accepted = None
    if served is not None and accept_model:
        accepted = served
        warnings.append(f"--accept-model: {model!r} accepted as an alias of {served!r} (recorded)")
    elif served is not None:
        problems.insert(0, mismatch_problem(served, model))
    result = SingleResult(record, identity, tuple(problems), tuple(warnings), None, accepted)
    ctx.run.update_manifest(server=identity.to_json())
    passed, more = after() if result.passed and after is not None else (result.passed, {})
    if passed:  # a stage that failed (its copies too) writes no baseline to open repro's gate
        path = baseline_path(ctx.config)
        written = write_baseline(path, record, replace_existing=save_baseline)
        result = replace(result, baseline=written)
    summary = PlainSummary({**result.summary(), **more})
    root = served_root(identity, model) or props_model_path(ctx.client)  # llama.cpp: /props
    ctx.record_result(passed, summary, served_root=root)
    ctx.run.close()
    return result


def served_root(identity: ServerIdentity, model: str) -> str:
    """Where the served weights come from, as ``/v1/models`` says (vLLM's ``root``); "" unknown."""
    named = [m for m in identity.models if m.id == model] or list(identity.models[:1])
    return (named[0].root or "") if named else ""


def write_baseline(path: Path, record: RequestRecord, *, replace_existing: bool) -> str | None:
    """First pass writes the baseline; ``--save-baseline`` replaces it, keeping the old one."""
    if path.exists() and not replace_existing:
        return None
    action = "written"
    if path.exists():
        stamp = record.ts.replace(":", "").replace("-", "").replace(".", "")
        copy_atomic(path, path.with_name(f"{path.stem}.{stamp}{path.suffix}"))
        action = "replaced"
    write_atomic(path, dumps_line(record.to_json()) + "\n")
    return action
