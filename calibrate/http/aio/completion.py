"""A whole answer of the asyncio transport read into one ``Completion`` (streamed or not)."""

from __future__ import annotations

from collections.abc import Iterator

from calibrate.http.aio.wire import Answer
from calibrate.http.models import Completion
from calibrate.http.responses import parse_completion
from calibrate.http.stream import read_stream
from calibrate.http.transport import parse_json


class TimedLines:
    """A streamed answer's lines, and a clock that reads when the line being parsed arrived."""

    def __init__(self, answer: Answer) -> None:
        self._lines = answer.lines
        self._end = answer.finished_at
        self.now = self._lines[0][1] if self._lines else self._end

    def __iter__(self) -> Iterator[bytes]:
        for line, arrived in self._lines:
            self.now = arrived
            yield line
        self.now = self._end

    def clock(self) -> float:
        return self.now


def completion_of(answer: Answer, start: float, *, stream: bool, chat: bool) -> Completion:
    """The answer's completion; times are the client clock's readings as its bytes arrived.

    A streamed request answered with JSON (a server that cannot stream) is read as a plain
    completion, without TTFT, as over urllib3."""
    if stream and answer.event_stream:
        timed = TimedLines(answer)
        return read_stream(iter(timed), start, timed.clock, chat=chat)
    payload = parse_json(answer.body())
    return parse_completion(payload, answer.finished_at - start, None, chat=chat)
