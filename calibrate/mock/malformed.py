"""Replies of a wrong shape, for ``--malformed-rate``: what a broken or hostile server sends.

Each keeps the envelope (id, object, model) and breaks one thing a client must check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # payloads imports the model, which imports SHAPES from here
    from calibrate.mock.payloads import GenerateRequest, Json

SHAPES: tuple[str, ...] = (
    "choices-null",  # "choices": [null]
    "choices-number",  # "choices": [1]
    "message-string",  # the message (chat) or text (completions) is not what it should be
    "content-number",  # "content": 42 / "text": 42
    "no-choices",  # no "choices" at all
    "huge-usage",  # a good answer whose usage.completion_tokens is 10**330 (overflows a float)
    "negative-usage",  # a good answer whose usage counts are negative
)
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
