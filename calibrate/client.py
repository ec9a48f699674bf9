"""The OpenAI-compatible client: chat, completions (prompt lists too), SSE, /v1/models.

One pooled HTTP transport, a timeout on every call, and every failure mapped once, here, to an
error kind of SPEC §5.5 (raised as ``RequestError``). The API key is sent as a Bearer header
and never leaves this object: ``redacted_headers`` is what records and incidents may keep.

The transport is urllib3's connection pool (which ``requests`` is built on) used directly: on
the hot path of ladder, sweep and batch it costs about half the client CPU per request that a
``requests.Session`` did (≈0.4 vs ≈0.8 ms, 64-512 threads; ``make bench`` tracks it), so the
client is not the knee the sweep reports. Transport retries are off: retrying is the caller's
decision (batch), never the transport's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
)

from calibrate.error_kinds import (
    connection_error,
    error_from_body,
    http_error,
    invalid,
    request_error,
)
from calibrate.errors import RequestError
from calibrate.records import Choice, Completion, ModelInfo, SamplingParams, Usage
from calibrate.responses import choice_text, parse_completion, sse_events

Clock = Callable[[], float]


class OpenAIClient:
    """Talks to one server at ``base_url`` (ending in /v1)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_connections: int = 64,
        pool: urllib3.PoolManager | None = None,
        clock: Clock = time.perf_counter,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.connect_timeout_s = min(connect_timeout_s, timeout_s)
        self._clock = clock
        self._api_key = api_key
        # block=False: a caller with more threads than max_connections gets extra connections
        # instead of a thread parked on the pool (a stall that would look like server latency).
        self._pool = pool or urllib3.PoolManager(
            num_pools=4, maxsize=max(max_connections, 4), block=False, retries=False
        )
        self._timeouts: dict[float, urllib3.Timeout] = {}
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"

    # -- request bodies (also what incidents record) -------------------------------------

    def chat_body(
        self, model: str, prompt: str, params: SamplingParams, *, stream: bool = False
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            **params.to_json(),
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def completions_body(
        self, model: str, prompts: Sequence[str], params: SamplingParams, *, stream: bool = False
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompts[0] if len(prompts) == 1 else list(prompts),
            **params.to_json(),
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def redacted_headers(self) -> dict[str, str]:
        """The request headers with the key replaced, safe to write to disk."""
        out = dict(self._headers)
        if "Authorization" in out:
            out["Authorization"] = "Bearer [REDACTED]"
        return out

    # -- calls ---------------------------------------------------------------------------

    def chat(
        self, model: str, prompt: str, params: SamplingParams, *, stream: bool = False
    ) -> Completion:
        return self.post_completion(
            "/chat/completions", self.chat_body(model, prompt, params, stream=stream)
        )

    def complete(
        self, model: str, prompts: Sequence[str], params: SamplingParams, *, stream: bool = False
    ) -> Completion:
        return self.post_completion(
            "/completions", self.completions_body(model, prompts, params, stream=stream)
        )

    def post_completion(self, path: str, body: dict[str, Any]) -> Completion:
        """POST a chat or completions body and parse the answer (streamed or not)."""
        stream = bool(body.get("stream"))
        start = self._clock()
        response = self._send("POST", path, body=body, stream=stream)
        if stream:
            try:
                return self._read_stream(
                    response, start, chat=path.startswith("/chat"), url=self.base_url + path
                )
            finally:
                # The stream may end at [DONE] before the transport's last frame: never reuse it.
                _finish(response, complete=False)
        payload = self._json(response)
        return parse_completion(payload, self._clock() - start, None)

    def models(self) -> tuple[ModelInfo, ...]:
        """``GET /v1/models``."""
        payload = self._json(self._send("GET", "/models"))
        data = payload.get("data")
        if not isinstance(data, list):
            raise invalid("GET /models answered without a 'data' list")
        out: list[ModelInfo] = []
        for item in data:
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                root = item.get("root")
                max_len = item.get("max_model_len")
                out.append(
                    ModelInfo(
                        id=item["id"],
                        root=root if isinstance(root, str) else None,
                        max_model_len=max_len if isinstance(max_len, int) else None,
                    )
                )
        return tuple(out)

    def get_text(self, url_or_path: str, *, timeout_s: float = 5.0) -> str:
        """GET a plain-text resource: a path under the server root (``/metrics``) or a URL."""
        url = url_or_path if "://" in url_or_path else self.server_root + url_or_path
        response = self._send("GET", url, timeout_s=timeout_s, absolute=True)
        return response.data.decode("utf-8", errors="replace")

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
        path: str,
        *,
        body: dict[str, Any] | None = None,
        stream: bool = False,
        timeout_s: float | None = None,
        absolute: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        """One HTTP exchange; the body is read here unless ``stream`` (then the caller closes)."""
        url = path if absolute else self.base_url + path
        read_timeout = timeout_s if timeout_s is not None else self.timeout_s
        try:
            response = self._pool.urlopen(
                method,
                url,
                body=json.dumps(body, ensure_ascii=False).encode("utf-8") if body else None,
                headers=self._headers,
                timeout=self._timeout(read_timeout),
                preload_content=not stream,
                redirect=False,
                retries=False,
            )
        except NewConnectionError as exc:  # a subclass of ConnectTimeoutError: test it first
            raise connection_error(url, exc) from exc
        except ConnectTimeoutError as exc:
            raise request_error("connect", f"connection to {url} timed out", exc) from exc
        except ReadTimeoutError as exc:
            raise request_error(
                "timeout", f"no answer from {url} within {read_timeout:g} s", exc
            ) from exc
        except (ProtocolError, OSError) as exc:
            raise connection_error(url, exc) from exc
        except HTTPError as exc:
            raise request_error("connect", f"request to {url} failed: {exc}", exc) from exc
        if response.status >= 400:
            try:
                text = _body_text(response) if stream else response.data.decode("utf-8", "replace")
            finally:
                _finish(response, complete=not stream)
            raise RequestError(http_error(response.status, text, response.headers))
        return response

    def _timeout(self, read_timeout_s: float) -> urllib3.Timeout:
        timeout = self._timeouts.get(read_timeout_s)
        if timeout is None:
            connect = min(self.connect_timeout_s, read_timeout_s)
            timeout = self._timeouts[read_timeout_s] = urllib3.Timeout(
                connect=connect, read=read_timeout_s
            )
        return timeout

    def _json(self, response: urllib3.BaseHTTPResponse) -> dict[str, Any]:
        try:
            payload = json.loads(response.data)
        except (ProtocolError, OSError) as exc:
            raise connection_error(self.base_url, exc) from exc
        except ValueError as exc:
            raise invalid(f"the server answered with something that is not JSON: {exc}") from exc
        if not isinstance(payload, dict):
            raise invalid("the server answered with JSON that is not an object")
        return payload

    def _read_stream(
        self, response: urllib3.BaseHTTPResponse, start: float, *, chat: bool, url: str
    ) -> Completion:
        texts: dict[int, list[str]] = {}
        finish: dict[int, str | None] = {}
        usage: Usage | None = None
        model: str | None = None
        fingerprint: str | None = None
        ttft: float | None = None
        deadline = start + self.timeout_s
        try:
            for event in sse_events(_lines(response)):
                if event == "[DONE]":
                    break
                try:
                    chunk = json.loads(event)
                except ValueError as exc:
                    raise invalid(f"a stream chunk is not JSON: {event[:200]!r}") from exc
                if not isinstance(chunk, dict):
                    raise invalid("a stream chunk is not a JSON object")
                if "error" in chunk:
                    raise RequestError(error_from_body(500, chunk))
                model = chunk.get("model") or model
                fingerprint = chunk.get("system_fingerprint") or fingerprint
                usage = Usage.from_json(chunk.get("usage")) or usage
                for choice in chunk.get("choices") or []:
                    if not isinstance(choice, dict):
                        continue
                    index = int(choice.get("index", 0) or 0)
                    piece = choice_text(choice, chat=chat, delta=True)
                    if piece:
                        if ttft is None:
                            ttft = self._clock() - start
                        texts.setdefault(index, []).append(piece)
                    else:
                        texts.setdefault(index, [])
                    if choice.get("finish_reason") is not None:
                        finish[index] = choice["finish_reason"]
                if self._clock() > deadline:
                    raise request_error(
                        "timeout", f"stream still open after {self.timeout_s:g} s", None
                    )
        except ReadTimeoutError as exc:
            raise request_error("timeout", f"stream stalled for {self.timeout_s:g} s", exc) from exc
        except (HTTPError, OSError) as exc:
            raise connection_error(url, exc) from exc
        if not texts:
            raise invalid("the stream carried no choices")
        choices = tuple(
            Choice(index=i, text="".join(texts[i]), finish_reason=finish.get(i))
            for i in sorted(texts)
        )
        return Completion(choices, usage, model, fingerprint, self._clock() - start, ttft)


def _lines(response: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
    """The lines of a streamed body as they arrive (chunked or not), without line endings."""
    chunks: Iterator[bytes]
    if getattr(response, "chunked", False):
        chunks = response.read_chunked()
    else:
        chunks = iter(lambda: response.read1(65536), b"")
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line.rstrip(b"\r")
    if pending:
        yield pending.rstrip(b"\r")


def _body_text(response: urllib3.BaseHTTPResponse, limit: int = 65536) -> str:
    """The (start of the) body of a streamed error answer."""
    try:
        return response.read(limit).decode("utf-8", errors="replace")
    except (HTTPError, OSError):
        return ""


def _finish(response: urllib3.BaseHTTPResponse, *, complete: bool) -> None:
    """Give the connection back: reusable when its body was read to the end, else closed."""
    if not complete:
        response.close()
    response.release_conn()
