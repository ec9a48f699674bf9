"""The engine's output on its way to ``runs/server.log``, without the secrets it was given.

Engines print their own arguments (vLLM logs ``api_key='…'`` at start-up). When the engine's
command holds a secret, its supervisor reads the engine's output through a pipe and writes
each line here with every secret value (and any ``--api-key X`` / ``HF_TOKEN=X``) masked.
(The supervisor outlives the engine — it ignores SIGINT, SIGTERM and SIGHUP — so the pipe stays
open for as long as the engine writes.) ``open_log`` opens the log for a start, or says why not.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from calibrate.engines.redaction import MASK, redact_text
from calibrate.errors import UsageError
from calibrate.io.output_paths import kind_of

CHUNK = 65536
MIN_CHARS = 4
MAX_PENDING = 1 << 20  # a "line" longer than this is written as it is cut


class LogFilter:
    """Masks the given secrets, longest first, and key-like flags in one line of output."""

    def __init__(self, secrets: Sequence[str]) -> None:
        # a very short value ("-k ab") is masked only after its flag, not as every "ab"
        found = {s for s in secrets if len(s) >= MIN_CHARS}
        self.secrets = tuple(sorted(found, key=len, reverse=True))

    def __call__(self, data: bytes) -> bytes:
        text = data.decode("utf-8", errors="surrogateescape")
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        return redact_text(text).encode("utf-8", errors="surrogateescape")


def copy(fd: int, out: BinaryIO, clean: LogFilter) -> None:
    """Copy ``fd`` to ``out`` until EOF, one whole line (ending in \\n or \\r) at a time."""
    pending = b""
    while True:
        try:
            chunk = os.read(fd, CHUNK)
        except OSError:
            chunk = b""
        if not chunk:
            break
        pending += chunk
        cut = max(pending.rfind(b"\n"), pending.rfind(b"\r"))
        if cut < 0 and len(pending) < MAX_PENDING:
            continue
        end = cut + 1 if cut >= 0 else len(pending)
        _write(out, clean(pending[:end]))
        pending = pending[end:]
    if pending:
        _write(out, clean(pending))


def _write(out: BinaryIO, data: bytes) -> None:
    try:
        out.write(data)
        out.flush()
    except OSError:
        pass


def open_log(path: Path, header: str) -> BinaryIO:
    """runs/server.log opened to append, ``header`` written; a log that cannot be — a folder, a
    FIFO, a device (a link to /dev/full), a full disk — is exit 2 naming it, nothing started."""
    where = "Remove it, or point [paths] runs elsewhere; nothing was started."
    with contextlib.suppress(OSError):  # absent: made below
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):  # a FIFO would block the open; a device takes the log away
            raise UsageError(
                f"the engine's log {path} is {kind_of(mode)}, not a regular file", where
            )
    handle: BinaryIO | None = None
    new = not path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("ab")
        handle.write(header.encode())
        handle.flush()
    except OSError as exc:
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()
        if new:  # nothing of it is left behind
            with contextlib.suppress(OSError):
                path.unlink()
        raise UsageError(
            f"cannot write the engine's log {path}: {exc.strerror or exc}; nothing was started",
            "Make it a writable file (free space there, fix its permissions), or point "
            "[paths] runs elsewhere.",
        ) from exc
    return handle
