"""A server that answers each path with a fixed reply (status, headers, body): what a hostile or
odd server sends, for the client to read over real HTTP."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

Reply = tuple[int, dict[str, str], bytes]
Replies = dict[str, Reply | Callable[[], Reply]]  # a callable: a reply made per request


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up before the whole reply is written (calibrate reads at most so
    much of an error body) is no error of the server's: no traceback on the test's stderr,
    where a command's own output is checked for one."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class CannedServer:
    def __init__(self, replies: Replies) -> None:
        self.replies = replies
        self.hits: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                path = self.path.split("?", 1)[0]
                outer.hits.append(path)
                reply = outer.replies.get(path, (404, {}, b'{"detail": "no"}'))
                status, headers, body = reply() if callable(reply) else reply
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        # serve_forever looks for shutdown() between polls: at its default 0.5 s every test
        # waited half a second a server for its own exit (test_redirects: 1.0 s a test, of two)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    def __enter__(self) -> CannedServer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
