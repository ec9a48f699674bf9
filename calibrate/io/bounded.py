"""Every read of a file, pipe or device: bounded while it is read (docs/guarantees.md).

A line is at most ``MAX_LINE_BYTES`` (32 MiB): a longer one is an InputError (exit 2) naming the
file and the line, and nothing after it is read. A file read whole (a summary, a manifest, a
table, a record) is at most ``MAX_FILE_BYTES``, read with that bound, never whole first. A pipe
or device that must be read twice (``--input <(…)``, ``/dev/stdin``) is copied once, line by
line under the same bound, into an unnamed temporary file: it has no name in ``$TMPDIR``, so
it disappears with the process — after an error, Ctrl-C or kill -9 alike.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from calibrate.errors import InputError

MAX_LINE_BYTES = 32 * 1024 * 1024  # one item or record; millions of tokens. Longer is no JSONL
MAX_FILE_BYTES = 32 * 1024 * 1024  # one file read whole: calibrate writes none this large
COPY_BYTES = 1024 * 1024
CHUNK_BYTES = 64 * 1024  # a read of a file whose size is not known (/proc's say 0)


def mib(size: int) -> str:
    return f"{size / (1024 * 1024):g} MiB"


class TooLong(InputError):
    """A line or file past its bound (exit 2): read no further."""


def open_read(path: Path, what: str, hint: str | None = None) -> BinaryIO:
    """``path`` opened for reading; an InputError naming ``what`` when it cannot be."""
    try:
        return path.open("rb")
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}", hint) from exc


RULE = "a JSONL file has one JSON record per line"
HINT = "Write one record per line (a JSON array or another format is not JSONL)."


def bounded_lines(
    handle: BinaryIO, name: object, *, rule: str = RULE, hint: str = HINT
) -> Iterator[tuple[int, bytes]]:
    """(line number, line with its newline) of ``handle``, each read with the bound: a line
    longer than ``MAX_LINE_BYTES`` is ``TooLong`` naming ``name`` and the line."""
    number = 0
    while raw := handle.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            raise TooLong(
                f"{name} line {number}: longer than {mib(MAX_LINE_BYTES)} without a newline; "
                f"{rule}",
                hint,
            )
        yield number, raw


def lines_or_skipped(handle: BinaryIO) -> Iterator[tuple[int, bytes | None]]:
    """(line number, line) like ``bounded_lines``, for files whose bad lines are skipped (the
    ledger, records): an over-long line is ``None``, passed over in bounded pieces."""
    number = 0
    while raw := handle.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            while (rest := handle.readline(COPY_BYTES)) and not rest.endswith(b"\n"):
                pass
            yield number, None
            continue
        yield number, raw


def read_bounded(path: Path | str, *, limit: int = MAX_FILE_BYTES) -> bytes:
    """The whole of ``path``, read with a bound: ``TooLong`` past ``limit`` bytes (what was read
    is dropped); OSError as ``open`` raises it (a caller may treat missing as empty).

    Read in pieces the size the file says it has (a file of /proc says 0: ``CHUNK_BYTES``), never
    one buffer of ``limit`` bytes: a 300-byte file read into 32 MiB allocated and dropped took
    49 µs against 16 µs — and the noise meter reads every process's ``stat`` each sample."""
    parts: list[bytes] = []
    size = 0
    with open(path, "rb", buffering=0) as handle:  # each read one system call, no buffer copy
        want = os.fstat(handle.fileno()).st_size + 1
        while size <= limit:
            piece = handle.read(min(limit + 1 - size, max(want, CHUNK_BYTES)))
            if not piece:
                break
            parts.append(piece)
            size += len(piece)
            want = CHUNK_BYTES
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if len(data) > limit:
        raise TooLong(
            f"{path} is over {mib(limit)}: not a file calibrate wrote (or a device)",
            "Remove it, or give the file calibrate wrote.",
        )
    return data


def read_text(path: Path, *, limit: int = MAX_FILE_BYTES) -> str:
    """``read_bounded`` decoded as UTF-8 (UnicodeDecodeError is a ValueError)."""
    return read_bounded(path, limit=limit).decode("utf-8")


def read_tail(path: Path, limit: int, offset: int = 0) -> bytes:
    """At most the last ``limit`` bytes of ``path`` from ``offset`` on (a log's tail)."""
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        handle.seek(max(offset, size - limit, 0))
        return handle.read(limit)


Stamp = tuple[int, int, int, int]  # device, inode, size, modification time (ns)


def stamp(path: Path) -> Stamp | None:
    """What tells a regular file's content changed (or was replaced); None for anything else."""
    try:
        found = path.stat()
    except OSError:
        return None
    if not stat.S_ISREG(found.st_mode):
        return None
    return found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns


def stamp_change(before: Stamp, after: Stamp | None) -> str | None:
    """How a file changed between two stamps, in words; None when it did not."""
    if after is None:
        return "it is gone"
    if before[:2] != after[:2]:
        return "it was replaced"
    if before[2] != after[2]:
        return f"its size went from {before[2]:,} to {after[2]:,} bytes"
    if before[3] != after[3]:
        return "it was rewritten"
    return None


def is_regular(path: Path) -> bool:
    """Whether ``path`` is a regular file (links followed); True when it cannot be looked at,
    so that opening it says what is wrong."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return True


@contextmanager
def readable_twice(path: Path, what: str, *, rule: str = RULE, hint: str = HINT) -> Iterator[Path]:
    """``path`` itself when it is a regular file, else an unnamed copy of it, line by line
    under the bound (exit 2 at an over-long line, having read no further)."""
    if is_regular(path):
        yield path
        return
    with _unnamed() as (copy, copy_path):
        with open_read(path, what, hint) as source:
            try:
                for _, raw in bounded_lines(source, path, rule=rule, hint=hint):
                    copy.write(raw)
                copy.flush()
            except OSError as exc:
                raise InputError(
                    f"cannot copy {what} {path} (a pipe or device, read once) to a temporary "
                    f"file in {tempfile.gettempdir()}: {exc.strerror or exc}",
                    "Free space there (or point TMPDIR elsewhere), or give a regular file.",
                ) from exc
        yield copy_path


@contextmanager
def _unnamed() -> Iterator[tuple[BinaryIO, Path]]:
    """A temporary file with no name left in ``$TMPDIR`` (Linux: readable again through
    ``/proc/self/fd``); elsewhere a named one, removed when done."""
    with tempfile.TemporaryFile(prefix="calibrate-input-", suffix=".jsonl") as handle:
        again = Path(f"/proc/self/fd/{handle.fileno()}")
        if again.exists():
            yield handle, again
            return
    fd, name = tempfile.mkstemp(prefix="calibrate-input-", suffix=".jsonl")
    try:
        with os.fdopen(fd, "w+b") as named:
            yield named, Path(name)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)
