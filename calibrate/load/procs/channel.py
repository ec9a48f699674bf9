"""One direction of a pipe between calibrate's own processes: length-prefixed pickles.

Both ends are calibrate's own code, the parent having started the child, so pickle is safe
here. A frame cut short (the writer was killed mid-write) reads as the end of the stream:
nothing in it is used. ``batch --workers`` and the load engine's workers speak it.
"""

from __future__ import annotations

import contextlib
import pickle
import struct
import threading
from typing import IO, Any

_HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 30  # a longer length prefix is a corrupt stream, not a message


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
