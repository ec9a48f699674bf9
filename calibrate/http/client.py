"""The OpenAI-compatible client: chat, completions (prompt lists too), SSE, /v1/models.

One pooled HTTP transport (``calibrate.http.transport``), and every failure mapped once, there,
to an error kind of SPEC §5.5 (raised as ``RequestError``). Three promises are kept at this edge:

- a total deadline per request: ``timeout_s`` bounds connect, send and every read, the status
  line and headers included (``calibrate.http.deadline``) and streams too (bodies are read in
  pieces with the socket timeout set to the time left, so a server that drips a byte a second,
  its headers or its body, or streams only keep-alive comments is cut at ``timeout_s``);
- a size cap: an answer over ``max_response_mib`` is ``invalid_response``, never buffered whole;
- secrets stay here: the key (or the base URL's userinfo, sent as Basic auth) goes only to the
  target's own origin, and every server-provided text is scrubbed of them before it is raised.
  ``redacted_headers`` is what records and incidents may keep.

Completions — the load engine's hot path — go through the asyncio transport
(``calibrate.http.aio``: one event-loop thread does the I/O of every request), the winner of
``make bench``'s transports: the load engine (every stage's load, every batch item) awaits
them on that loop (``complete``), every other caller hands them to it and waits
(``post_completion``). It
replaces a kept-alive connection the server closed just as it was reused (once, see
``calibrate.http.aio.connection``) and keeps at most ``max_connections`` idle. The control plane
(``/v1/models``, ``/metrics``, probes) goes over urllib3's pool (``calibrate.http.transport``).
Neither retries anything else: retrying is the caller's decision (batch).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from calibrate import json_text
from calibrate.errors import RequestError
from calibrate.http.aio.bridge import AioTransport, checked
from calibrate.http.aio.completion import completion_of
from calibrate.http.aio.connection import Call
from calibrate.http.aio.wire import Answer
from calibrate.http.models import (
    Completion,
    ModelInfo,
    SamplingParams,
    chat_request,
    completions_request,
)
from calibrate.http.request_times import RequestTimes
from calibrate.http.responses import parse_model_list, valid_text
from calibrate.http.transport import Clock, Transport, parse_json
from calibrate.redact import Scrubber, origin, split_userinfo

MIB = 1024 * 1024
# json.dumps(body, ensure_ascii=False) builds an encoder per call; this one is made once
_BODY = json_text.encoder()


class OpenAIClient:
    """Talks to one server at ``base_url`` (ending in /v1)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        metrics_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_response_mib: float = 64.0,
        max_connections: int = 64,
        clock: Clock = time.perf_counter,
    ) -> None:
        credentials = split_userinfo(base_url.rstrip("/"))
        self.base_url = credentials.url  # without userinfo: safe in every message
        self.origin = origin(self.base_url)
        self.timeout_s = timeout_s
        self.connect_timeout_s = min(connect_timeout_s, timeout_s)
        self.max_response_mib = max_response_mib
        self._clock = clock
        self._transport = Transport(
            timeout_s=timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            max_bytes=int(max_response_mib * MIB),
            max_connections=max_connections,
            clock=clock,
        )
        self._aio = AioTransport(
            connect_timeout_s=self.connect_timeout_s,
            max_bytes=int(max_response_mib * MIB),
            max_connections=max_connections,
            clock=clock,
        )
        self._target_prefix = urlsplit(self.base_url).path
        scheme, host, port = self.origin
        self._origin = (scheme, host, port or (443 if scheme == "https" else 80))
        basic = credentials.basic_auth
        self._scrub = Scrubber.of(api_key, metrics_key, credentials.password, basic)
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        auth = f"Bearer {api_key}" if api_key else basic
        if auth:
            self._headers["Authorization"] = auth
        # Any other origin (a DCGM exporter on another machine) never sees the target's key.
        self._foreign_headers = {"Accept": "text/plain, */*"}
        if metrics_key:
            self._foreign_headers["Authorization"] = f"Bearer {metrics_key}"

    # -- request bodies (also what incidents record; built in ``http.models``) ------------

    chat_body = staticmethod(chat_request)
    completions_body = staticmethod(completions_request)

    def redacted_headers(self) -> dict[str, str]:
        """The request headers with the key replaced, safe to write to disk."""
        out = dict(self._headers)
        if "Authorization" in out:
            scheme = out["Authorization"].split(" ", 1)[0]
            out["Authorization"] = f"{scheme} [REDACTED]"
        return out

    # -- calls ---------------------------------------------------------------------------

    def chat(
        self, model: str, prompt: str, params: SamplingParams, *, stream: bool = False
    ) -> Completion:
        return self.post_completion(
            "/chat/completions", self.chat_body(model, prompt, params, stream=stream)
        )

    def post_completion(self, path: str, body: dict[str, Any]) -> Completion:
        """POST a chat or completions body and parse the answer (streamed or not)."""
        start = self._clock()
        try:
            answer = self._aio.exchange(self._completion_call(path, body, start + self.timeout_s))
            return self._read(path, body, start)(answer)
        except RequestError as exc:
            raise self._scrubbed(exc) from exc.__cause__

    async def complete(self, path: str, body: dict[str, Any]) -> Completion:
        """``post_completion`` from a coroutine on the I/O loop (the load engine's): the loop
        sends and reads, stamping the bytes as they arrive; a stream (or a large answer) is parsed off it."""
        start = self._clock()
        try:
            call = self._completion_call(path, body, start + self.timeout_s)
            return await self._aio.answer(call, self._read(path, body, start))
        except RequestError as exc:
            raise self._scrubbed(exc) from exc.__cause__

    def _read(
        self, path: str, body: dict[str, Any], start: float
    ) -> Callable[[Answer], Completion]:
        """How an answer to ``body`` is read: checked, parsed and stamped from ``start``."""
        stream, chat, url = bool(body.get("stream")), path.startswith("/chat"), self.base_url + path

        def read(answer: Answer) -> Completion:
            completion = completion_of(checked(answer, url), start, stream=stream, chat=chat)
            return completion if completion.times is not None else _stamped(completion, start)

        return read

    def _completion_call(self, path: str, body: dict[str, Any], deadline: float) -> Call:
        """A completion's request for the asyncio transport (a streamed one kept as timed lines)."""
        return self._aio.call(
            "POST",
            self._origin,
            self.base_url + path,
            self._target_prefix + path,
            deadline,
            body=_BODY(body).encode("utf-8"),
            headers=self._headers,
            lines=bool(body.get("stream")),
            timeout_s=self.timeout_s,
        )

    def models(self, keep: str | None = None) -> tuple[ModelInfo, ...]:
        """``GET /v1/models``: at most ``MAX_MODELS_KEPT`` of them (see ``model_list``)."""
        return self.model_list(keep)[0]

    def model_list(self, keep: str | None = None) -> tuple[tuple[ModelInfo, ...], int]:
        """``GET /v1/models``: the first ``MAX_MODELS_KEPT`` models listed (``keep`` among them
        whenever it is listed at all), and how many more the server listed — a proxy listing
        300,000 models must not become a 16 MB warning or a ledger line per stage."""
        url = self.base_url + "/models"
        try:
            deadline = self._clock() + self.timeout_s
            response = self._transport.send("GET", url, deadline, headers=self._headers)
            payload = parse_json(self._transport.read_body(response, deadline, url, self.timeout_s))
        except RequestError as exc:
            raise self._scrubbed(exc) from exc.__cause__
        return parse_model_list(payload, keep)

    def get_text(self, url_or_path: str, *, timeout_s: float = 5.0) -> str:
        """GET a plain-text resource: a path under the server root (``/metrics``) or a URL.

        A URL on another origin gets no key of the target's (only ``metrics_key``, if given).
        """
        url = url_or_path if "://" in url_or_path else self.server_root + url_or_path
        headers = self._headers if origin(url) == self.origin else self._foreign_headers
        timeout_s = min(timeout_s, self.timeout_s)  # a probe never outwaits timeout_s
        deadline = self._clock() + timeout_s
        try:
            response = self._transport.send(
                "GET", url, deadline, headers=headers, timeout_s=timeout_s
            )
            body = self._transport.read_body(response, deadline, url, timeout_s)
            return body.decode("utf-8", errors="replace")
        except RequestError as exc:
            raise self._scrubbed(exc) from exc.__cause__

    @property
    def server_root(self) -> str:
        """``http://host:port`` — where /health, /metrics and /props live."""
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    def close(self) -> None:
        self._transport.close()
        self._aio.close()

    # -- secrets: what leaves the edge --------------------------------------------------

    def _scrubbed(self, exc: RequestError) -> RequestError:
        """The same failure with valid text and none of our secrets in it (SPEC §11)."""
        info = exc.info
        body = info.body
        clean = replace(
            info,
            message=self._scrub(valid_text(info.message)),
            body=self._scrub(valid_text(body)) if body is not None else None,
        )
        return RequestError(clean, exc.exc_type)


def _stamped(completion: Completion, start: float) -> Completion:
    """The answer with when it was sent, first answered and finished (SPEC §4.1): ``start``
    and its elapsed and TTFT are readings of the client's one monotonic clock."""
    end = start + completion.elapsed_s
    return replace(completion, times=RequestTimes.of(start, end, completion.ttft_s))
