"""The HTTP layer of the mock: standard-library threads translating requests to the model.

One thread per connection (HTTP/1.1 keep-alive), a deep listen backlog so a burst of connects is
never dropped, and the access log silenced unless asked for.

Slow or hostile clients cannot stall it: a connection waiting for a request (idle between
keep-alive requests, or sending its request line and headers a byte at a time) is closed after
``WAITING_TIMEOUT_S``, and at most ``max_connections`` are open at once — a new one beyond that
closes the one that has waited longest for a request (never one being answered). A malformed
request (a Content-Length that is not a number, JSON nested too deeply, a lone surrogate) is
answered with a 400, never a dropped connection or a hang.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import resource
import socket
import struct
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from calibrate.mock import payloads
from calibrate.mock.decode import DecodeRun
from calibrate.mock.kv import SeqPlan
from calibrate.mock.malformed import malformed_body
from calibrate.mock.metrics import render_metrics
from calibrate.mock.model import Admission, MockModel
from calibrate.mock.payloads import GenerateRequest, Kind, RequestRejected, error_body
from calibrate.mock.settings import MockSettings
from calibrate.mock.stream import stream_events

log = logging.getLogger("calibrate.mock")

OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate {gib:.2f} GiB. GPU 0 has a total capacity of "
    "{total:.2f} GiB of which {free:.2f} GiB is free. Of the allocated memory {used:.2f} GiB is "
    "allocated by PyTorch."
)
KEEPALIVE_INTERVAL_S = 0.2
WAITING_TIMEOUT_S = 30.0  # for the next request (its line and headers included), per connection
REAP_INTERVAL_S = 0.5
MAX_CONNECTIONS = 1024  # lowered to half the open-file limit where that is smaller
MAX_BODY_BYTES = 64 * 1024 * 1024
_LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def connection_cap() -> int:
    """``MAX_CONNECTIONS``, or half the soft open-file limit (each connection holds one)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(8, min(MAX_CONNECTIONS, soft // 2))


GENERATE_PATHS: dict[str, Kind] = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}


class MockHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server bound to one MockModel; tracks connections to close them on stop."""

    daemon_threads = True
    request_queue_size = 1024  # the default 5 drops SYNs under a burst: a 1 s client retry
    allow_reuse_address = True

    def __init__(
        self,
        settings: MockSettings,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        waiting_timeout_s: float = WAITING_TIMEOUT_S,
        max_connections: int | None = None,
    ) -> None:
        self.settings = settings
        self.model = MockModel(settings)
        self.created = int(time.time())
        self.waiting_timeout_s = waiting_timeout_s
        self.max_connections = max_connections or connection_cap()
        # each open connection → since when it waits for a request (None: being answered)
        self._connections: dict[socket.socket, float | None] = {}
        self._conn_lock = threading.Lock()
        self._closed = threading.Event()
        super().__init__((host, port), MockHandler)
        self._reaper = threading.Thread(target=self._reap, name="mock-reaper", daemon=True)
        self._reaper.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def base_url(self) -> str:
        host = str(self.server_address[0])
        return f"http://{host}:{self.port}/v1"

    def process_request(self, request: Any, client_address: Any) -> None:
        evict: socket.socket | None = None
        with self._conn_lock:
            if len(self._connections) >= self.max_connections:
                waiting = [(t, c) for c, t in self._connections.items() if t is not None]
                if not waiting:  # every connection is being answered: this one waits its turn
                    evict = request
                else:
                    evict = min(waiting, key=lambda pair: pair[0])[1]
                    self._connections[evict] = None  # (closed once, below)
            if evict is not request:
                self._connections[request] = time.monotonic()
        if evict is request:
            log.debug("connection limit %d reached: refused one", self.max_connections)
            self.shutdown_request(request)
            return
        if evict is not None:
            _wake(evict)
        try:
            super().process_request(request, client_address)
        except RuntimeError:  # no thread to be had: refused, the server goes on
            self.shutdown_request(request)

    def shutdown_request(self, request: Any) -> None:
        with self._conn_lock:
            self._connections.pop(request, None)
        super().shutdown_request(request)

    def mark(self, conn: socket.socket, *, waiting: bool) -> None:
        """A connection starts waiting for its next request, or starts being answered."""
        with self._conn_lock:
            if conn in self._connections:
                self._connections[conn] = time.monotonic() if waiting else None

    def open_connections(self) -> int:
        with self._conn_lock:
            return len(self._connections)

    def _reap(self) -> None:
        """Close connections that have waited for a request longer than the timeout."""
        while not self._closed.wait(REAP_INTERVAL_S):
            limit = time.monotonic() - self.waiting_timeout_s
            with self._conn_lock:
                stale = [c for c, t in self._connections.items() if t is not None and t < limit]
                for conn in stale:
                    self._connections[conn] = None  # woken once
            for conn in stale:
                _wake(conn)

    def server_close(self) -> None:
        self._closed.set()
        super().server_close()

    def close_connections(self) -> None:
        """Wake every handler blocked on an idle keep-alive connection so its thread ends."""
        with self._conn_lock:
            conns = list(self._connections)
        for conn in conns:
            _wake(conn)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection from %s failed", client_address, exc_info=True)


class MockHandler(BaseHTTPRequestHandler):
    """Routes one HTTP request; the behaviour lives in MockModel."""

    protocol_version = "HTTP/1.1"
    server_version = "calibrate-mock/0.1"
    disable_nagle_algorithm = True
    server: MockHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.settings.log_requests:
            super().log_message(format, *args)

    def handle_one_request(self) -> None:
        self.server.mark(self.connection, waiting=True)  # its line and headers: under the reaper
        super().handle_one_request()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok:
            self.server.mark(self.connection, waiting=False)  # headers read: being answered
        return ok

    def _body(self) -> bytes | None:
        """The request body by its Content-Length; None (answered 400) when that is no length."""
        raw = self.headers.get("Content-Length")
        text = (raw or "0").strip()
        if not text.isdigit() or int(text) > MAX_BODY_BYTES:
            self.close_connection = True  # where the body ends is unknown: the connection too
            self._send_json(
                400,
                error_body(
                    f"Content-Length must be a number of bytes up to {MAX_BODY_BYTES}, got {raw!r}",
                    "BadRequestError",
                    400,
                ),
            )
            return None
        return self.rfile.read(int(text))

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        settings = self.server.settings
        if path == "/health":
            self._send(200, b"", "text/plain")
        elif path in ("/v1/models", "/models"):
            self._send_json(200, payloads.models_list(settings, self.server.created))
        elif path == "/metrics":
            body = render_metrics(self.server.model.snapshot(), settings)
            self._send(200, body.encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/props" and settings.expose_props:
            self._send_json(200, payloads.props(settings))
        elif path in GENERATE_PATHS:
            self._send_json(405, {"detail": "Method Not Allowed"})
        else:
            self._send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        kind = GENERATE_PATHS.get(self.path.split("?", 1)[0])
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True  # the body stays unread: the connection is unusable
            self._send_json(411, {"detail": "Send the body with a Content-Length."})
            return
        raw = self._body()
        if raw is None:
            return
        if kind is None:
            self._send_json(404, {"detail": "Not Found"})
            return
        settings = self.server.settings
        try:
            body = json.loads(raw)
        except RecursionError:
            body, problem = None, "the request body is JSON nested too deeply"
        except (ValueError, UnicodeDecodeError):
            body, problem = None, None  # not JSON: parse_request says so
        else:
            problem = _lone_surrogate(raw, body)
        if problem is not None:
            self._send_json(400, error_body(problem, "BadRequestError", 400))
            return
        try:
            req = payloads.parse_request(kind, body, settings)
        except RequestRejected as exc:
            self._send_json(exc.status, exc.body)
            return
        model = self.server.model
        adm = model.admit(len(req.prompts))
        try:
            self._answer(req, adm)
        except (ConnectionError, TimeoutError):
            self.close_connection = True  # the client went away; nothing left to tell it
        finally:
            model.release(adm)

    def _answer(self, req: GenerateRequest, adm: Admission) -> None:
        settings = self.server.settings
        if adm.outcome == "oom":
            self._send_json(500, error_body(_oom_message(settings), "InternalServerError", 500))
            return
        if adm.outcome == "overload":
            message = f"The server is overloaded; retry after {settings.retry_after_s:g} s."
            headers = {"Retry-After": f"{settings.retry_after_s:g}"}
            self._send_json(429, error_body(message, "TooManyRequestsError", 429), headers)
            return
        if adm.outcome == "fail":
            body = error_body("Internal server error (injected fault).", "InternalServerError", 500)
            self._send_json(500, body)
            return
        if adm.echo_headers:  # a careless proxy: the request's headers, key included, echoed
            seen = "; ".join(f"{name}: {value}" for name, value in self.headers.items())
            body = error_body(
                f"Internal error handling a request with headers: {seen}",
                "InternalServerError",
                500,
            )
            self._send_json(500, body)
            return
        if settings.keepalive_only:
            self._keepalive_only()
            return
        model = self.server.model
        gens = [
            model.generate(
                prompt,
                req.cap(tokens, settings.max_model_len),
                adm,
                min_tokens=req.min_tokens,
                ignore_eos=req.ignore_eos,
            )
            for prompt, tokens in zip(req.prompts, req.prompt_tokens, strict=True)
        ]
        run: DecodeRun | None = None
        if settings.tracks_tokens:
            plans = [
                SeqPlan.of(p, n, g.completion_tokens, share=settings.prefix_cache)
                for p, n, g in zip(req.prompts, req.prompt_tokens, gens, strict=True)
            ]
            if not model.start(adm, plans):
                self._send_json(500, error_body(_oom_message(settings), "InternalServerError", 500))
                return
            run = DecodeRun(model, adm, time.monotonic() + adm.ttft_s)
        else:
            model.acquire(adm)
        prefix = "chatcmpl-" if req.kind == "chat" else "cmpl-"
        rid, created, start = prefix + uuid.uuid4().hex, int(time.time()), time.monotonic()
        if adm.malformed is not None:
            head = payloads.envelope(req, rid, created, settings, chunk=req.stream)
            bad = malformed_body(adm.malformed, req, head, chunk=req.stream)
            if req.stream:
                self._send_sse([f"data: {json.dumps(bad)}\n\n".encode(), b"data: [DONE]\n\n"])
            else:
                self._send_json(200, bad)
            return
        if not req.stream:
            steps = max(g.completion_tokens for g in gens)
            if adm.outcome == "reset":
                _sleep_until(start + adm.ttft_s)
                self._reset()
                return
            if run is None:
                _sleep_until(start + adm.ttft_s + steps * adm.per_token_s)
            elif not run.wait_step(steps):
                self._send_json(500, error_body(_oom_message(settings), "InternalServerError", 500))
                return
            answer = payloads.full_response(req, gens, rid, created, settings)
            self._send_json(200, answer, drip=True)
            return
        events = stream_events(req, gens, rid, created, settings)
        self._sse_headers()
        for n, event in enumerate(events):
            if adm.outcome == "reset" and n == len(events) // 2:
                self._reset()
                return
            if run is None:
                _sleep_until(start + adm.ttft_s + event.step * adm.per_token_s)
            elif not run.wait_step(event.step):  # vLLM ends a stream that fails with an error event
                error = {"error": error_body(_oom_message(settings), "InternalServerError", 500)}
                self._write_chunk(f"data: {json.dumps(error)}\n\n".encode())
                self._write_chunk(b"data: [DONE]\n\n")
                break
            self._write_chunk(event.encode())
        self._write(b"0\r\n\r\n")

    def _sse_headers(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _send_sse(self, frames: list[bytes]) -> None:
        self._sse_headers()
        for frame in frames:
            self._write_chunk(frame)
        self._write(b"0\r\n\r\n")

    def _keepalive_only(self) -> None:
        """An SSE stream of ``: ping`` comments and nothing else, until the client leaves."""
        settings = self.server.settings
        self._sse_headers()
        end = time.monotonic() + settings.keepalive_limit_s
        while time.monotonic() < end:
            self._write_chunk(b": ping\n\n")
            time.sleep(min(KEEPALIVE_INTERVAL_S, max(0.0, end - time.monotonic())))
        self._write(b"0\r\n\r\n")

    def _write_chunk(self, frame: bytes) -> None:
        self._write(b"%x\r\n%s\r\n" % (len(frame), frame))

    def _write(self, data: bytes) -> None:
        """Send bytes: at once, or with --drip-s one byte at a time."""
        drip_s = self.server.settings.drip_s
        if not drip_s:
            self.wfile.write(data)
            return
        for i in range(len(data)):
            self.wfile.write(data[i : i + 1])
            self.wfile.flush()
            time.sleep(drip_s)

    def _reset(self) -> None:
        """Drop the connection with a TCP RST: the client sees a reset, not a clean close."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()  # the fd really closes when finish() closes rfile

    def _send_json(
        self,
        status: int,
        body: object,
        headers: dict[str, str] | None = None,
        *,
        drip: bool = False,
    ) -> None:
        try:
            data = json.dumps(body, ensure_ascii=False).encode()
        except UnicodeEncodeError:  # a lone surrogate (--lone-surrogate): send it as "\ud800"
            data = json.dumps(body).encode()
        self._send(status, data, "application/json", headers, drip=drip)

    def _send(
        self,
        status: int,
        data: bytes,
        ctype: str,
        headers: dict[str, str] | None = None,
        *,
        drip: bool = False,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if drip:
            self._write(data)  # an answer: dripped under --drip-s
        else:
            self.wfile.write(data)


def _lone_surrogate(raw: bytes, body: object) -> str | None:
    """Why a parsed body is not valid Unicode text (a ``\\ud800`` escape alone), else None."""
    if not _LONE_SURROGATE_ESCAPE.search(raw):  # the common case: no escape, no check
        return None
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return "the request body holds a lone surrogate (\\ud800…): not valid Unicode"
    return None


def _wake(conn: socket.socket) -> None:
    """Make a handler blocked reading ``conn`` see its end (its thread then closes it)."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _oom_message(settings: MockSettings) -> str:
    gib = 1024.0
    return OOM_MESSAGE.format(
        gib=settings.vram_per_request_mib / gib,
        total=settings.vram_total_mib / gib,
        free=settings.vram_per_request_mib / gib / 4,
        used=settings.vram_base_mib / gib,
    )


class BackgroundServer:
    """A MockHTTPServer serving from a daemon thread until ``stop()``."""

    def __init__(
        self, settings: MockSettings, host: str = "127.0.0.1", port: int = 0, **limits: Any
    ) -> None:
        """``limits``: MockHTTPServer's ``waiting_timeout_s`` and ``max_connections``."""
        self.server = MockHTTPServer(settings, host, port, **limits)
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting, drop idle keep-alive connections, close the socket."""
        self.server.shutdown()
        self.server.close_connections()
        self.server.server_close()
        self._thread.join()
