"""The control plane's transport: urllib3's connection pool used directly, a total deadline per
request, a cap.

It carries every call but completions (``/v1/models``, ``/metrics``, ``/props``, probes of the
server's own account); completions go through ``calibrate.http.aio`` alone.

``timeout_s`` bounds connect, send and every read, the status line and headers included
(``calibrate.http.deadline``) and bodies too (read in pieces with the socket timeout set to the
time left); an answer over the cap is ``invalid_response``, never buffered whole. Every transport
failure and HTTP status becomes an error kind of SPEC §5.5 here (raised as ``RequestError``).

Transport retries are off: retrying is the caller's decision, never the transport's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import urllib3
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ProtocolError,
    ReadTimeoutError,
    SSLError,
)

from calibrate import json_text
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

Clock = Callable[[], float]

ERROR_BODY_BYTES = 65536  # of an error answer, this much is kept
MAX_POOL_SIZE = 1024  # urllib3 pre-fills a queue of maxsize slots; block=False grows past it


class Transport:
    """One pool of connections to every origin a client talks to, each request under a deadline."""

    def __init__(
        self,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        max_bytes: int,
        max_connections: int,
        clock: Clock,
    ) -> None:
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._max_bytes = max_bytes
        self._clock = clock
        # block=False: a caller with more threads than max_connections gets extra connections
        # instead of a thread parked on the pool (a stall that would look like server latency).
        # The cap: urllib3 fills its queue with maxsize placeholders up front.
        self._pool = deadline_pool(
            num_pools=4,
            maxsize=min(max(max_connections, 4), MAX_POOL_SIZE),
            block=False,
            retries=False,
        )
        self._timeouts: dict[float, urllib3.Timeout] = {}

    def close(self) -> None:
        self._pool.clear()

    def send(
        self,
        method: str,
        url: str,
        deadline: float,
        *,
        body: dict[str, Any] | None = None,
        headers: dict[str, str],
        timeout_s: float | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """Send one request and return once its headers arrived; the caller reads the body."""
        total = timeout_s if timeout_s is not None else self.timeout_s
        try:
            response = self._pool.urlopen(
                method,
                url,
                body=json.dumps(body, ensure_ascii=False).encode("utf-8") if body else None,
                headers=headers,
                timeout=self.timeout(total),
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
        except (ProtocolError, SSLError, OSError) as exc:
            check_descriptors(exc)
            raise connection_error(url, exc) from exc
        except HTTPError as exc:
            raise request_error("connect", f"request to {url} failed: {exc}", exc) from exc
        if 300 <= response.status < 400:  # never followed: a key would go wherever it points
            finish(response, complete=False)
            raise RequestError(redirect_error(response.status, url, response.headers))
        if response.status >= 400:
            complete = False
            try:
                reader = self.reader(response, url, deadline, total)
                raw, complete = reader.read_some(ERROR_BODY_BYTES)
            except RequestError:
                raw = b""
            finally:
                finish(response, complete=complete)
            text = raw.decode("utf-8", "replace")
            raise RequestError(http_error(response.status, text, response.headers))
        return response

    def timeout(self, total_s: float) -> urllib3.Timeout:
        timeout = self._timeouts.get(total_s)
        if timeout is None:
            connect = min(self.connect_timeout_s, total_s)
            timeout = self._timeouts[total_s] = urllib3.Timeout(
                total=total_s, connect=connect, read=total_s
            )
        return timeout

    def reader(
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

    def read_body(
        self, response: urllib3.BaseHTTPResponse, deadline: float, url: str, timeout_s: float
    ) -> bytes:
        """The whole body, read before ``deadline`` and no larger than the cap."""
        complete = False
        try:
            body = self.reader(response, url, deadline, timeout_s).read_all()
            complete = True
            return body
        finally:
            finish(response, complete=complete)


def parse_json(raw: bytes) -> dict[str, Any]:
    """An answer's body as a JSON object, else ``invalid_response``."""
    try:
        # an object whose first two bytes are not NUL is UTF-8 to json.loads' own detection:
        # decoded as it would, without the detection's Python steps
        utf8 = raw[:1] == b"{" and raw[1:2] != b"\0"
        payload = json_text.loads(raw.decode("utf-8", "surrogatepass") if utf8 else raw)
    except json_text.NestedTooDeeply as exc:
        raise invalid("the server answered with JSON nested too deeply to parse") from exc
    except ValueError as exc:
        raise invalid(f"the server answered with something that is not JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise invalid("the server answered with JSON that is not an object")
    return payload


def finish(response: urllib3.BaseHTTPResponse, *, complete: bool) -> None:
    """Give the connection back: reusable when its body was read to the end, else closed."""
    if not complete:
        response.close()
    response.release_conn()
