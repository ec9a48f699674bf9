"""Whether the server takes streamed requests, asked once before a streamed stage (SPEC §5.13).

Ladder and sweep stream by default. Some OpenAI-compatible servers, or proxies in front of them,
answer ``"stream": true`` or the ``stream_options`` field with an HTTP 4xx ("streaming not
supported", "unknown field stream_options"); sent as is, the first tier would fail with
``http_4xx`` — a verdict about the protocol, not about capacity.

So one tiny probe goes first: the fixed prompt, ``max_tokens`` 1, shaped like the stage's
requests (chat, or completions in prompt-list mode), counted in no tier. Refused with a 4xx, it
is sent once without ``stream_options`` (still streamed), then once unstreamed; the stage goes
on the first way that was answered, and says what that way cannot measure. Nothing else is
retried: a 5xx, an OOM, a timeout, or a 4xx to every shape leaves the stage as asked, and its
tiers report the real error (the ladder never retries load: a failure there is information).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from calibrate.config import LadderMode
from calibrate.errors import RequestError
from calibrate.http.error_kinds import shorten
from calibrate.load.request import CHAT_PATH, COMPLETIONS_PATH
from calibrate.stages.context import StageContext
from calibrate.stages.single import unreachable

# (stream, stream_options): the shapes tried after a refusal, in order
FALLBACKS: tuple[tuple[bool, bool], ...] = ((True, False), (False, False))
REFUSAL_CHARS = 160  # of the server's words, this much goes into the one-line warning

SendProbe = Callable[[bool, bool], None]  # (stream, stream_options): raises RequestError


@dataclass(frozen=True)
class StreamCheck:
    """How a streamed stage sends its requests, and why, when not as asked."""

    stream: bool = True
    stream_options: bool = True
    refused: str | None = None  # the server's 4xx to the streamed probe ("HTTP 400: …")

    @property
    def fell_back(self) -> bool:
        return self.refused is not None

    def note(self) -> str | None:
        """The one warning line a fallback is worth (None: measured as asked)."""
        if self.refused is None:
            return None
        why = shorten(self.refused, REFUSAL_CHARS)
        if self.stream:
            return (
                f"the server refused stream_options ({why}): streaming without it — TTFT, TPOT "
                "and ITL measured; output tokens counted from stream chunks, not usage"
            )
        return (
            f"the server refused streamed requests ({why}): measuring unstreamed — TTFT, TPOT "
            "and ITL not measured; E2E and throughput are (--no-stream skips this check)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "stream_options": self.stream and self.stream_options,
            "refused": self.refused,
        }


def stream_details(check: StreamCheck | None) -> dict[str, Any]:
    """A stage summary's record of the probe: ``streaming``, and its note among ``notes``
    (what ``report`` shows); nothing when the stage did not stream."""
    if check is None:
        return {}
    note = check.note()
    return {"streaming": check.to_json(), **({"notes": [note]} if note else {})}


def check_streaming(send: SendProbe) -> StreamCheck:
    """Send the streamed probe; on a 4xx, the fallback shapes in order until one is answered."""
    try:
        send(True, True)
        return StreamCheck()
    except RequestError as exc:
        if exc.kind != "http_4xx":
            return StreamCheck()  # capacity or transport, not the protocol: the tiers say so
        refused = exc.info.message
    for stream, options in FALLBACKS:
        try:
            send(stream, options)
        except RequestError as exc:
            if exc.kind == "http_4xx":
                continue
            return StreamCheck()
        return StreamCheck(stream, options, refused)
    return StreamCheck()  # refused whatever its shape: not about streaming, the tiers say why


def probe_stream(ctx: StageContext, mode: LadderMode) -> StreamCheck:
    """``check_streaming`` with the fixed prompt and ``max_tokens`` 1 against the target;
    nothing listening is exit 4, as it would be at the first tier."""
    cfg = ctx.config
    client, model = ctx.client, cfg.target.model
    params = replace(ctx.params, max_tokens=1)
    prompt = cfg.prompt.text

    def send(stream: bool, stream_options: bool) -> None:
        if mode == "prompt-list":
            path = COMPLETIONS_PATH
            body = client.completions_body(
                model, [prompt], params, stream=stream, stream_options=stream_options
            )
        else:
            path = CHAT_PATH
            body = client.chat_body(
                model, prompt, params, stream=stream, stream_options=stream_options
            )
        try:
            client.post_completion(path, body)
        except RequestError as exc:
            if exc.kind == "connect":
                raise unreachable(exc.info, cfg.target.base_url) from exc
            raise

    return check_streaming(send)
