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
import logging
import resource
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from calibrate import json_text
from calibrate.mock.metrics import render_metrics
from calibrate.mock.model import MockModel
from calibrate.mock.openai import bodies
from calibrate.mock.openai.request import (
    Kind,
    RequestRejected,
    error_body,
    lone_surrogate,
    parse_request,
)
from calibrate.mock.reply import answer
from calibrate.mock.settings import MockSettings
from calibrate.mock.wire import Wire

log = logging.getLogger("calibrate.mock")

WAITING_TIMEOUT_S = 30.0  # for the next request (its line and headers included), per connection
REAP_INTERVAL_S = 0.5
MAX_CONNECTIONS = 1024  # lowered to half the open-file limit where that is smaller
MAX_BODY_BYTES = 64 * 1024 * 1024


def connection_cap() -> int:
    """``MAX_CONNECTIONS``, or half the soft open-file limit (each connection holds one)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(8, min(MAX_CONNECTIONS, soft // 2))


def listening_family(host: str, port: int) -> socket.AddressFamily:
    """The address family of ``host`` (``::1`` and ``::`` are IPv6, a name what it resolves to
    first); a host that names no address is the ``socket.gaierror`` of its look-up."""
    found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return found[0][0]


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
        host = host.removeprefix("[").removesuffix("]")  # "[::1]", as in a URL, is ::1
        self.address_family = listening_family(host, port)
        super().__init__((host, port), MockHandler)
        self._reaper = threading.Thread(target=self._reap, name="mock-reaper", daemon=True)
        self._reaper.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def base_url(self) -> str:
        host = str(self.server_address[0])
        if ":" in host:  # an IPv6 address goes in brackets in a URL
            host = f"[{host}]"
        return f"http://{host}:{self.port}/v1"

    def process_request(self, request: Any, client_address: Any) -> None:
        evict: socket.socket | None = None
        with self._conn_lock:
            if len(self._connections) >= self.max_connections:
                waiting = [(t, c) for c, t in self._connections.items() if t is not None]
                if not waiting:  # every connection is being answered: this one waits its turn
                    evict = request
                else:  # no longer one of the open: shut down below, its thread ends it
                    evict = min(waiting, key=lambda pair: pair[0])[1]
                    del self._connections[evict]
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

    def _wire(self) -> Wire:
        return Wire(self, self.server.settings)

    def _body(self) -> bytes | None:
        """The request body by its Content-Length; None (answered 400) when that is no length."""
        raw = self.headers.get("Content-Length")
        text = (raw or "0").strip()
        if not text.isdigit() or int(text) > MAX_BODY_BYTES:
            self.close_connection = True  # where the body ends is unknown: the connection too
            self._wire().send_json(
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
            self._wire().send(200, b"", "text/plain")
        elif path in ("/v1/models", "/models"):
            self._wire().send_json(200, bodies.models_list(settings, self.server.created))
        elif path == "/metrics" and settings.metrics:
            time.sleep(settings.metrics_delay_s)  # a slow scrape: the gauges read at its end
            body = render_metrics(self.server.model.snapshot(), settings)
            self._wire().send(200, body.encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/props" and settings.expose_props:
            self._wire().send_json(200, bodies.props(settings))
        elif path == "/get_server_info" and settings.metrics_style == "sglang":
            self._wire().send_json(200, bodies.sglang_server_info(settings))
        elif path in GENERATE_PATHS:
            self._wire().send_json(405, {"detail": "Method Not Allowed"})
        else:
            self._wire().send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        kind = GENERATE_PATHS.get(self.path.split("?", 1)[0])
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True  # the body stays unread: the connection is unusable
            self._wire().send_json(411, {"detail": "Send the body with a Content-Length."})
            return
        raw = self._body()
        if raw is None:
            return
        if kind is None:
            self._wire().send_json(404, {"detail": "Not Found"})
            return
        settings = self.server.settings
        try:
            body = json_text.loads(raw)
        except json_text.NestedTooDeeply:
            body, problem = None, "the request body is JSON nested too deeply"
        except (ValueError, UnicodeDecodeError):
            body, problem = None, None  # not JSON: parse_request says so
        else:
            problem = lone_surrogate(raw, body)
        if problem is not None:
            self._wire().send_json(400, error_body(problem, "BadRequestError", 400))
            return
        try:
            req = parse_request(kind, body, settings)
        except RequestRejected as exc:
            self._wire().send_json(exc.status, exc.body)
            return
        model = self.server.model
        adm = model.admit(len(req.prompts))
        released = False

        def release() -> None:  # once: when generated, or when the answer ended otherwise
            nonlocal released
            if not released:
                released = True
                model.release(adm)

        try:
            answer(self._wire(), req, adm, model, self.headers, release)
        except (ConnectionError, TimeoutError):
            self.close_connection = True  # the client went away; nothing left to tell it
        finally:
            release()


def _wake(conn: socket.socket) -> None:
    """Make a handler blocked reading ``conn`` see its end (its thread then closes it)."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


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
