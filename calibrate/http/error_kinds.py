"""Transport failures and HTTP answers mapped to the error kinds of SPEC §5.5, in one place.

``connect`` (refused, DNS), ``timeout``, ``reset`` (dropped mid-request), ``oom`` (an error text
mentioning out of memory), ``overloaded`` (429, or 503 with Retry-After), ``http_4xx``,
``http_5xx``, ``invalid_response``. The server's own message is kept, from whichever shape its
error body has: ``{"error": {"message"}}`` (OpenAI, vLLM's ``{"message"}``), or FastAPI's
``{"detail"}`` (``transformers serve``, a string or a list).
"""

from __future__ import annotations

import errno
import math
import re
import ssl
from dataclasses import replace
from typing import Any

from calibrate import json_text
from calibrate.errors import CalibrateError, ErrorInfo, ErrorKind, RequestError
from calibrate.redact import one_line

MAX_RETRY_AFTER_S = 3600.0  # a longer hint is read as an hour (the retry policy caps it lower)
_OOM = re.compile(r"out of memory|CUDA OOM|OutOfMemory|\bOOM\b", re.IGNORECASE)


class OutOfDescriptors(CalibrateError):
    """calibrate itself ran out of file descriptors (EMFILE/ENFILE): no server's fault, and no
    item's — the run stops with one message instead of recording an outage."""


_DESCRIPTOR_ERRNOS = (errno.EMFILE, errno.ENFILE)
DESCRIPTORS_MESSAGE = (
    "calibrate ran out of file descriptors (too many open files): each request in flight "
    "holds a connection"
)
DESCRIPTORS_HINT = "Raise the limit (ulimit -n 65536) or lower the concurrency (-c), then rerun."


def _out_of_descriptors(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):  # urllib3 wraps the OSError once or twice
        if seen is None:
            return False
        if isinstance(seen, OSError) and seen.errno in _DESCRIPTOR_ERRNOS:
            return True
        if "Too many open files" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def check_descriptors(exc: BaseException) -> None:
    """Raise ``OutOfDescriptors`` when ``exc`` (or what caused it) is EMFILE or ENFILE."""
    if _out_of_descriptors(exc):
        raise OutOfDescriptors(DESCRIPTORS_MESSAGE, DESCRIPTORS_HINT) from exc


def redirect_error(status: int, url: str, headers: Any) -> ErrorInfo:
    """A 3xx: never followed (the key would go wherever it points), never retried."""
    where = headers.get("Location") or "nowhere (no Location header)"
    return ErrorInfo(
        "http_4xx",
        f"HTTP {status}: {url} redirects to {shorten(where)}; set base_url to the address the "
        "server answers on (calibrate does not follow redirects)",
        status,
    )


CONTEXT_LENGTH = re.compile(  # vLLM, SGLang, llama.cpp, TGI, LMDeploy, OpenAI wordings
    r"context length|context size|context window|too many tokens|prompt is too long|"
    r"input is too long|max_model_len|max_new_tokens`? must be|exceed_context_size",
    re.IGNORECASE,
)
UNKNOWN_MODEL = re.compile(
    r"model .{0,80}(?:does not exist|not found|not served|unknown|is not available)|"
    r"(?:unknown|invalid|no such) model|model_not_found",
    re.IGNORECASE,
)


def refusal_cause(info: ErrorInfo) -> str | None:
    """What a 4xx's text says was wrong: ``context_length``, ``unknown_model`` or None."""
    text = f"{info.message} {info.body or ''}"
    if CONTEXT_LENGTH.search(text):
        return "context_length"
    if UNKNOWN_MODEL.search(text):
        return "unknown_model"
    return None


def request_error(kind: ErrorKind, message: str, exc: BaseException | None) -> RequestError:
    return RequestError(ErrorInfo(kind, message), type(exc).__name__ if exc else None)


def invalid(message: str) -> RequestError:
    return RequestError(ErrorInfo("invalid_response", message))


# Why nothing answered, as ``connection_error`` words it, and what to do about each.
REFUSED = "connection refused"
UNRESOLVED = "host name not resolved"
NO_ROUTE = "no route to host"
PLAIN_HTTP = "the TLS handshake failed: it answers plain HTTP? then use http://"
UNTRUSTED = "its TLS certificate is not trusted"
START_HINT = "Start it, or try the built-in one: make mock"
REACH_HINTS = {
    REFUSED: START_HINT,
    UNRESOLVED: "Check the host name in base_url (--base-url, CALIBRATE_BASE_URL or "
    "[target].base_url).",
    NO_ROUTE: "Check the address in base_url and the network between here and the server "
    "(a firewall, a VPN).",
    PLAIN_HTTP: "Write base_url with http:// (the server speaks plain HTTP), or serve TLS there.",
    UNTRUSTED: "Point SSL_CERT_FILE at the CA that signed it, or use http:// on a network you "
    "trust.",
}
_TLS_NOT_SPOKEN = (
    "WRONG_VERSION_NUMBER",
    "wrong version number",
    "record layer failure",
    "http request",
    "packet length too long",
    "unknown protocol",
)


