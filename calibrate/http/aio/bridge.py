"""The asyncio transport's one event-loop thread per process, and the hand-offs to and from it.

The load engine (``calibrate.load.engine``) runs on this loop, every stage's load and every
batch item with it; a caller of the client's synchronous calls (a probe, a canary, readiness)
hands its request to the loop and waits for the whole answer. The loop does every socket read
and write and stamps streamed lines with the client's clock as they arrive; streamed and large
answers are parsed off it, on one parser thread (``LoopThread.parse``), so a parse never
delays another stream's stamps (a small whole answer is parsed on the loop: its parse costs
less than the hand-off). One thread doing the I/O for every request costs a third of the CPU
per request that a thread per request did (``make bench``). uvloop is used where importable.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

from calibrate.errors import RequestError
from calibrate.http.aio.connection import Call, Connections, Origin
from calibrate.http.aio.wire import Answer
from calibrate.http.error_kinds import http_error, redirect_error, request_error

GRACE_S = 5.0  # past a request's own deadline, how long a caller waits on a stuck loop
INLINE_BYTES = 16 * 1024  # a whole (not streamed) answer this small is parsed on the loop


T = TypeVar("T")


class _Job:
    """One request handed to the loop: the caller waits on ``done`` (held until it is over)."""

    __slots__ = ("answer", "call", "connections", "done", "error", "task")

    def __init__(self, connections: Connections, call: Call) -> None:
        self.connections = connections
        self.call = call
        self.done = threading.Lock()
        self.done.acquire()
        self.answer: Answer | None = None
        self.error: BaseException | None = None
        self.task: asyncio.Task[None] | None = None


class LoopThread:
    """An event loop in a daemon thread, and the cheapest hand-off to it: jobs go on a deque and
    the loop is woken only when it is not already about to drain it (one self-pipe write per
    burst, not per request); each caller then sleeps on its own lock, released by the loop."""

    def __init__(self) -> None:
        try:
            import uvloop
        except ImportError:
            self.loop = asyncio.new_event_loop()
        else:
            self.loop = uvloop.new_event_loop()
        self._jobs: collections.deque[_Job] = collections.deque()
        self._woken = False
        self._parses: SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]] | None] = (
            SimpleQueue()
        )
        self._parsed: collections.deque[tuple[asyncio.Future[Any], Any, BaseException | None]]
        self._parsed = collections.deque()
        self._parsed_woken = False
        self._parser: threading.Thread | None = None
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(started.set)
            self.loop.run_forever()

        threading.Thread(target=run, name="calibrate-io", daemon=True).start()
        started.wait()

    def _hand(self, job: _Job) -> None:
        self._jobs.append(job)
        if not self._woken:
            self._woken = True
            self.loop.call_soon_threadsafe(self._drain)

    def run(self, connections: Connections, call: Call) -> Answer:
        job = _Job(connections, call)
        self._hand(job)
        try:
            finished = job.done.acquire(timeout=call.left_s + GRACE_S)
        except BaseException:  # interrupted (Ctrl-C in the main thread): stop the request
            self.loop.call_soon_threadsafe(self._cancel, job)
            raise
        if not finished:
            self.loop.call_soon_threadsafe(self._cancel, job)
            raise request_error(
                "timeout", f"no answer from {call.url} (the I/O loop is stuck)", None
            )
        if job.error is not None:
            raise job.error
        assert job.answer is not None
        return job.answer

    def _drain(self) -> None:
        self._woken = False  # first: a job added from now on wakes the loop again
        jobs = self._jobs
        while jobs:
            job = jobs.popleft()
            job.task = self.loop.create_task(self._serve(job))

    @staticmethod
    async def _serve(job: _Job) -> None:
        try:
            job.answer = await job.connections.exchange(job.call)
        except BaseException as exc:  # handed to the caller's thread, raised there
            job.error = exc
        finally:
            job.done.release()

    @staticmethod
    def _cancel(job: _Job) -> None:
        if job.task is not None:
            job.task.cancel()

    def parse(self, work: Callable[[], T]) -> asyncio.Future[T]:
        """``work()`` run on the parser thread (called on the loop); its result, or what it
        raised, comes back to the loop — one wake-up per burst of answers, not per answer."""
        if self._parser is None:
            self._parser = threading.Thread(target=self._parse, name="calibrate-parse", daemon=True)
            self._parser.start()
        future: asyncio.Future[T] = self.loop.create_future()
        self._parses.put((work, future))
        return future

    def _parse(self) -> None:
        while (job := self._parses.get()) is not None:
            work, future = job
            try:
                self._parsed.append((future, work(), None))
            except BaseException as exc:  # handed to the awaiting coroutine, raised there
                self._parsed.append((future, None, exc))
            if not self._parsed_woken:
                self._parsed_woken = True
                self.loop.call_soon_threadsafe(self._hand_back)

    def _hand_back(self) -> None:
        self._parsed_woken = False  # first: a result added from now on wakes the loop again
        parsed = self._parsed
        while parsed:
            future, value, failure = parsed.popleft()
            if future.cancelled():
                continue
            if failure is not None:
                future.set_exception(failure)
            else:
                future.set_result(value)


_lock = threading.Lock()
_shared: LoopThread | None = None


_forks = 0  # forks this process came through: a transport made before one holds its parent's


def _forget_after_fork() -> None:
    """A forked child has no loop thread (only the thread that forked survives): it starts its
    own on first use, and the parent's connections are not shared with it."""
    global _shared, _lock, _forks
    _shared, _lock = None, threading.Lock()
    _forks += 1


