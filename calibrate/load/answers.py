"""An answer or a failure as items: each prompt of a request becomes one ``ItemResult``, a
failure too, with the body that was sent (an incident can be written for it)."""

from __future__ import annotations

from collections.abc import Callable

from calibrate.errors import ErrorInfo, RequestError, format_traceback
from calibrate.http.models import Completion, ContextLimit, incomplete_reason
from calibrate.http.request_times import RequestTimes
from calibrate.load.items import ItemResult
from calibrate.load.request import Request


def failed_item(
    request: Request,
    n: int,
    started: float,
    done: float,
    info: ErrorInfo,
    exc_type: str | None,
    tb: str | None,
    times: RequestTimes | None = None,
) -> ItemResult:
    """Prompt ``n`` of a request that got no answer, as a failed item."""
    return ItemResult(
        index=request.first_index + n,
        prompt=request.prompts[n],
        path=request.path,
        body=request.body,
        text=None,
        finish_reason=None,
        usage=None,
        completion_tokens=0,
        elapsed_s=done - started,
        ttft_s=None,
        started_s=started,
        done_s=done,
        error=info,
        exception_type=exc_type,
        traceback=tb,
        role=request.role,
        input_tokens_target=request.target(n),
        times=times,
    )


def answer_items(
    request: Request,
    completion: Completion,
    started: float,
    done: float,
    max_tokens: int | None,
    context: Callable[[], ContextLimit | None] = lambda: None,
) -> list[ItemResult]:
    """One item per prompt of an answered request (a cut or missing choice: a failed one)."""
    count = len(request.prompts)
    reported = completion.usage.completion_tokens if completion.usage else None
    total_tokens = output_tokens(completion) or 0
    out: list[ItemResult] = []
    for n in range(count):
        choice = completion.choices[n] if n < len(completion.choices) else None
        error: ErrorInfo | None = None
        # A prompt list reports one usage for all its prompts: each item gets its share.
        share = (
            (total_tokens // count + (1 if n < total_tokens % count else 0)) if total_tokens else 0
        )
        if choice is None:
            error = ErrorInfo(
                "invalid_response",
                f"{count} prompts sent, {len(completion.choices)} choices returned",
            )
        else:
            problem = incomplete_reason(
                choice,
                max_tokens,
                forced_tokens=request.forced_tokens,
                completion_tokens=share if reported is not None else None,
                prompt_tokens=completion.usage.prompt_tokens
                if completion.usage and count == 1
                else None,
                context=context,
            )
            if problem:
                error = ErrorInfo("incomplete", problem)
        out.append(
            ItemResult(
                index=request.first_index + n,
                prompt=request.prompts[n],
                path=request.path,
                body=request.body,
                text=choice.text if choice else None,
                finish_reason=choice.finish_reason if choice else None,
                usage=completion.usage if count == 1 else None,
                completion_tokens=share,
                elapsed_s=completion.elapsed_s,
                ttft_s=completion.ttft_s,
                started_s=started,
                stream=completion.stream if count == 1 else None,
                done_s=done,
                served_model=completion.served_model,
                system_fingerprint=completion.system_fingerprint,
                error=error,
                role=request.role,
                input_tokens_target=request.target(n),
                times=completion.times,
            )
        )
    return out


def wants_context(request: Request, completion: Completion) -> bool:
    """Whether judging this answer needs the server's context: a forced answer cut short."""
    if request.forced_tokens is None:
        return False
    if all(choice.finish_reason != "length" for choice in completion.choices):
        return False
    asked: list[bool] = []
    answer_items(request, completion, 0.0, 0.0, None, lambda: asked.append(True))
    return bool(asked)


def items_of(
    request: Request,
    completion: Completion | None,
    failure: BaseException | None,
    context: ContextLimit | None,
    started_s: float,
    done_s: float,
    max_tokens: int | None,
    sent: float,
    ended: float,
) -> list[ItemResult]:
    """A request's items: its answer's, or one failed item per prompt (a failure's times are
    ``sent`` and ``ended``, readings of the requests' clock; an answer's are the transport's).
    An answer that cannot be turned into items (calibrate's own bug) is its failure;
    ``context`` is the server's, read for a forced answer cut short."""
    if completion is not None:
        try:
            return answer_items(request, completion, started_s, done_s, max_tokens, lambda: context)
        except Exception as exc:  # recorded all the same, never a lost request
            failure = exc
    if isinstance(failure, RequestError):
        info, kind = failure.info, failure.exc_type or type(failure).__name__
    else:  # a bug of calibrate's own: recorded, never a lost request
        info = ErrorInfo("internal", f"{type(failure).__name__}: {failure}")
        kind = type(failure).__name__
    times = RequestTimes.of(sent, ended)
    tb = format_traceback(failure) if isinstance(failure, Exception) else None
    return [
        failed_item(request, n, started_s, done_s, info, kind, tb, times)
        for n in range(len(request.prompts))
    ]


def stuck_items(
    request: Request, started_s: float, now_s: float, sent: float, now: float
) -> list[ItemResult]:
    """A request never answered, as failed items (``sent`` and ``now``: clock readings)."""
    info = ErrorInfo("timeout", f"no answer within {now_s - started_s:.0f} s")
    times = RequestTimes.of(sent, now)
    return [
        failed_item(request, n, started_s, now_s, info, None, None, times)
        for n in range(len(request.prompts))
    ]


def output_tokens(completion: Completion) -> int | None:
    """An answer's output tokens: its usage's count; with no usage in a stream (llama.cpp
    without include_usage), its chunks; else None — the server did not say, which is no 0."""
    if completion.usage is not None and completion.usage.completion_tokens is not None:
        return completion.usage.completion_tokens
    return completion.stream.output_tokens if completion.stream is not None else None
