"""A streamed answer's shortcuts (issue 25) say exactly what the full, checked path says.

``plain_piece`` (the common chunk's text) against ``parse_chunk``; the asyncio wire's blocks and
``timed_events`` against the reader they replaced (a line at a time, ``TimedLines``, every chunk
through ``parse_chunk`` and ``json.loads``), copied here as it was. Same Completion (texts, usage, names, TTFT, gaps, elapsed) or
the same error with the same message, over hand-picked shapes and a seeded fuzz of 2,000 streams.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from calibrate.errors import RequestError
from calibrate.http.aio.completion import completion_of
from calibrate.http.aio.wire import Answer
from calibrate.http.error_kinds import invalid
from calibrate.http.models import Choice, Completion, Usage
from calibrate.http.responses import Delta, parse_chunk, plain_piece
from calibrate.http.stream_timing import stream_timing

DONE_LINE = b"data: [DONE]"
START = -0.5  # the request's start on the fake clock (reads arrive at 0, 1, 2, …)

# -- the reader as it was before the shortcuts (calibrate 2026-12-01), kept as the oracle ------


def _old_wire_lines(reads: list[bytes]) -> tuple[list[tuple[bytes, float]], float]:
    """The lines the old ``Answer`` kept of a body read as ``reads`` (read k at time k), and
    when it finished (at [DONE]'s read, or the last one)."""
    lines: list[tuple[bytes, float]] = []
    pending, now = b"", -1.0
    for now, piece in enumerate(reads):  # now: the finish time below
        piece = pending + piece
        split = piece.split(b"\n")
        pending = split.pop()
        done = False
        for line in split:
            line = line[:-1] if line.endswith(b"\r") else line
            lines.append((line, float(now)))
            done = done or line == DONE_LINE
        if done:
            break
    if pending:
        lines.append((pending.rstrip(b"\r"), float(now)))
    return lines, float(now)


def _old_sse_events(lines: Iterator[bytes]) -> Iterator[str]:
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


def _old_read_stream(
    lines: Iterator[bytes], start: float, clock: Callable[[], float], *, chat: bool
) -> Completion:
    texts: dict[int, list[str]] = {}
    finish: dict[int, str | None] = {}
    usage: Usage | None = None
    model: str | None = None
    fingerprint: str | None = None
    ttft: float | None = None
    arrivals: list[float] = []
    for event in _old_sse_events(lines):
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


class _OldTimedLines:
    def __init__(self, lines: list[tuple[bytes, float]], end: float) -> None:
        self._lines, self._end = lines, end
        self.now = lines[0][1] if lines else end

    def __iter__(self) -> Iterator[bytes]:
        for line, arrived in self._lines:
            self.now = arrived
            yield line
        self.now = self._end

    def clock(self) -> float:
        return self.now


# -- running both ---------------------------------------------------------------------------


def _outcome(read: Callable[[], Completion]) -> tuple[str, Any]:
    try:
        return "ok", read()
    except RequestError as exc:
        return "error", (exc.info, str(exc))


def _fed(reads: list[bytes]) -> Answer:
    """An answer whose body came as ``reads`` (read k at time k), as whole HTTP chunks each."""
    now = [-1.0]
    answer = Answer(max_bytes=1 << 24, lines=True, clock=lambda: now[0])
    answer.feed(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
    answer.feed(b"Transfer-Encoding: chunked\r\n\r\n")
    for k, piece in enumerate(reads):
        now[0] = float(k)
        last = k == len(reads) - 1
        answer.feed(b"%x\r\n%s\r\n%s" % (len(piece), piece, b"0\r\n\r\n" if last else b""))
    if not reads:
        answer.feed(b"0\r\n\r\n")
    return answer


def _both_ways(reads: list[bytes], chat: bool) -> None:
    """The asyncio transport's reader says what the old reader says of this body."""
    old_lines, end = _old_wire_lines(reads)
    timed = _OldTimedLines(old_lines, end)
    expected = _outcome(lambda: _old_read_stream(iter(timed), START, timed.clock, chat=chat))
    answer = _fed(reads)
    assert answer.lines == old_lines
    got = _outcome(lambda: completion_of(answer, START, stream=True, chat=chat))
    assert got == expected


# -- plain_piece against parse_chunk ---------------------------------------------------------


def _chat_chunk(content: object, **over: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"content": content}, "logprobs": None, "finish_reason": None}
    chunk = {"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
    return {**chunk, "usage": None, **over}


COMMON = [
    _chat_chunk("tok5 "),
    _chat_chunk("tok0 ", choices=[{"index": 0, "delta": {"role": "assistant", "content": "a"}}]),
    _chat_chunk(None),
    _chat_chunk(""),
    _chat_chunk("héllo ✓"),
    _chat_chunk("a\ud800b"),
    _chat_chunk("x", model=None, system_fingerprint="fp_1"),
    {"choices": [{"delta": {"content": "no index"}}]},
    {"choices": [{"index": 0, "delta": {}}]},
]
OTHER = [
    _chat_chunk("x", usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}),
    _chat_chunk("x", model="modèle"),
    _chat_chunk("x", model=7),
    _chat_chunk("x", system_fingerprint="fp\ud800"),
    _chat_chunk("x", error={"message": "boom"}),
    {"choices": [{"index": 0, "finish_reason": "stop"}]},
    {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "length"}]},
    {"choices": [{"index": 1, "delta": {"content": "x"}}]},
    {"choices": [{"index": True, "delta": {"content": "x"}}]},
    {"choices": [{"index": 0.0, "delta": {"content": "x"}}]},
    {"choices": [{"index": 0, "delta": {"content": "x"}}, {"index": 1, "delta": {}}]},
    {"choices": [{"index": 0, "delta": None}]},
    {"choices": [{"index": 0, "delta": {"content": 5}}]},
    {"choices": [{"index": 0, "delta": ["x"]}]},
    {"choices": []},
    {"choices": {"index": 0}},
    {"choices": ["x"]},
    [],
    "[DONE]",
    None,
]