os.register_at_fork(after_in_child=_forget_after_fork)


def shared_loop() -> LoopThread:
    """The process's I/O loop, started on first use."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = LoopThread()
        return _shared


class AioTransport:
    """Requests of one client sent on the shared loop; its own pool of connections there."""

    def __init__(
        self,
        *,
        connect_timeout_s: float,
        max_bytes: int,
        max_connections: int,
        clock: Callable[[], float],
    ):
        self.connect_timeout_s = connect_timeout_s
        self.max_bytes = max_bytes
        self._clock = clock
        self._pid = os.getpid()
        self._forks = _forks  # compared on each call: os.getpid() is a system call
        self._max_idle = max_connections
        self._connections = Connections(max_connections)

    def call(
        self,
        method: str,
        origin: Origin,
        url: str,
        target: str,
        deadline: float,
        *,
        body: bytes,
        headers: dict[str, str],
        lines: bool,
        timeout_s: float,
    ) -> Call:
        """One request, as bytes, to be sent before ``deadline`` (a clock time)."""
        left_s = deadline - self._clock()
        if left_s <= 0:
            raise request_error("timeout", f"no answer from {url} within {timeout_s:g} s", None)
        if self._forks != _forks:  # forked: the parent's connections stay the parent's
            self._forks, self._pid = _forks, os.getpid()
            self._connections = Connections(self._max_idle)
        return Call(
            origin=origin,
            url=url,
            payload=_request_bytes(method, origin, target, headers, body),
            left_s=left_s,
            timeout_s=timeout_s,
            connect_timeout_s=self.connect_timeout_s,
            max_bytes=self.max_bytes,
            lines=lines,
            clock=self._clock,
        )

    def exchange(self, call: Call) -> Answer:
        """Send ``call`` and wait for its whole answer, all before its deadline; a redirect or
        an error status is raised as its error kind (SPEC §5.5)."""
        return checked((_shared or shared_loop()).run(self._connections, call), call.url)

    async def answer(self, call: Call, read: Callable[[Answer], T]) -> T:
        """``call`` sent from a coroutine on the shared loop (the load engine's), its answer
        ``read`` (parsed) on the parser thread: the loop only sends, reads and stamps. A whole
        answer of at most ``INLINE_BYTES`` that streamed no lines is read here: its parse
        (~5 µs for a chat answer) costs the loop less than handing it to the parser thread
        and back, and holds no stream's stamps back longer than a socket read does."""
        answer = await self._connections.exchange(call)
        if not answer.want_lines and answer.size <= INLINE_BYTES:
            return read(answer)
        return await (_shared or shared_loop()).parse(lambda: read(answer))

    def close(self) -> None:
        if _shared is not None and self._pid == os.getpid():
            _shared.loop.call_soon_threadsafe(self._connections.close)


def checked(answer: Answer, url: str) -> Answer:
    """The answer, or its redirect or error status raised as its error kind (SPEC §5.5)."""
    if 300 <= answer.status < 400:  # never followed: a key would go wherever it points
        raise RequestError(redirect_error(answer.status, url, answer.headers))
    if answer.status >= 400:
        text = answer.body().decode("utf-8", "replace")
        raise RequestError(http_error(answer.status, text, answer.headers))
    return answer


def _request_bytes(
    method: str, origin: Origin, target: str, headers: dict[str, str], body: bytes
) -> bytes:
    head = _head(method, origin, target, tuple(headers.items()))
    if body or method == "POST":
        return b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)
    return head + b"\r\n"


@functools.lru_cache(maxsize=64)
def _head(method: str, origin: Origin, target: str, headers: tuple[tuple[str, str], ...]) -> bytes:
    """The request line and headers up to Content-Length, each line ended: the same for every
    completion a client sends (made once, not per request)."""
    scheme, host, port = origin
    default = {"http": 80, "https": 443}.get(scheme)
    host_header = host if port == default else f"{host}:{port}"
    if ":" in host and not host.startswith("["):  # an IPv6 literal
        host_header = f"[{host}]" if port == default else f"[{host}]:{port}"
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header}"]
    for name, value in headers:
        if "\r" in value or "\n" in value:
            raise ValueError(f"a line break in the value of the {name} header")
        lines.append(f"{name}: {value}")
    lines.append("Accept-Encoding: identity")
    return ("\r\n".join(lines) + "\r\n").encode("latin-1")
