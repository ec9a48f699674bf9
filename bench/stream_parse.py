"""Bench section ``stream_parse`` (issue 25): the CPU of reading one streamed answer, no socket.

A 64-event answer shaped as the shared ``async_mock.py`` sends it (chat and completions: one
choice per chunk, ``usage: null`` in each, a usage chunk, ``[DONE]``; each event its own HTTP
chunk, fed to the parser as its own read) is read the three ways the client reads one:

- ``wire`` — the asyncio transport's ``Answer.feed``, one call per received chunk (on the loop);
- ``parse`` — ``completion_of``: the fed answer's events into one ``Completion`` (off the loop);
- ``lines`` — ``read_stream`` over the stream's lines, the urllib3 path's parser.

µs per answer, the best of ``--repeat`` rounds of ``--answers`` answers each. ``--repo DIR``
imports calibrate from another checkout (e.g. main's, for a before/after on one machine).

usage: python bench/stream_parse.py [--answers N] [--repeat K] [--repo DIR] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
EVENTS = 64
HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"Cache-Control: no-cache\r\nConnection: keep-alive\r\n\r\n"
)


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def answer_reads(chat: bool, events: int = EVENTS) -> tuple[list[bytes], bytes]:
    """The reads of one streamed answer as async_mock.py writes it (the head, then one HTTP
    chunk per event, the last with the usage chunk, ``[DONE]`` and the closing chunk), and
    its body without the chunk framing."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    common = {"id": "chatcmpl-1", "object": kind, "created": 1764000000, "model": "internlm-s2"}
    reads, body = [HEAD], []
    for k in range(events):
        last = k == events - 1
        text = f"tok{k}" + ("" if last else " ")
        finish = "stop" if last else None
        if chat:
            delta = {"role": "assistant", "content": text} if k == 0 else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        payload = _event({**common, "choices": [choice], "usage": None})
        if last:
            usage = {"prompt_tokens": 3, "completion_tokens": events, "total_tokens": events + 3}
            payload += _event({**common, "choices": [], "usage": usage}) + b"data: [DONE]\n\n"
        body.append(payload)
        reads.append(b"%x\r\n%s\r\n%s" % (len(payload), payload, b"0\r\n\r\n" if last else b""))
    return reads, b"".join(body)


def measure(answers: int, repeat: int) -> dict[str, float]:
    """µs per answer: ``{chat,completions} × {wire,parse,lines}``, best of ``repeat`` rounds.

    Each answer is parsed right after it was fed, as the client does (its bytes still warm)."""
    from calibrate.http.aio.completion import completion_of
    from calibrate.http.aio.wire import Answer
    from calibrate.http.stream import read_stream

    clock, cpu = time.perf_counter, time.process_time
    out: dict[str, float] = {}
    for chat in (True, False):
        name = "chat" if chat else "completions"
        reads, body = answer_reads(chat)
        lines = body.split(b"\n")[:-1]  # as the urllib3 reader yields them: no line ends
        best = {"wire": float("inf"), "parse": float("inf"), "lines": float("inf")}
        for _ in range(repeat):
            wire_s = parse_s = 0.0
            for _ in range(answers):
                t0 = cpu()
                answer = Answer(max_bytes=1 << 24, lines=True, clock=clock)
                for data in reads:
                    answer.feed(data)
                t1 = cpu()
                done = completion_of(answer, 0.0, stream=True, chat=chat)
                wire_s, parse_s = wire_s + t1 - t0, parse_s + cpu() - t1
            t2 = cpu()
            for _ in range(answers):
                read_stream(iter(lines), 0.0, clock, chat=chat)
            lines_s = cpu() - t2
            assert done.choices[0].text.startswith("tok0 tok1 ") and done.stream is not None
            for step, took_s in (("wire", wire_s), ("parse", parse_s), ("lines", lines_s)):
                best[step] = min(best[step], took_s / answers * 1e6)
        out.update({f"{name} {step}": round(us, 1) for step, us in best.items()})
    return out


def table(figures: dict[str, float], origin: str) -> str:
    rows = [
        f"one {EVENTS}-event streamed answer, µs of CPU (calibrate from {origin})",
        "| answer | wire (Answer.feed) | parse (completion_of) | wire + parse | lines (read_stream) |",
        "|---|---|---|---|---|",
    ]
    for name in ("chat", "completions"):
        wire, parse, lines = (figures[f"{name} {s}"] for s in ("wire", "parse", "lines"))
        rows.append(f"| {name} | {wire:.1f} | {parse:.1f} | {wire + parse:.1f} | {lines:.1f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=200, help="answers per round (200)")
    parser.add_argument("--repeat", type=int, default=15, help="rounds, the best kept (15)")
    parser.add_argument("--repo", metavar="DIR", help="import calibrate from DIR (this checkout)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    repo = Path(args.repo).resolve() if args.repo else HERE.parent
    sys.path.insert(0, str(repo))
    figures = measure(max(1, args.answers), max(1, args.repeat))
    print(table(figures, str(repo)))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