@pytest.mark.parametrize("payload", COMMON)
def test_the_common_chunk_takes_the_shortcut_and_says_what_parse_chunk_says(payload: Any) -> None:
    text = plain_piece(payload, True)
    assert text is not None, "the common shape must not fall back to parse_chunk"
    chunk = parse_chunk(payload, chat=True)
    assert chunk.choices == [Delta(0, text, None)] and chunk.usage is None
    assert (chunk.served_model, chunk.system_fingerprint) == (
        payload.get("model"),
        payload.get("system_fingerprint"),
    )


def test_the_shortcut_reads_a_completions_chunk_and_makes_text_valid_unicode() -> None:
    assert plain_piece({"choices": [{"index": 0, "text": "a\udc00"}]}, False) == "a\ufffd"
    assert plain_piece({"choices": [{"index": 0, "text": "tok1 "}], "usage": None}, False) == (
        "tok1 "
    )
    assert plain_piece({"choices": [{"index": 0, "text": None}]}, False) == ""
    assert plain_piece({"choices": [{"index": 0, "text": "x"}]}, True) is None  # no delta
    assert plain_piece(_chat_chunk("x"), False) == ""  # a chat chunk read as completions
    for other in ({"choices": [{"index": 0, "text": 5}]}, {"choices": [{"text": "x"}] * 2}):
        assert plain_piece(other, False) is None


@pytest.mark.parametrize("payload", OTHER)
def test_any_other_chunk_is_left_to_parse_chunk(payload: Any) -> None:
    assert plain_piece(payload, True) is None


# -- whole streams -------------------------------------------------------------------------


def _sse(*events: object) -> bytes:
    return b"".join(
        b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n"
        for e in events
    )


USAGE = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
REJECTED = [
    (_sse(b"nope"), "a stream chunk is not JSON: 'nope'"),
    (_sse(b'{"a": 1} {"b": 2}'), 'a stream chunk is not JSON: \'{"a": 1} {"b": 2}\''),
    (_sse("\ufeff"), None),
    (b"data: \xef\xbb\xbf{}\n\n", "a stream chunk is not JSON: '\\ufeff{}'"),
    (_sse([]), "a stream chunk is a list, not a JSON object"),
    (
        _sse({"error": {"message": "the engine fell over"}}),
        "error in an HTTP 200 answer (no code given, read as a server error): the engine fell over",
    ),
    (_sse(_chat_chunk(5)), "choices[0].delta.content is an integer, not a string or null"),
    (_sse({"choices": [{"index": -1}]}), "choices[0].index is out of range (negative or huge)"),
    (_sse({"choices": {}}), "the response has 'choices' that is an object, not a list"),
    (_sse(_chat_chunk("x", usage={"completion_tokens": -1})), None),
    (_sse(b"[DONE]"), "the stream carried no choices"),
    (b": keep-alive\n\n", "the stream carried no choices"),
]


