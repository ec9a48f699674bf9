"""What the parent and a worker process say to each other: length-prefixed pickles on a pipe.

Both ends are this package's own code, started by the parent, so pickle is safe here. A frame
cut short (the writer was killed mid-write) reads as the end of the stream: nothing in it is
used, and its items run again.
"""

from __future__ import annotations

import contextlib
import pickle
import struct
import threading
from dataclasses import dataclass
from typing import IO, Any

from calibrate.gpu.selfload import SelfLoadReport
from calibrate.stages.batch.lanes import ClientSetup
from calibrate.stages.batch.outage import OutagePolicy
from calibrate.stages.batch.plan import BatchSpec
from calibrate.state.setting import Endpoint

_HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 30  # a longer length prefix is a corrupt stream, not a message


@dataclass(frozen=True)
class WorkerSetup:
    """The first message to a worker: its share of each endpoint's slots and the run's spec."""

    index: int
    endpoints: tuple[Endpoint, ...]  # its own share: concurrency already split
    client: ClientSetup  # how it builds its clients
    spec: BatchSpec
    outage: OutagePolicy
    advice: str  # the self-check's advice when this worker is the bottleneck
    cpu_limit: float = 0.85  # the self-check's threshold (a test sets 0: every window is bound)


@dataclass(frozen=True)
class LaneStats:
    """What one worker's breaker saw of one endpoint (merged into the summary)."""

    label: str
    state: str
    incidents: int
    down_total_s: float
    restarts: int


@dataclass(frozen=True)
class WorkerDone:
    """A worker's last message: every item it took has been answered or left."""

    selfload: SelfLoadReport
    lanes: tuple[LaneStats, ...]


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
