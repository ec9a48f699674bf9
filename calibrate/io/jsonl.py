"""JSONL on disk: one compact UTF-8 line per record, appended and flushed, read back line by line.

Every byte calibrate writes is encoded here (``utf8``): secrets scrubbed, lone surrogates replaced.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

from calibrate import json_text
from calibrate.errors import InputError
from calibrate.io.bounded import (
    MAX_FILE_BYTES,
    TooLong,
    bounded_lines,
    is_regular,
    lines_or_skipped,
    mib,
    open_read,
)
from calibrate.redact import scrub

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


# json.dumps with options builds an encoder per call; one made once writes the same text
_LINE = json_text.encoder(separators=(",", ":"))


def dumps_line(obj: Any) -> str:
    """One compact JSON line, UTF-8 unescaped (``ensure_ascii=False``)."""
    return _LINE(obj)


def encode_line(obj: Any) -> bytes:
    """``dumps_line`` plus its newline as UTF-8; a lone surrogate becomes U+FFFD.

    A server can send ``"\\ud800"`` (legal JSON escape, not encodable text): replacing it keeps
    every file we write valid UTF-8 instead of failing the write (and losing the record). The
    replacement is made in the values (``json_safe``), so a ``\\xNN`` stays valid JSON.
    """
    try:
        return scrub(dumps_line(obj) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        return utf8(dumps_line(json_safe(obj)) + "\n")


def json_safe(obj: Any) -> Any:
    """``obj`` with every text in it (keys too) passed through ``without_surrogates``."""
    if isinstance(obj, str):
        return without_surrogates(obj)
    if isinstance(obj, dict):
        return {json_safe(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def utf8(text: str) -> bytes:
    """``text`` as UTF-8, lone surrogates replaced by U+FFFD (never an encoding error).

    Every file calibrate writes passes here: the command's secrets are scrubbed from it."""
    text = scrub(text)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return without_surrogates(text).encode("utf-8")


def without_surrogates(text: str) -> str:
    """``text`` printable and encodable: a byte that was not UTF-8 in a path or an argv word
    (Python's surrogate escape, U+DC80–U+DCFF) as ``\\xNN`` — a GBK file name stays legible
    and tells its bytes, where U+FFFD would tell nothing — and any other lone surrogate as U+FFFD."""
    return _LONE_SURROGATE.sub(_shown, text)


def _shown(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else "\ufffd"


def append_jsonl(path: Path, obj: Any) -> None:
    """Append one line and flush; for files written rarely (the ledger).

    A torn last line (a crash mid-write) is ended first, under an exclusive ``flock``: the new
    record starts a line of its own instead of being glued to the torn one and lost with it. A
    write the disk cuts short is taken back (``append_whole``).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        data = encode_line(obj)
        if not ends_with_newline(fd):
            data = b"\n" + data
        append_whole(fd, data, path, fsync=False)
    except OSError as exc:  # a full disk's error names no file: this one
        exc.filename = exc.filename or str(path)
        raise
    finally:
        os.close(fd)  # the lock goes with it


def append_whole(fd: int, data: bytes, path: Path, *, fsync: bool) -> None:
    """``data`` appended whole, or not at all: a short write (a disk nearly full) is continued;
    one that ends in an error (or an fsync that fails) cuts the file back to where it ended
    before, so no torn record is left for the next reader or the next append to trip on."""
    start = os.fstat(fd).st_size
    rest = memoryview(data)
    try:
        while rest:
            written = os.write(fd, rest)
            if not written:
                raise OSError(errno.EIO, "the write made no progress", str(path))
            rest = rest[written:]
        if fsync:
            os.fsync(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):  # shrinking a file needs no room
            os.ftruncate(fd, start)
        exc.filename = exc.filename or str(path)
        raise


def ends_with_newline(fd: int) -> bool:
    """Whether the file is empty or its last byte is a newline (the next append starts a line)."""
    size = os.fstat(fd).st_size
    return size == 0 or os.pread(fd, 1, size - 1) == b"\n"


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Objects of a JSONL file; a torn (unparseable) or over-long line is skipped, read in
    bounded pieces; a path that is not a regular file (a device, a FIFO) is an InputError."""
    if not is_regular(path):
        raise InputError(
            f"{path} is not a regular file (a device, FIFO or folder)",
            "Remove it, or give the file calibrate wrote.",
        )
    with path.open("rb") as handle:
        for _, raw in lines_or_skipped(handle):  # binary lines end at b"\n" only
            if raw is None or not raw.strip():
                continue
            try:
                obj = json_text.loads(raw)
            except ValueError:  # torn, or not UTF-8 (UnicodeDecodeError is a ValueError)
                continue
            if isinstance(obj, dict):
                yield obj


def load_jsonl_objects(path: Path, what: str = "file") -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every line of a small JSONL file a user handed us.

    Unlike ``read_jsonl`` nothing is skipped: a line that is not a JSON object is an input
    error naming the file and line (exit 2), and so is an empty file. Read with the bounds: a
    line over 32 MiB, or more than ``MAX_SMALL_BYTES`` in all, is exit 2 (read no further).
    """
    out: list[tuple[int, dict[str, Any]]] = []
    total = 0
    with open_read(path, what) as handle:
        for number, raw in _small_lines(handle, path, what):
            total += len(raw)
            if total > MAX_SMALL_BYTES:
                raise TooLong(
                    f"{what} {path} is over {mib(MAX_SMALL_BYTES)}: read no further",
                    "Give a smaller file (or the file calibrate wrote).",
                )
            out.append((number, _object(raw, path, number, what)))
    if not out:
        raise InputError(f"{what} {path} holds no records")
    return out


MAX_SMALL_BYTES = 8 * MAX_FILE_BYTES  # a file of records a user hands to repro or report


def _small_lines(handle: BinaryIO, path: Path, what: str) -> Iterator[tuple[int, bytes]]:
    try:
        for number, raw in bounded_lines(handle, path):
            if number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # an editor's byte-order mark
            if raw.strip():
                yield number, raw
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc


def _object(raw: bytes, path: Path, number: int, what: str) -> dict[str, Any]:
    """One line of a file ``load_jsonl_objects`` reads, as an object (else exit 2)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read {what} {path}: line {number} is not UTF-8") from exc
    try:
        obj = json_text.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{number} is not JSON ({exc.msg})") from exc
    if not isinstance(obj, dict):
        raise InputError(f"{path}:{number} is not a JSON object")
    return obj


class JsonlWriter:
    """An append-only JSONL file kept open; every record is flushed (and fsynced if asked)."""

    def __init__(self, path: Path, *, fsync: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fsync = fsync
        self._handle: BinaryIO = path.open("a+b", buffering=0)
        if not ends_with_newline(self._handle.fileno()):  # a torn tail: never glue onto it
            self._handle.write(b"\n")

    def write(self, obj: Any) -> None:
        """Append one record as one write; raises OSError (disk full…) with nothing of it left
        in the file. Content never fails the write: see ``encode_line``."""
        self._append(encode_line(obj))

    def write_many(self, objs: Sequence[Any]) -> None:
        """Append several records as one write (one fsync): a batch journal's group commit."""
        self._append(b"".join(encode_line(obj) for obj in objs))

    def _append(self, raw: bytes) -> None:
        append_whole(self._handle.fileno(), raw, self.path, fsync=self.fsync)

    def close(self) -> None:
        self._handle.close()

    def close_quietly(self) -> None:
        """Close after a failed write: a second error here would say nothing new."""
        with contextlib.suppress(OSError):
            self._handle.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