def reach_hint(message: str) -> str:
    """What to do about a server that could not be reached, by the reason its message gives
    (a refused connection: start it; a name: check it; plain HTTP: use http://)."""
    return next((hint for reason, hint in REACH_HINTS.items() if reason in message), START_HINT)


def connection_error(url: str, exc: BaseException) -> RequestError:
    """``connect`` when nothing could be reached (refused, DNS, no route, no TLS), else
    ``reset``. Every transport maps its failures here, so each reason reads the same."""
    text = str(exc)
    tls = _tls_failure(exc)
    if tls is not None:
        if any(marker in tls for marker in _TLS_NOT_SPOKEN):
            return request_error("connect", f"no TLS server at {url} ({PLAIN_HTTP})", exc)
        if "CERTIFICATE_VERIFY_FAILED" in tls or "certificate verify failed" in tls:
            return request_error("connect", f"no trusted server at {url} ({UNTRUSTED})", exc)
        return request_error("connect", f"the TLS handshake with {url} failed: {shorten(tls)}", exc)
    reasons = (
        (
            (
                "Name or service not known",
                "nodename nor servname",
                "Failed to resolve",
                "Temporary failure in name resolution",
                "No address associated with hostname",
            ),
            UNRESOLVED,
        ),
        (("No route to host", "Network is unreachable"), NO_ROUTE),
        (("Connection refused", "NewConnectionError"), REFUSED),
    )
    for markers, reason in reasons:
        if any(marker in text for marker in markers):
            return request_error("connect", f"no server at {url} ({reason})", exc)
    return request_error(
        "reset", f"the connection to {url} was dropped: {shorten(words(exc))}", exc
    )


def _tls_failure(exc: BaseException) -> str | None:
    """The words of a TLS failure in ``exc`` or what caused it (``ssl.SSLError``, urllib3's
    ``SSLError``), else None."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLError) or type(seen).__name__ == "SSLError":
            return words(seen)
        seen = seen.__cause__ or seen.__context__
    return None


def words(exc: BaseException) -> str:
    """An exception's messages in words, the nested ones too, never a Python repr:
    ``Connection aborted: Remote end closed connection without response`` rather than
    ``('Connection aborted.', RemoteDisconnected('Remote end closed …'))``."""
    parts: list[str] = []

    def walk(error: BaseException) -> None:
        for arg in error.args:
            if isinstance(arg, BaseException):
                walk(arg)
            elif isinstance(arg, str) and arg.strip():
                parts.append(arg.strip().rstrip("."))

    walk(exc)
    return ": ".join(dict.fromkeys(parts)) or type(exc).__name__


def shorten(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def http_error(status: int, text: str, headers: Any) -> ErrorInfo:
    try:
        body = json_text.loads(text) if text else {}
    except ValueError:
        body = {}
    info = error_from_body(status, body if isinstance(body, dict) else {}, fallback=text)
    retry_after = retry_after_s(headers.get("Retry-After"))
    if status == 429 or (status == 503 and retry_after is not None):
        kind: ErrorKind = "overloaded"
    else:
        kind = info.kind
    return ErrorInfo(kind, info.message, status, retry_after, shorten(text, 4000))


def error_from_body(status: int, body: dict[str, Any], fallback: str = "") -> ErrorInfo:
    """The server's own error message; kind from its status and text."""
    message = ""
    err = body.get("error")
    if isinstance(err, dict):
        message = str(err.get("message") or "")
    elif isinstance(err, str):
        message = err
    message = message or str(body.get("message") or body.get("detail") or "") or shorten(fallback)
    message = one_line(message)  # its line breaks would print lines calibrate never wrote
    if _OOM.search(message) or _OOM.search(fallback):
        kind: ErrorKind = "oom"
    elif status >= 500:
        kind = "http_5xx"
    else:
        kind = "http_4xx"
    return ErrorInfo(kind, f"HTTP {status}: {shorten(message, 300)}".rstrip(": "), status)


def error_in_answer(body: dict[str, Any]) -> ErrorInfo:
    """An error object in an answer sent with HTTP 200: a stream that fails after its first
    bytes (vLLM's ``data: {"error": …}``, llama.cpp's ``error: {…}``), or a 200 whose body is an
    error. Its status is the one the body names (``error.code``: vLLM marks a request it rejects
    mid-stream 400, a failed generation 500; llama.cpp a context overflow 400), never a 500 it
    did not say: a 400 retried as transient fails again. A body that names none is read as a
    server error, and says so."""
    err = body.get("error")
    code = err.get("code") if isinstance(err, dict) else None
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    named = type(code) is int and 400 <= code <= 599
    status = code if named and isinstance(code, int) else 500
    info = error_from_body(status, body)
    said = f"code {status}" if named else "no code given, read as a server error"
    text = info.message.removeprefix(f"HTTP {status}").removeprefix(": ")
    return replace(info, message=f"error in an HTTP 200 answer ({said}): {text}".rstrip(": "))


def retry_after_s(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    if not 0.0 <= seconds < math.inf:  # "inf", "nan", negative: no hint to follow
        return None
    return min(seconds, MAX_RETRY_AFTER_S)
