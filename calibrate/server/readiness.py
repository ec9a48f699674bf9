"""Waiting for a server: ready (``/health`` or ``GET /v1/models``), its port closed, its VRAM freed.

llama.cpp answers ``/health`` with 503 while it loads the model, vLLM and TGI refuse the
connection until they listen: every answer but 200 means "not yet". A managed server that
exits while we wait ends the wait at once, with its exit code and the tail of its log.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from calibrate.engines import find
from calibrate.errors import InputError, RequestError
from calibrate.gpu.proc import listening_owners
from calibrate.http.client import OpenAIClient
from calibrate.io.bounded import read_bounded
from calibrate.server import process

# the VRAM release a stop is proven by lives beside the devices it is measured on
from calibrate.server.devices import RELEASE_TOLERANCE_MIB as RELEASE_TOLERANCE_MIB
from calibrate.server.devices import VramProbe as VramProbe
from calibrate.server.devices import VramRelease as VramRelease
from calibrate.server.devices import used_mib as used_mib
from calibrate.server.devices import wait_released as wait_released
from calibrate.server.process import ServerRecord

Clock = Callable[[], float]
Sleep = Callable[[float], None]


@dataclass(frozen=True)
class Died:
    """The managed process has exited: its ``Popen.returncode`` (None: nothing recorded it)."""

    exit_code: int | None


ExitProbe = Callable[[], Died | None]  # how the managed process ended, once it has exited

POLL_S = 0.2
PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Readiness:
    ready: bool
    elapsed_s: float
    died: Died | None = None  # set when the process died while we waited
    last_answer: str = ""  # what the server said last ("HTTP 503: loading", "connection refused")
    stranger: str = ""  # who answered on the port instead of the engine ("PID 12 (python3)")


def probe(root: str, health_path: str | None) -> tuple[bool, str]:
    """One readiness check against ``root`` (``http://host:port``)."""
    client = OpenAIClient(root + "/v1", timeout_s=PROBE_TIMEOUT_S, max_connections=1)
    try:
        if health_path:
            client.get_text(health_path, timeout_s=PROBE_TIMEOUT_S)
        else:
            client.models()
    except RequestError as exc:
        return False, exc.info.message
    finally:
        client.close()
    return True, "ready"


def wait_ready(
    root: str,
    health_path: str | None,
    timeout_s: float,
    *,
    exited: ExitProbe | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> Readiness:
    """Poll until the server answers ready, the process exits, or ``timeout_s`` passes."""
    start = clock()
    answer = ""
    while True:
        if exited is not None:
            died = exited()
            if died is not None:
                return Readiness(False, clock() - start, died, answer)
        ready, answer = probe(root, health_path)
        if ready:
            return Readiness(True, clock() - start, None, answer)
        if clock() - start >= timeout_s:
            return Readiness(False, clock() - start, None, answer)
        sleep(POLL_S)


def host_port(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    default = 443 if parts.scheme == "https" else 80
    return parts.hostname or "127.0.0.1", parts.port or default


def port_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_port_closed(
    host: str,
    port: int,
    timeout_s: float,
    *,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    replaced: Callable[[], bool] = lambda: False,
) -> bool:
    """True once nothing listens on host:port any more, or ``replaced()`` says another process
    listens there now (a restart quicker than a poll: the old one did stop); False after
    ``timeout_s``."""
    deadline = clock() + timeout_s
    while port_open(host, port) and not replaced():
        if clock() >= deadline:
            return False
        sleep(POLL_S)
    return True


# -- ready means ready (SPEC §6): the engine's own socket, one real completion ----------------

# A cold engine's first completion compiles kernels and warms up: minutes on some. Readiness
# sends one and waits for its answer until the start's own deadline ([server] ready_timeout_s),
# never a second while the first may still be in the engine: a probe given up on after a fixed
# 120 s was sent again while the engine still worked on the first, and the probes piled up.
SAY_WAITING_S = 5.0  # an answer slower than this: the user is told what the start waits on


def stranger_on_port(port: int, engine_pid: int) -> str | None:
    """Who holds ``port`` when it is not the engine: ``"PID 123 (python3)"``; None when the
    engine (a process of its session) holds it, or when it cannot be told."""
    owners = listening_owners(port)
    if not owners:
        return None
    ours = {pid for pid in owners if _session(pid) == engine_pid}
    if ours:
        return None
    pid = min(owners)
    return f"PID {pid} ({_name(pid)})"


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _name(pid: int) -> str:
    try:
        return read_bounded(Path(f"/proc/{pid}/comm")).decode("utf-8", "replace").strip() or "?"
    except (OSError, InputError):
        return "?"


@dataclass(frozen=True)
class Answered:
    """One 1-token completion: ``ok`` when the engine answered it (or answered otherwise than
    asked — HTTP 4xx, a body that is no completion: it is up, only the shape is not its); not
    ``ok`` when the connection failed, timed out or the engine answered 5xx."""

    ok: bool
    what: str
    timed_out: bool = False  # no answer within the time it was given


def first_completion(root: str, api_key: str | None, timeout_s: float) -> Answered:
    """``POST /v1/completions`` of one token for the first model the engine lists (a chat
    completion where it has no completions route)."""
    client = OpenAIClient(root + "/v1", api_key=api_key, timeout_s=timeout_s, max_connections=1)
    try:
        try:
            models = client.models()
        except RequestError:
            models = ()  # a server without a model list still answers a completion
        model = models[0].id if models else "default"
        body = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        chat = {"model": model, "messages": [{"role": "user", "content": "Hello"}]}
        try:
            client.post_completion("/completions", body)
        except RequestError as exc:
            if exc.info.status not in (404, 405):
                raise
            client.post_completion("/chat/completions", {**chat, "max_tokens": 1})
    except RequestError as exc:
        status = exc.info.status
        if status is not None and status < 500:  # it answered: only not as calibrate asked
            return Answered(True, f"it refused a 1-token completion: {exc.info.message}")
        return Answered(False, exc.info.message, exc.info.kind == "timeout")
    finally:
        client.close()
    return Answered(True, "answered a 1-token completion")


def launched(kind: str | None) -> bool:
    """calibrate starts this engine's own process (a built-in kind, also from the pinned script
    that execs it), so the engine holds its listening socket itself; a user's custom command
    may put it behind a wrapper or a container's proxy, whose socket is not the engine's."""
    found = find(kind)
    return found is not None and not found.templated


def ended(record: ServerRecord) -> Died | None:
    """How the engine ended once it has exited (its PID gone: the supervisor writes the status a
    moment later, waited for), else None."""
    if process.liveness(record) == "running":
        code = process.end_code(record, wait=False)  # gone and reaped in between
        return Died(code) if code is not None else None
    return Died(process.end_code(record))


def confirmed(
    record: ServerRecord,
    ready: Readiness,
    timeout_s: float,
    api_key: str | None,
    *,
    own_socket: bool,
    say: Callable[[str], None] | None = None,
) -> Readiness:
    """After the health answer: the engine alive, holding its port, and one 1-token completion
    answered (SPEC §6). Not ready: ``stranger`` set, or ``last_answer`` saying what failed.

    One completion at a time: each is waited for until the start's deadline (``timeout_s``
    from the start), and another is sent only after one failed (refused, 5xx, dropped) — never
    while one may still be in the engine. ``say`` is told what it waits on when the answer
    takes longer than ``SAY_WAITING_S``."""
    clock = time.monotonic
    start = clock() - ready.elapsed_s
    root = f"http://127.0.0.1:{record.port}"
    while True:
        if process.liveness(record) != "running":
            return replace(ready, ready=False, last_answer="its health answered; then it exited")
        who = stranger_on_port(record.port, record.pid) if own_socket else None
        if who is not None:
            return replace(ready, ready=False, stranger=who)
        sent = clock() - start
        left = max(1.0, timeout_s - sent)
        waiting = threading.Timer(
            SAY_WAITING_S,
            say or (lambda text: None),
            (
                f"waiting for the engine's first 1-token completion, sent {sent:.1f} s after "
                f"the start (one request: a cold engine compiles and warms up first), up to "
                f"{left:.0f} s more, to the start's deadline ([server] ready_timeout_s "
                f"{timeout_s:g})",
            ),
        )
        waiting.daemon = True
        waiting.start()
        try:
            answer = first_completion(root, api_key, left)
        finally:
            waiting.cancel()
        if answer.ok:
            note = answer.what if answer.what.startswith("it refused") else ""
            return Readiness(True, clock() - start, None, note)
        said = f"its health answered; it failed its first 1-token completion ({answer.what})"
        if answer.timed_out:
            said = (
                f"its health answered; its first 1-token completion, sent {sent:.1f} s after the "
                f"start, had no answer by the {timeout_s:g} s deadline"
            )
        if process.liveness(record) != "running" or clock() - start >= timeout_s:
            return replace(ready, ready=False, elapsed_s=clock() - start, last_answer=said)
        if answer.timed_out:  # its deadline was shorter than the start's: none is sent again
            return replace(ready, ready=False, elapsed_s=clock() - start, last_answer=said)
        time.sleep(POLL_S)