@pytest.mark.parametrize(("body", "message"), REJECTED)
def test_each_rejection_keeps_its_message(body: bytes, message: str | None) -> None:
    answer = _fed([body])
    with pytest.raises(RequestError) as caught:
        completion_of(answer, START, stream=True, chat=True)
    if message is not None:
        assert str(caught.value) == message
    _both_ways([body], chat=True)


def test_a_mock_stream_reads_whole_each_text_at_its_read_s_time() -> None:
    chunks = [_chat_chunk(f"tok{k} ") for k in range(5)] + [
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": None}
    ]
    reads = [_sse(c) for c in chunks] + [_sse(USAGE, b"[DONE]")]
    done = completion_of(_fed(reads), START, stream=True, chat=True)
    assert done.choices == (Choice(0, "tok0 tok1 tok2 tok3 tok4 ", "stop"),)
    assert done.usage == Usage(3, 4, 7) and done.served_model == "m"
    assert done.ttft_s == 0.5 and done.elapsed_s == 6.5  # [DONE] came in the seventh read
    assert done.stream is not None and done.stream.chunks == 5
    _both_ways(reads, chat=True)


@pytest.mark.parametrize(
    "body",
    [
        b'data:{"choices":[{"text":"a"}]}\r\n\r\ndata:  {"choices":[{"text":"b"}]}\r\n\r\n',
        b'data: {"choices":\ndata: [{"text":"a"}]}\n\n: comment\nevent: x\nid: 1\n\n',
        b'data: {"choices":[{"text":"a"}]} \n\ndata:\t{"choices":[{"text":"b"}]}\n\n',
        b'data: {"choices":[{"text":"cut at the end, no empty line"}]}',
        b'data: {"choices":[{"text":"one \\ud800"}]}\r\r\n\n' + b'data: {"choices":[{"te',
        b'data: {"choices":[{"text":"\xff\xfe"}]}\n\ndata: [DONE]\n\ndata: garbage\n\n',
    ],
)
def test_odd_streams_read_as_before(body: bytes) -> None:
    _both_ways([body], chat=False)
    _both_ways([body[i : i + 3] for i in range(0, len(body), 3)], chat=False)


# -- the fuzz ------------------------------------------------------------------------------


def _random_chunk(rng: random.Random, chat: bool) -> object:
    odd = ["", None, "héllo", "\ud800", "✓✓", "a\nb", "x" * 40, 7]
    text = rng.choice(odd) if rng.random() < 0.3 else f"tok{rng.randrange(100)} "
    key = "delta" if chat else "text"
    piece: Any = {"content": text} if chat else text
    if chat and rng.random() < 0.1:
        piece = rng.choice([None, [], {}, {"role": "assistant"}])
    choice: dict[str, Any] = {"index": 0, key: piece, "logprobs": None, "finish_reason": None}
    roll = rng.random()
    if roll < 0.05:
        choice["finish_reason"] = rng.choice(["stop", "length", 3])
        if chat and rng.random() < 0.5:
            del choice[key]
    elif roll < 0.1:
        choice["index"] = rng.choice([1, 1, 2, -1, True, "0", 2**40, 0.0])
    elif roll < 0.13:
        del choice["index"]
    choices: Any = [choice]
    roll = rng.random()
    if roll < 0.06:
        choices = [choice, {**choice, "index": 1}]
    elif roll < 0.1:
        choices = rng.choice([[], None, {}, ["x"], [None]])
    chunk: dict[str, Any] = {"id": "c", "model": "m", "choices": choices, "usage": None}
    roll = rng.random()
    if roll < 0.05:
        chunk["usage"] = {"prompt_tokens": 2, "completion_tokens": rng.choice([3, -1, 1.5])}
    elif roll < 0.08:
        chunk["model"] = rng.choice(["modèle", 3, None, "", "m\udfff"])
    elif roll < 0.1:
        chunk["system_fingerprint"] = rng.choice(["fp", "fp\u00e9", 1])
    elif roll < 0.12:
        chunk["error"] = rng.choice([{"message": "overloaded"}, "out of memory", None])
    elif roll < 0.13:
        del chunk["usage"]
    return chunk


