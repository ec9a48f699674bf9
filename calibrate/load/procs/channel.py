"""One direction of a pipe between calibrate's own processes: length-prefixed pickles.

Both ends are calibrate's own code, the parent having started the child, so pickle is safe
here. A frame cut short (the writer was killed mid-write) reads as the end of the stream:
nothing in it is used. ``batch --workers`` and the load engine's workers speak it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import IO, Any

_HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 30  # a longer length prefix is a corrupt stream, not a message
MAX_GROUP = 256  # an outbox's messages sent in one frame


class Channel:
    """One direction of a pipe: ``send`` is safe from several threads, ``receive`` from one."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, message: Any) -> bool:
        """Write one message; False when the other end is gone."""
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        try:
            with self._lock:
                self._stream.write(_HEADER.pack(len(data)) + data)
                self._stream.flush()
        except (OSError, ValueError):  # a broken pipe, or a stream closed meanwhile
            return False
        return True

    def receive(self) -> Any | None:
        """The next message; None at the end of the stream (or a frame cut short)."""
        try:
            head = self._stream.read(_HEADER.size)
            if head is None or len(head) < _HEADER.size:
                return None
            (size,) = _HEADER.unpack(head)
            if size > MAX_FRAME:
                return None
            body = self._stream.read(size)
        except (OSError, ValueError):
            return None
        if body is None or len(body) < size:
            return None
        return pickle.loads(body)

    def close(self) -> None:
        """Close the stream (a send racing with it is refused: False, as for a dead peer)."""
        with self._lock, contextlib.suppress(OSError):
            self._stream.close()


class Outbox:
    """A worker's messages to its parent, sent in groups by one thread (a write per request or
    line would cost a system call each and starve the worker); ``close`` ends it after what is
    queued. The parent gone, nothing the worker does can be recorded: the process ends."""

    def __init__(self, channel: Channel, name: str) -> None:
        self._channel = channel
        self._queue: SimpleQueue[tuple[Any, ...] | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, *message: Any) -> None:
        self._queue.put(message)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            group = [self._queue.get()]
            while len(group) < MAX_GROUP:
                try:
                    group.append(self._queue.get_nowait())
                except Empty:
                    break
            messages = [m for m in group if m is not None]
            if messages and not self._channel.send(messages):
                os._exit(0)  # the parent is gone
            if None in group:
                return


def spawn_worker(module: str) -> tuple[subprocess.Popen[bytes], Channel, Channel]:
    """``python -m module`` as a worker of this process: (its process, the channel to it, the
    channel from it). This checkout's calibrate comes first on its path; whatever it needs to
    know (the API key too) goes over the channel, never argv, the environment or a file."""
    import calibrate  # the package's own folder, wherever this process imported it from

    env = dict(os.environ)
    root = str(Path(calibrate.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    popen = subprocess.Popen(
        [sys.executable, "-m", module],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        close_fds=True,
    )
    assert popen.stdin is not None and popen.stdout is not None
    return popen, Channel(popen.stdin), Channel(popen.stdout)


def worker_pipes(label: str) -> tuple[Channel, Channel]:
    """A worker's own ends of its pipes: (from the parent, to the parent). Ctrl-C and SIGHUP are
    the parent's to handle (it ends its workers); a stray print goes to stderr, never into the
    pipe; the worker's log lines are labelled ``label``."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    logging.basicConfig(level=logging.ERROR, format=f"{label}: %(message)s")
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return Channel(sys.stdin.buffer), Channel(out)


def listen(inbox: Channel, handle: Callable[[Any], None]) -> None:
    """A worker's listener thread: each of the parent's messages to ``handle``; the end of the
    pipe (the parent is done, or died: kill -9) ends the process at once — no orphan, and
    nobody left to send to."""

    def run() -> None:
        while (message := inbox.receive()) is not None:
            handle(message)
        os._exit(0)

    threading.Thread(target=run, name="worker-inbox", daemon=True).start()
