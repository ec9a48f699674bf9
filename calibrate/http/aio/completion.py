"""A whole answer of the asyncio transport read into one ``Completion`` (streamed or not)."""

from __future__ import annotations

from calibrate.http.aio.wire import Answer
from calibrate.http.models import Completion
from calibrate.http.request_times import RequestTimes
from calibrate.http.responses import parse_completion
from calibrate.http.stream import read_events, timed_events
from calibrate.http.transport import parse_json


def completion_of(answer: Answer, start: float, *, stream: bool, chat: bool) -> Completion:
    """The answer's completion; times are the client clock's readings as its bytes arrived
    (a whole answer's ``times`` stamped from ``start``; a stream's are the caller's to stamp).

    A streamed request answered with JSON (a server that cannot stream) is read as a plain
    completion, without TTFT, as over urllib3."""
    if stream and answer.event_stream:
        end = answer.finished_at
        return read_events(timed_events(answer.blocks, end), start, lambda: end, chat=chat)
    payload = parse_json(answer.body())
    # stamped here, as the client's ``_stamped`` would: one Completion made, not two
    times = RequestTimes.of(start, answer.finished_at)
    return parse_completion(payload, answer.finished_at - start, None, chat=chat, times=times)
