"""Sending load: a wave (requests released together, all answered before the next) for the
ladder, and a closed loop (C kept in flight until a window ends, then drained) for the sweep.

Every item comes back as an ``ItemResult`` — failures too, with the body that was sent, so an
incident can be written for it. The ladder never retries: a failure is information.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from calibrate.config import LadderMode
from calibrate.errors import ErrorInfo, RequestError, format_traceback
from calibrate.http.client import OpenAIClient
from calibrate.http.models import Completion, ContextLimit, SamplingParams, incomplete_reason
from calibrate.http.request_times import RequestTimes, epoch_at, monotonic
from calibrate.http.server_context import read_context
from calibrate.load.items import ItemResult, ItemRole
from calibrate.load.open_loop import OpenRun, open_loop
from calibrate.load.window import LevelWindow, LoopRun

Clock = Callable[[], float]
CHAT_PATH = "/chat/completions"
COMPLETIONS_PATH = "/completions"


@dataclass(frozen=True)
class Request:
    """One HTTP request carrying one prompt (chat) or several (a completions prompt list)."""

    path: str
    body: dict[str, Any]
    prompts: tuple[str, ...]
    first_index: int
    role: ItemRole = "fixed"
    input_tokens_target: tuple[int | None, ...] = ()  # per prompt, when the workload sized it
    forced_tokens: int | None = None  # the answer length the body forces (SPEC §5.11)

    def target(self, n: int) -> int | None:
        return self.input_tokens_target[n] if n < len(self.input_tokens_target) else None


def build_requests(
    client: OpenAIClient,
    model: str,
    params: SamplingParams,
    waves: Sequence[Sequence[str]],
    mode: LadderMode,
    *,
    stream: bool = False,
    stream_options: bool = True,
    first_index: int = 1,
    role: ItemRole = "fixed",
    targets: Sequence[int | None] = (),
    extra: Mapping[str, Any] | None = None,
    forced_tokens: int | None = None,
) -> list[Request]:
    """wave: one chat request per prompt; prompt-list: one completions request per wave.

    ``extra`` fields are added to every body (a forced answer length); ``targets`` are the
    input lengths the workload sized each prompt to, in prompt order; ``stream_options`` off
    leaves that field out of streamed bodies (a server that refuses it).
    """
    out: list[Request] = []
    index = first_index
    fields = dict(extra or {})

    def sized(count: int) -> tuple[int | None, ...]:
        start = index - first_index
        return tuple(targets[start : start + count]) if targets else ()

    for prompts in waves:
        if mode == "prompt-list":
            body = client.completions_body(
                model, prompts, params, stream=stream, stream_options=stream_options
            )
            body = {**body, **fields}
            out.append(
                Request(
                    COMPLETIONS_PATH,
                    body,
                    tuple(prompts),
                    index,
                    role,
                    sized(len(prompts)),
                    forced_tokens,
                )
            )
            index += len(prompts)
            continue
        for prompt in prompts:
            body = client.chat_body(
                model, prompt, params, stream=stream, stream_options=stream_options
            )
            body = {**body, **fields}
            out.append(Request(CHAT_PATH, body, (prompt,), index, role, sized(1), forced_tokens))
            index += 1
    return out


class Sender:
    """Sends requests with at most ``workers`` in flight and times every item."""

    _context: dict[str, ContextLimit | None] | None = None  # per model, asked once
    _context_lock = threading.Lock()

    def __init__(self, client: OpenAIClient, clock: Clock = time.perf_counter) -> None:
        self.client = client
        self.clock = clock

    def send(
        self, requests: Sequence[Request], workers: int, max_tokens: int | None = None
    ) -> tuple[list[ItemResult], float]:
        """All results (in item order) and the wall time from the first send to the last answer.

        The workers are daemon threads pulling the next request under a lock: at most
        ``workers`` in flight, and on Ctrl-C the process exits without waiting for requests
        still on the wire (each would otherwise hold it up to the client's timeout).
        """
        start = self.clock()
        slots: list[list[ItemResult] | None] = [None] * len(requests)
        lock = threading.Lock()
        cursor = iter(range(len(requests)))

        def work() -> None:
            while True:
                with lock:
                    index = next(cursor, None)
                if index is None:
                    return
                slots[index] = self._one(requests[index], start, max_tokens)

        threads = [
            threading.Thread(target=work, name=f"calibrate-send-{n}", daemon=True)
            for n in range(max(1, min(workers, len(requests) or 1)))
        ]
        for thread in threads:
            thread.start()
        # Every request has the client's timeout; this bound only guards against a stuck worker.
        deadline = time.monotonic() + self.client.timeout_s * 2 + 30
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        results: list[ItemResult] = []
        for request, slot in zip(requests, slots, strict=True):
            results.extend(slot if slot is not None else self._stuck(request, start))
        return sorted(results, key=lambda r: r.index), self.clock() - start

    def closed_loop(
        self,
        supply: Callable[[], Request],
        concurrency: int,
        window: LevelWindow,
        max_tokens: int | None = None,
    ) -> LoopRun:
        """Keep ``concurrency`` requests in flight — each worker starts the next from ``supply``
        as soon as its answer is in — until ``window`` is done, then let those in flight finish.
        A failed answer ends the run the same way: the level fails, more load only adds noise.

        Times are on this sender's clock (injectable: the loop is tested with a fake one).
        """
        start = self.clock()
        lock = threading.Lock()
        results: list[ItemResult] = []
        in_flight: dict[int, Request] = {}
        state: dict[str, float | None] = {"full_s": None, "stop_s": None}
        started = 0

        def work() -> None:
            nonlocal started
            while True:
                with lock:
                    now = self.clock() - start
                    if state["stop_s"] is not None or window.done(now, started):
                        if state["stop_s"] is None:
                            state["stop_s"] = now
                        return
                    request = supply()
                    started += 1
                    number = started
                    in_flight[number] = request
                    if started == concurrency:
                        state["full_s"] = now
                answered = self._one(request, start, max_tokens)
                with lock:
                    results.extend(answered)
                    del in_flight[number]
                    if state["stop_s"] is None and any(not a.ok for a in answered):
                        state["stop_s"] = self.clock() - start

        threads = [
            threading.Thread(target=work, name=f"calibrate-loop-{n}", daemon=True)
            for n in range(max(1, concurrency))
        ]
        for thread in threads:
            thread.start()
        # The window bounds the loop; this only guards against a worker stuck past its timeout.
        deadline = time.monotonic() + window.min_s + self.client.timeout_s * 2 + 30
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with lock:
            for request in in_flight.values():
                results.extend(self._stuck(request, start))
            items = tuple(sorted(results, key=lambda r: r.index))
            started_at = epoch_at(start) if self.clock is monotonic else None
            return LoopRun(
                items, self.clock() - start, state["full_s"], state["stop_s"], started_at
            )

    def open_loop(
        self,
        requests: Sequence[Request],
        schedule: Sequence[float],
        cap: int | None,
        max_tokens: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> OpenRun:
        """Send ``requests[n]`` at ``schedule[n]`` s whatever the answers (SPEC §5.13), at most
        ``cap`` in flight, and wait for every answer (``stages.open_loop``)."""
        join_s = (schedule[-1] if schedule else 0.0) + self.client.timeout_s * 2 + 30
        return open_loop(
            lambda n, t0: self._one(requests[n], t0, max_tokens),
            schedule,
            cap,
            clock=self.clock,
            sleep=sleep,
            join_s=join_s,
            unanswered=lambda n, t0: self._stuck(requests[n], t0),
        )

    def _one(self, request: Request, t0: float, max_tokens: int | None) -> list[ItemResult]:
        sent = monotonic()  # a failure's times (an answer's own are the client's)
        started = self.clock() - t0
        try:
            completion = self.client.post_completion(request.path, request.body)
            done = self.clock() - t0
            context = functools.partial(self.server_context, str(request.body.get("model", "")))
            return _answered(request, completion, started, done, max_tokens, context)
        except RequestError as exc:
            done = self.clock() - t0
            times = RequestTimes.of(sent, monotonic())
            return [
                _failed(
                    request,
                    n,
                    started,
                    done,
                    exc.info,
                    exc.exc_type or type(exc).__name__,
                    format_traceback(exc),
                    times,
                )
                for n in range(len(request.prompts))
            ]
        except Exception as exc:  # a bug of calibrate's own: recorded, never a lost request
            info = ErrorInfo("internal", f"{type(exc).__name__}: {exc}")
            done = self.clock() - t0
            times = RequestTimes.of(sent, monotonic())
            tb = format_traceback(exc)
            return [
                _failed(request, n, started, done, info, type(exc).__name__, tb, times)
                for n in range(len(request.prompts))
            ]

    def server_context(self, model: str) -> ContextLimit | None:
        """The server's context for one request (``stages.server_context``), read the first
        time an answer is cut short and kept: a cut forced answer is then named with it."""
        with self._context_lock:
            if self._context is None:
                self._context = {}
            if model not in self._context:
                self._context[model] = read_context(self.client, model)
            return self._context[model]

    def _stuck(self, request: Request, t0: float) -> list[ItemResult]:
        now = self.clock() - t0
        info = ErrorInfo("timeout", f"no answer within {now:.0f} s")
        times = RequestTimes.of(monotonic() - now, monotonic())  # send unknown: the loop's start
        return [
            _failed(request, n, 0.0, now, info, None, None, times)
            for n in range(len(request.prompts))
        ]


def _failed(
    request: Request,
    n: int,
    started: float,
    done: float,
    info: ErrorInfo,
    exc_type: str | None,
    tb: str | None,
    times: RequestTimes | None = None,
) -> ItemResult:
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


def _answered(
    request: Request,
    completion: Completion,
    started: float,
    done: float,
    max_tokens: int | None,
    context: Callable[[], ContextLimit | None] = lambda: None,
) -> list[ItemResult]:
    count = len(request.prompts)
    reported = completion.usage.completion_tokens if completion.usage else None
    timing = completion.stream
    # No usage in the stream (llama.cpp without include_usage): the chunks are the count.
    total_tokens = reported if reported is not None or timing is None else timing.output_tokens
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
                stream=timing if count == 1 else None,
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