def _random_event(rng: random.Random, chat: bool) -> bytes:
    """One event's lines, with the empty line that ends it (sometimes odd)."""
    roll = rng.random()
    if roll < 0.015:
        data = rng.choice(["{oops", "", " ", "[DONE", '{"choices": [] } x', "1"])
    elif roll < 0.04:
        data = "[DONE]"
    else:
        data = json.dumps(_random_chunk(rng, chat), ensure_ascii=rng.random() < 0.7)
    raw = data.encode("utf-8", "surrogatepass")  # a lone surrogate sent raw: bytes not UTF-8
    if rng.random() < 0.03:
        cut = rng.randrange(len(raw) + 1)
        raw = raw[:cut] + rng.choice([b"\xff", b"\xe2\x82", b"\r", b"\xed\xa0\x80"]) + raw[cut:]
    parts = [raw]
    if rng.random() < 0.1 and b"," in raw:  # multi-line data, split after a comma
        cut = raw.index(b",") + 1
        parts = [raw[:cut], raw[cut:]]
    elif rng.random() < 0.03:
        cut = rng.randrange(len(raw) + 1)
        parts = [raw[:cut], raw[cut:]]
    end = rng.choice([b"\n", b"\n", b"\n", b"\r\n"])
    prefix = rng.choice([b"data: ", b"data: ", b"data:", b"data:  "])
    lines = [prefix + p + end for p in parts]
    if rng.random() < 0.1:
        lines.insert(
            rng.randrange(len(lines) + 1), rng.choice([b": ping", b"event: m", b"id: 9"]) + end
        )
    return b"".join(lines) + (end if rng.random() < 0.98 else b"")


def _random_reads(rng: random.Random, body: bytes) -> list[bytes]:
    if rng.random() < 0.5 or not body:
        return [body] if body else []
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randrange(1, 12))))
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


def test_a_fuzz_of_two_thousand_streams_reads_as_before() -> None:
    rng = random.Random(25)
    for _ in range(2000):
        chat = rng.random() < 0.6
        events = [_random_event(rng, chat) for _ in range(rng.randrange(0, 9))]
        if rng.random() < 0.5:
            events.append(b"data: [DONE]\n\n" + (b"data: after\n\n" if rng.random() < 0.2 else b""))
        if rng.random() < 0.5:  # an event per read, as servers write them
            reads = [e for e in events if e]
        else:
            reads = _random_reads(rng, b"".join(events))
        _both_ways(reads, chat)


def test_whole_chunks_and_a_byte_at_a_time_give_the_same_lines() -> None:
    """The wire's shortcut (a whole HTTP chunk in one read, several in one) against its slow
    path: the same lines up to [DONE] (where a stream fed in pieces stops), the same answer."""
    body = _sse(_chat_chunk("a"), _chat_chunk("b"), USAGE, b"[DONE]")
    framed = b"".join(
        b"%x;ext=1\r\n%s\r\n" % (len(body[i : i + 50]), body[i : i + 50])
        for i in range(0, len(body), 50)
    )
    raw = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    raw += b"Transfer-Encoding: chunked\r\n\r\n" + framed + b"0\r\nX-Trailer: 1\r\n\r\n"
    answers = []
    for step in (len(raw), 1, 7):
        answer = Answer(max_bytes=1 << 20, lines=True, clock=lambda: 0.0)
        for i in range(0, len(raw), step):
            answer.feed(raw[i : i + step])
        answers.append(answer)
    whole, *split = answers
    assert whole.done and b"".join(block for block, _ in whole.blocks) == body
    done = completion_of(whole, 0.0, stream=True, chat=True)
    assert done.text == "ab" and done.usage == Usage(3, 4, 7)
    for answer in split:
        assert answer.done and answer.lines == whole.lines[: len(answer.lines)]
        assert DONE_LINE in [line for line, _ in answer.lines]
        assert completion_of(answer, 0.0, stream=True, chat=True) == done


