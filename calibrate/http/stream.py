"""A streamed answer (SSE) read into one ``Completion``: its choices, usage, TTFT and gaps.

Its events come from the timed blocks the asyncio transport kept (``timed_events``): the
``data:`` lines of an event joined by ``\\n`` (the space after ``data:`` dropped), an event ended
by an empty line or by the stream's end; other lines (comments ``:``, ``event:``, ``id:``) are
skipped, but for llama.cpp's ``error: {…}``, read as ``{"error": {…}}``: the httplib llama-server
(ggml-org/llama.cpp tools/server/server.cpp, 2025) sends a streamed request's error so, after its
200 (``server_sent_event(sink, "error", error_data)``), then ``data: [DONE]``; newer builds answer
a first error with its HTTP status, a later one as ``data: {"error": …}``. Bytes that are not
UTF-8 become U+FFFD. A line ends at ``\\n``; one ``\\r`` before it is dropped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from calibrate import json_text
from calibrate.http.error_kinds import invalid
from calibrate.http.models import Choice, Completion, Usage
from calibrate.http.responses import parse_chunk, plain_piece
from calibrate.http.stream_timing import stream_timing

# json.loads's own scanner, in C: the (value, end) of the JSON value at an index (typeshed
# does not name it; the json module has called it so since Python 2.6)
_Scan = Callable[[str, int], tuple[Any, int]]
_scan: _Scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _json_of(event: str) -> Any:
    """The JSON value of one event, or ``invalid_response`` saying it is none."""
    try:
        return json_text.loads(event)
    except ValueError as exc:
        raise invalid(f"a stream chunk is not JSON: {event[:200]!r}") from exc


def timed_events(blocks: Iterable[tuple[bytes, float]], end: float) -> Iterator[tuple[str, float]]:
    """The payloads of a stream received as ``blocks`` — runs of whole lines, each ending in
    ``\\n``, with the time its bytes arrived — each with the arrival of the line that ended it
    (an event cut by the stream's end: ``end``, when the answer was whole)."""
    buffer: list[str] = []
    for block, arrived in blocks:
        text = block.decode("utf-8", "replace")
        # The common block, one whole event: "data: {…}\n\n" (the data line its only line).
        if (
            not buffer
            and text.startswith("data: {")
            and text.endswith("}\n\n")
            and text.find("\n") == len(text) - 2
        ):
            yield text[6:-2], arrived
            continue
        lines = text.split("\n")
        lines.pop()  # after the block's last line end: nothing
        for line in lines:
            if line.endswith("\r"):
                line = line[:-1]
            if not line:
                if buffer:
                    yield "\n".join(buffer), arrived
                    buffer = []
            elif line.startswith("data:"):
                buffer.append(line[5:].lstrip(" "))
            elif line.startswith("error:"):  # llama.cpp's own field: its error, not data
                buffer.append('{"error": ' + line[6:].lstrip(" ") + "}")
    if buffer:
        yield "\n".join(buffer), end


def read_events(
    events: Iterator[tuple[str, float]],
    start: float,
    end: Callable[[], float],
    *,
    chat: bool,
) -> Completion:
    """The answer of ``events`` — payloads, each with the clock reading when it arrived — up to
    ``[DONE]`` (the answer's elapsed time: when that arrived) or their end (``end()``)."""
    texts: dict[int, list[str]] = {}
    first: list[str] | None = None  # choice 0's pieces, for the common chunk's shortcut
    finish: dict[int, str | None] = {}
    usage: Usage | None = None
    model: str | None = None
    fingerprint: str | None = None
    arrivals: list[float] = []  # when each chunk with text arrived (the gaps: ITL)
    done_at: float | None = None
    for event, arrived in events:
        if event == "[DONE]":
            done_at = arrived
            break
        try:  # json.loads without its Python layers: the value must be the whole event
            payload, stop = _scan(event, 0)
        except (StopIteration, ValueError, RecursionError):
            stop = -1
        if stop != len(event):  # whitespace around it, or no JSON: json.loads says which
            payload = _json_of(event)
        text = plain_piece(payload, chat)
        if text is not None:  # one choice, 0, text only: what parse_chunk would say, sooner
            model = payload.get("model") or model
            fingerprint = payload.get("system_fingerprint") or fingerprint
            if first is None:
                first = texts.setdefault(0, [])
            if text:
                first.append(text)
                arrivals.append(arrived - start)
            continue
        chunk = parse_chunk(payload, chat=chat)
        model = chunk.served_model or model
        fingerprint = chunk.system_fingerprint or fingerprint
        usage = chunk.usage or usage
        carried = False
        for index, piece, finish_reason in chunk.choices:
            pieces = texts.setdefault(index, [])
            if piece:
                carried = True
                pieces.append(piece)
            if finish_reason is not None:
                finish[index] = finish_reason
        if carried:
            arrivals.append(arrived - start)
    if not texts:
        raise invalid("the stream carried no choices")
    choices = tuple(
        Choice(index=i, text="".join(texts[i]), finish_reason=finish.get(i)) for i in sorted(texts)
    )
    counted = usage.completion_tokens if usage else None
    timing = stream_timing(arrivals, counted) if len(texts) == 1 else None
    ttft = arrivals[0] if arrivals else None
    elapsed = (done_at if done_at is not None else end()) - start
    return Completion(choices, usage, model, fingerprint, elapsed, ttft, timing)
