"""The server-sent events of a streamed answer, each with the decode step it is due at."""

from __future__ import annotations

import json
from dataclasses import dataclass

from calibrate.mock import text
from calibrate.mock.answer import Generation
from calibrate.mock.openai.bodies import envelope, usage
from calibrate.mock.openai.request import GenerateRequest, Json
from calibrate.mock.settings import MockSettings

DONE = "[DONE]"


@dataclass(frozen=True)
class StreamEvent:
    """One ``data:`` line, due at TTFT + ``step`` × per-token time."""

    step: int
    data: str

    def encode(self) -> bytes:
        """The SSE frame."""
        return f"data: {self.data}\n\n".encode()

    @classmethod
    def of(cls, step: int, body: Json, settings: MockSettings) -> StreamEvent:
        # A lone surrogate cannot be UTF-8: it travels as the JSON escape "\ud800".
        return cls(step, json.dumps(body, ensure_ascii=settings.lone_surrogate))


def _choice(req: GenerateRequest, index: int, piece: str | None, finish: str | None) -> Json:
    choice: Json = {"index": index}
    if req.kind == "chat":
        choice["delta"] = {} if piece is None else {"content": piece}
    else:
        choice["text"] = piece or ""
    choice["logprobs"] = None
    choice["finish_reason"] = finish
    if finish is not None:
        choice["stop_reason"] = None
    return choice


def _pieces(gen: Generation) -> list[str]:
    """One piece per token; what follows the last token (padding, a surrogate) rides on it."""
    pieces = text.pieces(gen.text)
    n = gen.completion_tokens
    if len(pieces) > n > 0:
        pieces = [*pieces[: n - 1], "".join(pieces[n - 1 :])]
    return pieces


def stream_events(
    req: GenerateRequest,
    gens: list[Generation],
    rid: str,
    created: int,
    settings: MockSettings,
    timings: Json | None = None,
) -> list[StreamEvent]:
    """Every event of the stream in order: role, one token per step, finish, usage, [DONE];
    ``timings`` (llama.cpp's) ride on the last chunk, as llama.cpp sends them."""
    head = envelope(req, rid, created, settings, chunk=True)
    events: list[tuple[int, Json]] = []
    if req.kind == "chat":
        role: Json = {"index": 0, "delta": {"role": "assistant", "content": ""}}
        events.append((0, head | {"choices": [role | {"logprobs": None, "finish_reason": None}]}))
    tokens = [_pieces(g) for g in gens]
    # The whitespace variant's trailing " \n" is not a token: it rides on the last piece.
    last_step = max(g.completion_tokens for g in gens)
    for step in range(last_step):
        for index, pieces in enumerate(tokens):
            if step < len(pieces):
                events.append((step, head | {"choices": [_choice(req, index, pieces[step], None)]}))
    with_usage = req.include_usage and not settings.no_usage
    last_index = max(range(len(gens)), key=lambda i: (gens[i].completion_tokens, i))
    for index, gen in enumerate(gens):
        finish = head | {"choices": [_choice(req, index, None, gen.finish_reason)]}
        if with_usage and settings.usage_in_last_chunk and index == last_index:
            finish["usage"] = usage(req, gens)
        events.append((gen.completion_tokens, finish))
    if with_usage and not settings.usage_in_last_chunk:
        events.append((last_step, head | {"choices": [], "usage": usage(req, gens)}))
    events.sort(key=lambda e: e[0])  # stable: keeps choice order within a step
    if timings is not None:
        events[-1] = (events[-1][0], events[-1][1] | {"timings": timings})
    out = [StreamEvent.of(step, body, settings) for step, body in events]
    if not settings.no_done:
        out.append(StreamEvent(last_step, DONE))
    return out
