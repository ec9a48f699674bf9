"""The OpenAI-compatible client: chat, completions (prompt lists too), SSE, /v1/models.

One pooled HTTP transport, and every failure mapped once, here, to an error kind of SPEC §5.5
(raised as ``RequestError``). Three promises are kept at this edge:

- a total deadline per request: ``timeout_s`` bounds connect, send and every read, the status
  line and headers included (``calibrate.http.deadline``) and streams too (bodies are read in
  pieces with the socket timeout set to the time left, so a server that drips a byte a second,
  its headers or its body, or streams only keep-alive comments is cut at ``timeout_s``);
- a size cap: an answer over ``max_response_mib`` is ``invalid_response``, never buffered whole;
- secrets stay here: the key (or the base URL's userinfo, sent as Basic auth) goes only to the
  target's own origin, and every server-provided text is scrubbed of them before it is raised.
  ``redacted_headers`` is what records and incidents may keep.

The transport is urllib3's connection pool (which ``requests`` is built on) used directly: on
the hot path of ladder, sweep and batch it costs about half the client CPU per request that a
``requests.Session`` did (≈0.4 vs ≈0.8 ms, 64-512 threads; ``make bench`` tracks it), so the
client is not the knee the sweep reports. Transport retries are off: retrying is the caller's
decision (batch), never the transport's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)

from calibrate.errors import RequestError
from calibrate.http.bodies import BodyReader
from calibrate.http.deadline import deadline_pool
from calibrate.http.error_kinds import (
    check_descriptors,
    connection_error,
    http_error,
    invalid,
    redirect_error,
    request_error,
)
from calibrate.http.models import Choice, Completion, ModelInfo, SamplingParams, Usage
from calibrate.http.request_times import RequestTimes
from calibrate.http.responses import in_range, parse_chunk, parse_completion, sse_events, valid_text
from calibrate.http.stream_timing import stream_timing
from calibrate.redact import Scrubber, split_userinfo

Clock = Callable[[], float]

MIB = 1024 * 1024
ERROR_BODY_BYTES = 65536  # of an error answer, this much is kept
MAX_MODELS_KEPT = 32  # of GET /v1/models, this many are kept (the rest counted)
MAX_ID_CHARS = 512  # of a model's id or root
MAX_MODEL_LEN = 2**31 - 1  # a context length past this is no length (ignored, as when absent)
MAX_POOL_SIZE = 1024  # urllib3 pre-fills a queue of maxsize slots; block=False grows past it


def origin(url: str) -> tuple[str, str, int | None]:
    """scheme, host, port: where a key may be sent."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # "[::1" or not a number: config reports it; here it must not match
        return "", "", -1
    port = port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


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
        pool: urllib3.PoolManager | None = None,
        clock: Clock = time.perf_counter,
    ) -> None:
        credentials = split_userinfo(base_url.rstrip("/"))
        self.base_url = credentials.url  # without userinfo: safe in every message
        self.origin = origin(self.base_url)
        self.timeout_s = timeout_s
        self.connect_timeout_s = min(connect_timeout_s, timeout_s)
        self.max_response_mib = max_response_mib
        self._max_bytes = int(max_response_mib * MIB)
        self._clock = clock
        # block=False: a caller with more threads than max_connections gets extra connections
        # instead of a thread parked on the pool (a stall that would look like server latency).
        # The cap: urllib3 fills its queue with maxsize placeholders up front.
        self._pool = pool or deadline_pool(
            num_pools=4,
            maxsize=min(max(max_connections, 4), MAX_POOL_SIZE),
            block=False,
            retries=False,
        )
        self._timeouts: dict[float, urllib3.Timeout] = {}
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

    # -- request bodies (also what incidents record) -------------------------------------

    def chat_body(
        self,
        model: str,
        prompt: str,
        params: SamplingParams,
        *,
        stream: bool = False,
        stream_options: bool = True,
    ) -> dict[str, Any]:
        """``stream_options`` (usage in the stream) goes with ``stream`` unless turned off: some
        proxies refuse the field (``stages.stream_probe``)."""
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            **params.to_json(),
            "stream": stream,
        }
        if stream and stream_options:
            body["stream_options"] = {"include_usage": True}
        return body

    def completions_body(
        self,
        model: str,
        prompts: Sequence[str],
        params: SamplingParams,
        *,
        stream: bool = False,
        stream_options: bool = True,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompts[0] if len(prompts) == 1 else list(prompts),
            **params.to_json(),
            "stream": stream,
        }
        if stream and stream_options:
            body["stream_options"] = {"include_usage": True}
        return body

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
        stream = bool(body.get("stream"))
        chat = path.startswith("/chat")
        url = self.base_url + path
        start = self._clock()
        deadline = start + self.timeout_s
        try:
            response = self._send("POST", url, deadline, body=body)
            if stream and _is_event_stream(response):
                try:
                    streamed = self._read_stream(response, start, deadline, chat=chat, url=url)
                    return _stamped(streamed, start)
                finally:
                    # The stream may end at [DONE] before the transport's last frame: never reuse it.
                    _finish(response, complete=False)
            payload = self._json(self._read_body(response, deadline, url, self.timeout_s))
            return _stamped(
                parse_completion(payload, self._clock() - start, None, chat=chat), start
            )
        except RequestError as exc:
            raise self._scrubbed(exc) from exc.__cause__

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
            response = self._send("GET", url, deadline)
            payload = self._json(self._read_body(response, deadline, url, self.timeout_s))
        except RequestError as exc:
            raise self._scrubbed(exc) from exc.__cause__
        data = payload.get("data")
        if not isinstance(data, list):
            raise invalid("GET /models answered without a 'data' list")
        out: list[ModelInfo] = []
        more = 0
        kept = False  # ``keep`` is among ``out``
        for item in data:
            if not (isinstance(item, dict) and isinstance(item.get("id"), str)):
                continue
            name: str = item["id"]
            wanted = name == keep and not kept
            if len(out) >= MAX_MODELS_KEPT:
                more += 1
                if not wanted:
                    continue
                out.pop()  # ``keep`` takes the last place
            kept = kept or wanted
            root = item.get("root")
            out.append(
                ModelInfo(
                    id=valid_text(name if wanted else name[:MAX_ID_CHARS]),
                    root=valid_text(root[:MAX_ID_CHARS]) if isinstance(root, str) else None,
                    max_model_len=in_range(item.get("max_model_len"), 1, MAX_MODEL_LEN),
                )
            )
        return tuple(out), more

    def get_text(self, url_or_path: str, *, timeout_s: float = 5.0) -> str:
        """GET a plain-text resource: a path under the server root (``/metrics``) or a URL.

        A URL on another origin gets no key of the target's (only ``metrics_key``, if given).
        """
        url = url_or_path if "://" in url_or_path else self.server_root + url_or_path
        headers = self._headers if origin(url) == self.origin else self._foreign_headers
        timeout_s = min(timeout_s, self.timeout_s)  # a probe never outwaits timeout_s
        deadline = self._clock() + timeout_s
        try:
            response = self._send("GET", url, deadline, headers=headers, timeout_s=timeout_s)
            body = self._read_body(response, deadline, url, timeout_s)
            return body.decode("utf-8", errors="replace")
        except RequestError as exc:
            raise self._scrubbed(exc) from exc.__cause__

    @property
    def server_root(self) -> str:
        """``http://host:port`` — where /health, /metrics and /props live."""
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    def close(self) -> None:
        self._pool.clear()

    # -- the edge: transport errors and HTTP statuses become error kinds -----------------

    def _send(
        self,
        method: str,
        url: str,
        deadline: float,
        *,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """Send one request and return once its headers arrived; the caller reads the body."""
        total = timeout_s if timeout_s is not None else self.timeout_s
        try:
            response = self._pool.urlopen(
                method,
                url,
                body=json.dumps(body, ensure_ascii=False).encode("utf-8") if body else None,
                headers=headers or self._headers,
                timeout=self._timeout(total),
                preload_content=False,
                redirect=False,
                retries=False,
            )
        except NewConnectionError as exc:  # a subclass of ConnectTimeoutError: test it first
            check_descriptors(exc)
            raise connection_error(url, exc) from exc
        except ConnectTimeoutError as exc:
            raise request_error(
                "connect", f"connection to {url} timed out after {self.connect_timeout_s:g} s", exc
            ) from exc
        except ReadTimeoutError as exc:
            raise request_error("timeout", f"no answer from {url} within {total:g} s", exc) from exc
        except (ProtocolError, OSError) as exc:
            check_descriptors(exc)
            raise connection_error(url, exc) from exc
        except HTTPError as exc:
            raise request_error("connect", f"request to {url} failed: {exc}", exc) from exc
        if 300 <= response.status < 400:  # never followed: a key would go wherever it points
            _finish(response, complete=False)
            raise RequestError(redirect_error(response.status, url, response.headers))
        if response.status >= 400:
            complete = False
            try:
                reader = self._reader(response, url, deadline, total)
                raw, complete = reader.read_some(ERROR_BODY_BYTES)
            except RequestError:
                raw = b""
            finally:
                _finish(response, complete=complete)
            text = raw.decode("utf-8", "replace")
            raise RequestError(http_error(response.status, text, response.headers))
        return response

    def _timeout(self, total_s: float) -> urllib3.Timeout:
        timeout = self._timeouts.get(total_s)
        if timeout is None:
            connect = min(self.connect_timeout_s, total_s)
            timeout = self._timeouts[total_s] = urllib3.Timeout(
                total=total_s, connect=connect, read=total_s
            )
        return timeout

    def _reader(
        self, response: urllib3.BaseHTTPResponse, url: str, deadline: float, timeout_s: float
    ) -> BodyReader:
        return BodyReader(
            response,
            url=url,
            deadline=deadline,
            timeout_s=timeout_s,
            max_bytes=self._max_bytes,
            clock=self._clock,
        )

    def _read_body(
        self, response: urllib3.BaseHTTPResponse, deadline: float, url: str, timeout_s: float
    ) -> bytes:
        """The whole body, read before ``deadline`` and no larger than the cap."""
        complete = False
        try:
            body = self._reader(response, url, deadline, timeout_s).read_all()
            complete = True
            return body
        finally:
            _finish(response, complete=complete)

    def _json(self, raw: bytes) -> dict[str, Any]:
        try:
            payload = json.loads(raw)
        except ValueError as exc:
            raise invalid(f"the server answered with something that is not JSON: {exc}") from exc
        except RecursionError as exc:
            raise invalid("the server answered with JSON nested too deeply to parse") from exc
        if not isinstance(payload, dict):
            raise invalid("the server answered with JSON that is not an object")
        return payload

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

    def _read_stream(
        self,
        response: urllib3.BaseHTTPResponse,
        start: float,
        deadline: float,
        *,
        chat: bool,
        url: str,
    ) -> Completion:
        texts: dict[int, list[str]] = {}
        finish: dict[int, str | None] = {}
        usage: Usage | None = None
        model: str | None = None
        fingerprint: str | None = None
        ttft: float | None = None
        arrivals: list[float] = []  # when each chunk with text arrived (the gaps: ITL)
        lines = self._reader(response, url, deadline, self.timeout_s).lines()
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
                arrivals.append(self._clock() - start)
                if ttft is None:
                    ttft = arrivals[0]
        if not texts:
            raise invalid("the stream carried no choices")
        choices = tuple(
            Choice(index=i, text="".join(texts[i]), finish_reason=finish.get(i))
            for i in sorted(texts)
        )
        counted = usage.completion_tokens if usage else None
        timing = stream_timing(arrivals, counted) if len(texts) == 1 else None
        return Completion(choices, usage, model, fingerprint, self._clock() - start, ttft, timing)


def _stamped(completion: Completion, start: float) -> Completion:
    """The answer with when it was sent, first answered and finished (SPEC §4.1): ``start``
    and its elapsed and TTFT are readings of the client's one monotonic clock."""
    end = start + completion.elapsed_s
    return replace(completion, times=RequestTimes.of(start, end, completion.ttft_s))


def _is_event_stream(response: urllib3.BaseHTTPResponse) -> bool:
    """A streamed request answered as SSE; a server that cannot stream answers JSON instead,
    which is read as a plain completion (no TTFT: the caller says so)."""
    kind = (response.headers.get("Content-Type") or "").lower()
    return not kind.startswith("application/json")


def _finish(response: urllib3.BaseHTTPResponse, *, complete: bool) -> None:
    """Give the connection back: reusable when its body was read to the end, else closed."""
    if not complete:
        response.close()
    response.release_conn()
