"""The OpenAI response formats, parsed: a JSON completion, or the events of an SSE stream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from calibrate.error_kinds import error_from_body, invalid
from calibrate.errors import RequestError
from calibrate.records import Choice, Completion, Usage


def sse_events(lines: Iterator[bytes]) -> Iterator[str]:
    """The ``data:`` payloads of a server-sent event stream (multi-line data joined)."""
    buffer: list[str] = []
    for raw in lines:
        line = raw.decode("utf-8", errors="replace")
        if not line:
            if buffer:
                yield "\n".join(buffer)
                buffer = []
            continue
        if line.startswith("data:"):
            buffer.append(line[5:].lstrip(" "))
    if buffer:
        yield "\n".join(buffer)


def choice_text(choice: dict[str, Any], *, chat: bool, delta: bool) -> str:
    if chat:
        holder = choice.get("delta" if delta else "message")
        if isinstance(holder, dict):
            content = holder.get("content")
            return content if isinstance(content, str) else ""
        return ""
    text = choice.get("text")
    return text if isinstance(text, str) else ""


def parse_completion(payload: dict[str, Any], elapsed_s: float, ttft_s: float | None) -> Completion:
    raw_choices = payload.get("choices")
    if "error" in payload and not raw_choices:
        raise RequestError(error_from_body(500, payload))
    if not isinstance(raw_choices, list) or not raw_choices:
        raise invalid("the response has no 'choices'")
    chat = str(payload.get("object", "")).startswith("chat") or "message" in raw_choices[0]
    choices: list[Choice] = []
    for position, choice in enumerate(raw_choices):
        if not isinstance(choice, dict):
            raise invalid("a choice is not a JSON object")
        index = choice.get("index", position)
        choices.append(
            Choice(
                index=index if isinstance(index, int) else position,
                text=choice_text(choice, chat=chat, delta=False),
                finish_reason=choice.get("finish_reason"),
            )
        )
    choices.sort(key=lambda c: c.index)
    model = payload.get("model")
    fingerprint = payload.get("system_fingerprint")
    return Completion(
        choices=tuple(choices),
        usage=Usage.from_json(payload.get("usage")),
        served_model=model if isinstance(model, str) else None,
        system_fingerprint=fingerprint if isinstance(fingerprint, str) else None,
        elapsed_s=elapsed_s,
        ttft_s=ttft_s,
    )