@pytest.mark.parametrize("step", [0, 1])
def test_a_stream_over_the_size_cap_is_refused_whole_chunks_or_not(step: int) -> None:
    body = _sse(*[_chat_chunk(f"tok{k} ") for k in range(20)])
    reads = [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"]
    reads.append(b"Transfer-Encoding: chunked\r\n\r\n")
    for event in body.split(b"\n\n")[:-1]:
        framed = b"%x\r\n%s\n\n\r\n" % (len(event) + 2, event)
        reads += [framed] if not step else [framed[i : i + 1] for i in range(len(framed))]
    answer = Answer(max_bytes=len(body) // 2, lines=True, clock=lambda: 0.0)
    with pytest.raises(RequestError) as caught:
        for data in reads:
            answer.feed(data)
    assert caught.value.kind == "invalid_response" and "MiB (max_response_mib)" in str(caught.value)
    assert answer.size > len(body) // 2 and not answer.done


# What llama-server (httplib build, ggml-org/llama.cpp tools/server/server.cpp, 2025) streams
# when a request fails after its 200: ``server_sent_event(sink, "error", error_data)`` writes an
# ``error:`` field (format_error_response's object), then ``data: [DONE]``.
LLAMACPP_STREAM_ERROR = (
    b'error: {"code":400,"message":"the request exceeds the available context size, try '
    b'increasing it","type":"exceed_context_size_error"}\n\ndata: [DONE]\n\n'
)


@pytest.mark.parametrize("before", [b"", _sse(_chat_chunk("partial "))])
def test_llamacpps_error_field_is_the_streams_error_not_an_empty_or_cut_answer(
    before: bytes,
) -> None:
    """Skipped as an unknown SSE field, it left "the stream carried no choices" (the server's
    reason lost) or, after some text, an answer without its failure."""
    with pytest.raises(RequestError) as caught:
        completion_of(_fed([before + LLAMACPP_STREAM_ERROR]), START, stream=True, chat=True)
    assert "exceeds the available context size" in str(caught.value)


# vLLM's streamed failure (entrypoints/openai serving: create_streaming_error_response): one
# ``data: {"error": {…, "code": N}}`` after the 200, then ``data: [DONE]``; N is 400 for what it
# rejects mid-stream (its default) and 500 for a failed generation.
def _vllm_error(code: int, message: str) -> bytes:
    err = {"message": message, "type": "BadRequestError", "param": None, "code": code}
    return _sse(_chat_chunk("partial "), {"error": err}, b"[DONE]")


@pytest.mark.parametrize(
    ("body", "kind", "status"),
    [
        (_vllm_error(400, "the prompt holds a token the tokenizer refuses"), "http_4xx", 400),
        (_vllm_error(500, "Internal server error"), "http_5xx", 500),
        (_vllm_error(500, "CUDA out of memory"), "oom", 500),
        (LLAMACPP_STREAM_ERROR, "http_4xx", 400),
        (_sse({"error": {"message": "m", "code": "400"}}), "http_4xx", 400),
        (_sse({"error": {"message": "m", "code": 200}}), "http_5xx", 500),  # no error status
        (_sse({"error": {"message": "m", "code": "rate_limited"}}), "http_5xx", 500),
    ],
)
def test_an_error_in_a_stream_has_the_status_its_body_names_never_a_500_it_did_not_say(
    body: bytes, kind: str, status: int
) -> None:
    """Every error after the 200 read as "HTTP 500", http_5xx: a request vLLM rejected (400)
    was retried by batch as transient and failed again, and the line named a status no server
    sent. The body's ``code`` is the status; none named, it says it read a server error."""
    with pytest.raises(RequestError) as caught:
        completion_of(_fed([body]), START, stream=True, chat=True)
    info = caught.value.info
    assert (info.kind, info.status) == (kind, status)
    assert str(caught.value).startswith("error in an HTTP 200 answer (")
    assert "HTTP 500" not in str(caught.value)
