"""A streamed answer (SSE) read into one ``Completion``: its choices, usage, TTFT and gaps."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

from calibrate.http.error_kinds import invalid
from calibrate.http.models import Choice, Completion, Usage
from calibrate.http.responses import parse_chunk, sse_events
from calibrate.http.stream_timing import stream_timing


def read_stream(
    lines: Iterator[bytes], start: float, clock: Callable[[], float], *, chat: bool
) -> Completion:
    """The events of ``lines`` up to ``[DONE]`` (or their end); ``clock`` stamps each text chunk."""
    texts: dict[int, list[str]] = {}
    finish: dict[int, str | None] = {}
    usage: Usage | None = None
    model: str | None = None
    fingerprint: str | None = None
    ttft: float | None = None
    arrivals: list[float] = []  # when each chunk with text arrived (the gaps: ITL)
    for event in sse_events(lines):
        if event == "[DONE]":
            break
        try:
            payload = json.loads(event)
        except (ValueError, RecursionError) as exc:
            raise invalid(f"a stream chunk is not JSON: {event[:200]!r}") from exc
        chunk = parse_chunk(payload, chat=chat)
        model = chunk.served_model or model
        fingerprint = chunk.system_fingerprint or fingerprint
        usage = chunk.usage or usage
        carried = False
        for index, text, finish_reason in chunk.choices:
            pieces = texts.setdefault(index, [])
            if text:
                carried = True
                pieces.append(text)
            if finish_reason is not None:
                finish[index] = finish_reason
        if carried:
            arrivals.append(clock() - start)
            if ttft is None:
                ttft = arrivals[0]
    if not texts:
        raise invalid("the stream carried no choices")
    choices = tuple(
        Choice(index=i, text="".join(texts[i]), finish_reason=finish.get(i)) for i in sorted(texts)
    )
    counted = usage.completion_tokens if usage else None
    timing = stream_timing(arrivals, counted) if len(texts) == 1 else None
    return Completion(choices, usage, model, fingerprint, clock() - start, ttft, timing)
