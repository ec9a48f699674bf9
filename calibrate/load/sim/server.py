"""The mock server without HTTP, on a virtual clock: a ``Transport`` for the engine's tests.

The behaviour is the mock's own model (``calibrate.mock``): admission draws each request's fate
(OOM past ``oom_at`` in flight, overload, a failed or reset request, a truncated or slow one,
timing jitter), requests wait first come first served for one of ``slots``, KV is claimed and
grown against its capacity (OOM, or preemption's slowdown, or a queue), the prefix cache
shortens the first token, and the text is the mock's deterministic answer. Its answers are the
bodies the mock would send, read by the client's own parsers, a streamed one stamped chunk by
chunk at the time each is due; its errors are the kinds the client maps the mock's statuses to.
What is about HTTP alone (dripped bytes, keep-alive comments, huge bodies) is the real mock's.

Time is the clock's (``load.sim.clock.VirtualClock``): a request that waits for a slot or
decodes 200 tokens waits on timers that the loop jumps to. ``outage(seconds)`` refuses
connections for a while, as a server that went away; ``restart(settings)`` is a new server
with other settings (a tune candidate, another level's speed).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import math
import uuid
from collections.abc import Sequence
from typing import Any

from calibrate.errors import RequestError
from calibrate.http.error_kinds import connection_error, http_error, request_error
from calibrate.http.models import Completion, ContextLimit
from calibrate.http.request_times import RequestTimes
from calibrate.http.responses import parse_completion
from calibrate.http.server_context import MAX_MODEL_LEN_HINT
from calibrate.http.stream import read_events, timed_events
from calibrate.load.answers import wants_context
from calibrate.load.request import Request
from calibrate.load.transport import Clock, Exchange
from calibrate.mock.admission import Admission
from calibrate.mock.answer import Generation
from calibrate.mock.kv import SeqPlan
from calibrate.mock.model import MockModel
from calibrate.mock.openai import bodies
from calibrate.mock.openai.request import (
    GenerateRequest,
    RequestRejected,
    error_body,
    parse_request,
)
from calibrate.mock.openai.stream import stream_events
from calibrate.mock.reply import MIN_TICK_S, generations, malformed_body, oom_message
from calibrate.mock.settings import MockSettings

URL = "http://simulated/v1"
KINDS = {"/chat/completions": "chat", "/completions": "completion"}
Waiting = tuple[Admission, tuple[int, int], Sequence[SeqPlan], "asyncio.Future[None]"]


class SimServer:
    """One simulated server; ``send`` is the engine's ``Transport.send``."""

    def __init__(self, settings: MockSettings, clock: Clock, *, timeout_s: float = 600.0) -> None:
        self.clock = clock
        self._timeout_s = timeout_s
        self._down_until = -math.inf
        self.restart(settings)

    @property
    def timeout_s(self) -> float:
        return self._timeout_s

    def restart(self, settings: MockSettings) -> None:
        """A new server with ``settings``: nothing in flight, nothing cached."""
        self.settings = settings
        self.model = MockModel(settings, self.clock.now)
        self.in_flight_seen: list[int] = []  # at each request's arrival, itself included
        self._waiting: collections.deque[Waiting] = collections.deque()

    def outage(self, seconds: float) -> None:
        """Refuse every connection for ``seconds`` from now."""
        self._down_until = self.clock.now() + seconds

    async def send(self, request: Request) -> Exchange:
        start = self.clock.now()
        try:
            work = self._serve(request.path, request.body, start)
            completion = await asyncio.wait_for(work, self._timeout_s)
        except TimeoutError:
            failure = request_error(
                "timeout", f"no answer from {URL} within {self._timeout_s:g} s", None
            )
            return Exchange(None, failure)
        except RequestError as exc:
            return Exchange(None, exc)
        end = start + completion.elapsed_s
        completion = dataclasses.replace(
            completion, times=RequestTimes.of(start, end, completion.ttft_s)
        )
        context = None
        if wants_context(request, completion):
            s = self.settings
            context = ContextLimit(
                s.max_model_len, "context (max_model_len)", MAX_MODEL_LEN_HINT, "GET /v1/models"
            )
        return Exchange(completion, None, context)

    async def _serve(self, path: str, body: dict[str, Any], start: float) -> Completion:
        if self.clock.now() < self._down_until:
            refused = ConnectionRefusedError("connection refused")
            raise request_error("connect", f"no server at {URL} (connection refused)", refused)
        settings = self.settings
        try:
            req = parse_request(KINDS.get(path, "chat"), body, settings)  # type: ignore[arg-type]
        except RequestRejected as exc:
            raise _status(exc.status, exc.body) from exc
        model = self.model
        adm = model.admit(len(req.prompts))
        self.in_flight_seen.append(adm.in_flight)
        try:
            return await self._answer(req, adm, start)
        finally:
            model.release(adm)
            self._seat_waiting()

    async def _answer(self, req: GenerateRequest, adm: Admission, start: float) -> Completion:
        settings, model = self.settings, self.model
        if adm.outcome == "oom":
            raise _oom(settings)
        if adm.outcome == "overload":
            message = f"The server is overloaded; retry after {settings.retry_after_s:g} s."
            body = error_body(message, "TooManyRequestsError", 429)
            raise _status(429, body, {"Retry-After": f"{settings.retry_after_s:g}"})
        if adm.outcome == "fail" and settings.error_style == "lmdeploy":
            status = "ResponseType.INTERNAL_ENGINE_ERROR"
            failed = Generation(f"internal error happened, status code {status}", "error", 1)
            return self._whole(req, [failed for _ in req.prompts], 0.0, start)
        if adm.outcome == "fail":
            body = error_body("Internal server error (injected fault).", "InternalServerError", 500)
            raise _status(500, body)
        prefill = model.prefix.prefill(req.prompts, req.prompt_tokens, look_up=req.cache_prompt)
        ttft = adm.ttft_s + prefill.seconds
        gens = generations(model, req, adm)  # before its slot: their lengths, for the KV plans
        plans: Sequence[SeqPlan] = ()
        if settings.tracks_tokens:
            plans = [
                SeqPlan.of(p, n, g.completion_tokens, share=settings.prefix_cache)
                for p, n, g in zip(req.prompts, req.prompt_tokens, gens, strict=True)
            ]
        await self._seated(adm, plans)
        if model.batch_varied(adm) is not None:  # its words as the batch it joined makes them
            gens = generations(model, req, adm)
        if settings.tracks_tokens and not model.claim(adm, plans):
            raise _oom(settings)
        begin = self.clock.now()
        if adm.malformed is not None:
            return self._malformed(req, adm.malformed, start)
        steps = max(g.completion_tokens for g in gens)
        if adm.outcome == "reset":
            await self._until(begin + ttft)
            raise connection_error(URL, ConnectionResetError("the server reset the connection"))
        due = await self._decode(adm, begin + ttft, steps)  # when each step is done
        if due is None:
            raise _oom(settings)
        if not req.stream:
            return self._whole(req, gens, due[-1] - start, start)
        events = stream_events(req, gens, _id(req), 0, settings)
        blocks = [(event.encode(), due[min(event.step, steps)]) for event in events]
        end = blocks[-1][1] if blocks else due[-1]
        return read_events(timed_events(blocks, end), start, lambda: end, chat=req.kind == "chat")

    async def _decode(self, adm: Admission, first_at: float, steps: int) -> list[float] | None:
        """When each decode step (0: the first token) is done; None: the KV ran out (OOM).
        Fixed timing is arithmetic; a token ledger decodes tick by tick, as the mock does."""
        if not self.settings.tracks_tokens:
            due = [first_at + step * adm.per_token_s for step in range(steps + 1)]
            await self._until(due[-1])
            return due
        due, at, step = [first_at], first_at, 0
        await self._until(at)
        while step < steps:
            per_step = self.model.step_s(adm)
            left = steps - step
            ticks = left if per_step <= 0 else max(1, min(left, int(MIN_TICK_S / per_step)))
            at += ticks * per_step
            await self._until(at)
            step += ticks
            due += [at] * ticks
            if not self.model.grow(adm, step):
                return None
        return due

    def _whole(
        self, req: GenerateRequest, gens: list[Generation], elapsed_s: float, start: float
    ) -> Completion:
        body = bodies.full_response(req, gens, _id(req), 0, self.settings)
        return parse_completion(body, elapsed_s, None, chat=req.kind == "chat")

    def _malformed(self, req: GenerateRequest, shape: str, start: float) -> Completion:
        head = bodies.envelope(req, _id(req), 0, self.settings, chunk=req.stream)
        bad = malformed_body(shape, req, head, chunk=req.stream)
        elapsed = self.clock.now() - start
        if not req.stream:
            return parse_completion(bad, elapsed, None, chat=req.kind == "chat")
        blocks = [(f"data: {json.dumps(bad)}\n\n".encode(), self.clock.now())]
        end = self.clock.now()
        return read_events(timed_events(blocks, end), start, lambda: end, chat=req.kind == "chat")

    async def _seated(self, adm: Admission, plans: Sequence[SeqPlan]) -> None:
        """Wait, first come first served, for a decode slot (and, queued, the KV's room)."""
        entry = self.model.queue_up(adm)
        if self.model.seat(adm, entry, plans):
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((adm, entry, plans, turn))
        try:
            await turn
        except BaseException:  # the deadline passed while it waited: out of the queue
            if not turn.done() or turn.cancelled():
                self.model.leave(entry)
                self._waiting = collections.deque(w for w in self._waiting if w[3] is not turn)
            raise

    def _seat_waiting(self) -> None:
        while self._waiting:
            adm, entry, plans, turn = self._waiting[0]
            if not self.model.seat(adm, entry, plans):
                return
            self._waiting.popleft()
            turn.set_result(None)

    async def _until(self, at: float) -> None:
        delay = at - self.clock.now()
        if delay > 0:
            await asyncio.sleep(delay)


def _id(req: GenerateRequest) -> str:
    return ("chatcmpl-" if req.kind == "chat" else "cmpl-") + uuid.uuid4().hex


def _status(
    status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> RequestError:
    """The error the client would raise for this status and body (SPEC §5.5)."""
    return RequestError(http_error(status, json.dumps(body), headers or {}))


def _oom(settings: MockSettings) -> RequestError:
    return _status(500, error_body(oom_message(settings), "InternalServerError", 500))
