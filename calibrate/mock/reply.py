"""The mock's reply to one admitted generate request: its fate, its pace, its body.

An injected fault is answered as an engine would (OOM, 429, 500, a reset connection); a reply of
a wrong shape (``--malformed-rate``) keeps the envelope (id, object, model) and breaks one thing
a client must check; an answer is paced by its admission's timing, or — when the mock tracks
tokens — decoded step by step against the shared KV ledger (``DecodeRun``): the step time then
depends on what the whole batch holds at that moment (``MockModel.step_s``), so it cannot be
fixed at arrival. Steps advance in ticks of at least ``MIN_TICK_S`` (several tokens per tick when
tokens are fast) on a virtual clock that never drifts: a late wake-up is caught up on the next
tick, as the fixed-timing path does.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Callable
from email.message import Message
from typing import Protocol

from calibrate.mock.admission import Admission
from calibrate.mock.answer import Generation
from calibrate.mock.kv import SeqPlan
from calibrate.mock.model import MockModel
from calibrate.mock.openai import bodies
from calibrate.mock.openai.request import GenerateRequest, Json, error_body
from calibrate.mock.openai.stream import stream_events
from calibrate.mock.settings import MockSettings
from calibrate.mock.wire import Wire

OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate {gib:.2f} GiB. GPU 0 has a total capacity of "
    "{total:.2f} GiB of which {free:.2f} GiB is free. Of the allocated memory {used:.2f} GiB is "
    "allocated by PyTorch."
)
MIN_TICK_S = 0.002


class Stepper(Protocol):
    def step_s(self, adm: Admission) -> float: ...

    def grow(self, adm: Admission, step: int) -> bool: ...


class DecodeRun:
    """The decode of one admitted request whose first token is due at ``first_token_at``."""

    def __init__(
        self,
        model: Stepper,
        adm: Admission,
        first_token_at: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._model = model
        self._adm = adm
        self._at = first_token_at
        self._clock = clock
        self._sleep = sleep
        self.step = 0

    def wait_step(self, step: int) -> bool:
        """Block until decode ``step`` is done; False when the KV ran out on the way (OOM)."""
        while self.step < step:
            left = step - self.step
            per_step = self._model.step_s(self._adm)
            ticks = left if per_step <= 0 else max(1, min(left, int(MIN_TICK_S / per_step)))
            self._at += ticks * per_step
            self._sleep_until(self._at)
            self.step += ticks
            if not self._model.grow(self._adm, self.step):
                return False
        self._sleep_until(self._at)
        return True

    def _sleep_until(self, deadline: float) -> None:
        delay = deadline - self._clock()
        if delay > 0:
            self._sleep(delay)


def answer(
    wire: Wire,
    req: GenerateRequest,
    adm: Admission,
    model: MockModel,
    request_headers: Message,
    generated: Callable[[], None] = lambda: None,
) -> None:
    """Answer one admitted generate request as its drawn fate says: an error, or the answer
    (whole or streamed) at the pace the settings give; ``request_headers`` are its headers.

    ``generated`` is called once the last token is generated, before the answer's last bytes
    are written: as in an engine, the sequence leaves the batch then, not once the client has
    read it — else a client's next request, sent the moment it has the answer, could arrive
    while this one still counted in flight (a wave of B seen as B + 1 by a loaded machine)."""
    settings = wire.settings
    if adm.outcome == "oom":
        wire.send_json(500, error_body(oom_message(settings), "InternalServerError", 500))
        return
    if adm.outcome == "overload":
        message = f"The server is overloaded; retry after {settings.retry_after_s:g} s."
        headers = {"Retry-After": f"{settings.retry_after_s:g}"}
        wire.send_json(429, error_body(message, "TooManyRequestsError", 429), headers)
        return
    if adm.outcome == "fail" and settings.error_style == "lmdeploy":
        _engine_error(wire, req, "ResponseType.INTERNAL_ENGINE_ERROR")
        return
    if adm.outcome == "fail":
        body = error_body("Internal server error (injected fault).", "InternalServerError", 500)
        wire.send_json(500, body)
        return
    if req.engine_error:
        _engine_error(wire, req, req.engine_error)
        return
    if adm.echo_headers:  # a careless proxy: the request's headers, key included, echoed
        seen = "; ".join(f"{name}: {value}" for name, value in request_headers.items())
        body = error_body(
            f"Internal error handling a request with headers: {seen}",
            "InternalServerError",
            500,
        )
        wire.send_json(500, body)
        return
    if settings.keepalive_only:
        wire.keepalive_only()
        return
    prefill = model.prefix.prefill(req.prompts, req.prompt_tokens, look_up=req.cache_prompt)
    if prefill.seconds:  # the prompt tokens the prefix cache did not hold are read first
        adm = dataclasses.replace(adm, ttft_s=adm.ttft_s + prefill.seconds)
    gens = generations(model, req, adm)  # before its slot: their lengths, for the KV plans
    run: DecodeRun | None = None
    if settings.tracks_tokens:
        plans = [
            SeqPlan.of(p, n, g.completion_tokens, share=settings.prefix_cache)
            for p, n, g in zip(req.prompts, req.prompt_tokens, gens, strict=True)
        ]
        if not model.start(adm, plans):
            wire.send_json(500, error_body(oom_message(settings), "InternalServerError", 500))
            return
        run = DecodeRun(model, adm, time.monotonic() + adm.ttft_s, sleep=wire.sleep)
    else:
        model.acquire(adm)
    if model.batch_varied(adm) is not None:  # its words as the batch it joined makes them
        gens = generations(model, req, adm)
    prefix = "chatcmpl-" if req.kind == "chat" else "cmpl-"
    rid, created, start = prefix + uuid.uuid4().hex, int(time.time()), time.monotonic()
    if adm.malformed is not None:
        head = bodies.envelope(req, rid, created, settings, chunk=req.stream)
        bad = malformed_body(adm.malformed, req, head, chunk=req.stream)
        if req.stream:
            wire.send_sse([f"data: {json.dumps(bad)}\n\n".encode(), b"data: [DONE]\n\n"])
        else:
            wire.send_json(200, bad)
        return
    if not req.stream:
        steps = max(g.completion_tokens for g in gens)
        if adm.outcome == "reset":
            wire.wait_until(start + adm.ttft_s)
            wire.reset()
            return
        if run is None:
            wire.wait_until(start + adm.ttft_s + steps * adm.per_token_s)
        elif not run.wait_step(steps):
            wire.send_json(500, error_body(oom_message(settings), "InternalServerError", 500))
            return
        answer = bodies.full_response(req, gens, rid, created, settings)
        if settings.metrics_style == "llamacpp":  # llama.cpp says what its slot cache held
            answer["timings"] = prefill.timings(sum(g.completion_tokens for g in gens))
        generated()
        wire.send_json(200, answer, drip=True)
        return
    timings = None
    if settings.metrics_style == "llamacpp":
        timings = prefill.timings(sum(g.completion_tokens for g in gens))
    events = stream_events(req, gens, rid, created, settings, timings)
    wire.sse_headers()
    for n, event in enumerate(events):
        if adm.outcome == "reset" and n == len(events) // 2:
            wire.reset()
            return
        if run is None:
            wire.wait_until(start + adm.ttft_s + event.step * adm.per_token_s)
        elif not run.wait_step(event.step):  # vLLM ends a stream that fails with an error event
            error = {"error": error_body(oom_message(settings), "InternalServerError", 500)}
            wire.write_chunk(f"data: {json.dumps(error)}\n\n".encode())
            wire.write_chunk(b"data: [DONE]\n\n")
            break
        if n == len(events) - 1:
            generated()  # the last event ([DONE]) is about to go out
        wire.write_chunk(event.encode())
    wire.write(b"0\r\n\r\n")


def generations(model: MockModel, req: GenerateRequest, adm: Admission) -> list[Generation]:
    """The answer to each prompt of ``req``; seated, as the sequences beside it vary them."""
    settings = model.settings
    return [
        model.generate(
            prompt,
            req.cap(tokens, settings.max_model_len),
            adm,
            min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos,
        )
        for prompt, tokens in zip(req.prompts, req.prompt_tokens, strict=True)
    ]


def _engine_error(wire: Wire, req: GenerateRequest, status: str) -> None:
    """LMDeploy's answer to a request its engine failed (v0.9.2 – v0.15): HTTP 200, the reason
    as the text, ``finish_reason: "error"`` — whole or streamed, at once."""
    settings = wire.settings
    failed = Generation(f"internal error happened, status code {status}", "error", 1)
    gens = [failed for _ in req.prompts]
    rid, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())
    if not req.stream:
        wire.send_json(200, bodies.full_response(req, gens, rid, created, settings))
        return
    wire.sse_headers()
    for event in stream_events(req, gens, rid, created, settings):
        wire.write_chunk(event.encode())
    wire.write(b"0\r\n\r\n")


HUGE_COUNT = 10**330


def malformed_body(shape: str, req: GenerateRequest, envelope: Json, *, chunk: bool) -> Json:
    """The reply (or, streaming, the one chunk) of ``shape``."""
    holder = "delta" if chunk else "message"
    if shape == "choices-null":
        return envelope | {"choices": [None]}
    if shape == "choices-number":
        return envelope | {"choices": [1]}
    if shape == "no-choices":
        return dict(envelope)
    choice: Json = {"index": 0, "finish_reason": "stop"}
    if shape in ("huge-usage", "negative-usage"):
        good = {"role": "assistant", "content": "An answer."}
        choice |= {holder: good} if req.kind == "chat" else {"text": "An answer."}
        counts = (7, HUGE_COUNT) if shape == "huge-usage" else (-7, -8768)
        usage = {"prompt_tokens": counts[0], "completion_tokens": counts[1], "total_tokens": 0}
        return envelope | {"choices": [choice], "usage": usage}
    if shape == "message-string":
        wrong: object = "a plain string"
        choice |= {holder: wrong} if req.kind == "chat" else {"text": ["a", "list"]}
    else:  # content-number
        choice |= (
            {holder: {"role": "assistant", "content": 42}} if req.kind == "chat" else {"text": 42}
        )
    return envelope | {"choices": [choice]}


def oom_message(settings: MockSettings) -> str:
    gib = 1024.0
    return OOM_MESSAGE.format(
        gib=settings.vram_per_request_mib / gib,
        total=settings.vram_total_mib / gib,
        free=settings.vram_per_request_mib / gib / 4,
        used=settings.vram_base_mib / gib,
    )
