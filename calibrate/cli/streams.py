"""The CLI's stdout and stderr: every line scrubbed of secrets, and never the reason a run dies.

``main`` wraps both streams for the length of one command:

- each write goes through ``redact.scrub`` (a key a server echoed, a base-URL password);
- a closed or broken stream (``2>&-``, ``2>&1 | head -2``) swallows what is written to it, so
  the stage still writes its results and its ledger line; a reader that left (``| head``) is
  its own choice, but stdout that could not take what was written (``> /dev/full``, a full
  disk) lost the result: ``delivered`` makes that command's exit 1 and says so;
- a stream that cannot encode a character (``PYTHONIOENCODING=ascii``) gets it backslash-escaped
  instead of raising ``UnicodeEncodeError`` (JSON results are written ASCII-only there).
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from calibrate.redact import scrub


class SafeStream:
    """A text stream that scrubs, survives being closed, and escapes what it cannot encode."""

    def __init__(self, stream: TextIO | None) -> None:
        self._stream = stream
        self.broken = stream is None
        self.lost: str | None = None  # why what was written could not be (not a reader gone)

    @property
    def encoding(self) -> str:
        return str(getattr(self._stream, "encoding", None) or "utf-8")

    def write(self, text: str) -> int:
        if self.broken or self._stream is None or not text:  # "" reaches /dev/full as ENOSPC
            return len(text)
        clean = scrub(text)
        try:
            try:
                self._stream.write(clean)
            except UnicodeEncodeError:
                self._stream.write(escaped(clean, self.encoding))
        except (OSError, ValueError) as exc:  # EPIPE, ENOSPC, or "I/O operation on closed file"
            self._break(exc)
        return len(text)

    def _break(self, exc: BaseException) -> None:
        """Stop writing; /dev/null takes the fd so Python's own flush at exit cannot fail."""
        if isinstance(exc, OSError) and exc.errno != errno.EPIPE:
            self.lost = exc.strerror or str(exc)  # a full disk, /dev/full: not the reader's doing
        self.broken = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            fd = self._stream.fileno() if self._stream is not None else -1
            if fd >= 0:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, fd)
                os.close(null)

    def flush(self) -> None:
        if self.broken or self._stream is None:
            return
        try:
            self._stream.flush()
        except (OSError, ValueError) as exc:
            self._break(exc)

    def isatty(self) -> bool:
        if self.broken or self._stream is None:
            return False
        try:
            return bool(self._stream.isatty())
        except (OSError, ValueError):
            return False

    def fileno(self) -> int:
        if self._stream is None:
            raise OSError("the stream is closed")
        return self._stream.fileno()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def delivered(code: int) -> int:
    """``code``, or 1 where it was 0 but what the command wrote to stdout (its --json result,
    its lines) could not be written there: a result that was lost is not a success."""
    out = sys.stdout
    out.flush()
    lost = out.lost if isinstance(out, SafeStream) else None
    if lost is None:
        return code
    print(
        f"error: the output to stdout could not be written ({lost}): the result is lost\n"
        "Send it where there is room (or to a file on another disk), then run it again.",
        file=sys.stderr,
    )
    return 1 if code == 0 else code


def escaped(text: str, encoding: str) -> str:
    """``text`` with what ``encoding`` cannot hold written as ``\\uXXXX``-style escapes."""
    try:
        return text.encode(encoding, "backslashreplace").decode(encoding, "replace")
    except LookupError:
        return text.encode("ascii", "backslashreplace").decode("ascii")


def can_encode(stream: Any, text: str) -> bool:
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        return False
    return True


def _open_standard_fds() -> None:
    """A closed fd 0, 1 or 2 gets /dev/null, so no file we open later takes its number (and
    no child writes its errors into, say, the ledger)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            with contextlib.suppress(OSError):
                opened = os.open(os.devnull, os.O_RDWR)
                if opened != fd:
                    os.dup2(opened, fd)
                    os.close(opened)


@contextlib.contextmanager
def safe_streams() -> Iterator[None]:
    """For one command: sys.stdout and sys.stderr wrapped (see the module docstring)."""
    _open_standard_fds()
    saved = sys.stdout, sys.stderr
    out = saved[0] if isinstance(saved[0], SafeStream) else SafeStream(saved[0])
    err = saved[1] if isinstance(saved[1], SafeStream) else SafeStream(saved[1])
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            out.flush()
            err.flush()
        sys.stdout, sys.stderr = saved
