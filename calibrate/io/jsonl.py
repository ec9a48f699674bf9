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
from calibrate.redact import scrub

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps_line(obj: Any) -> str:
    """One compact JSON line, UTF-8 unescaped (``ensure_ascii=False``)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def encode_line(obj: Any) -> bytes:
    """``dumps_line`` plus its newline as UTF-8; a lone surrogate becomes U+FFFD.

    A server can send ``"\\ud800"`` (legal JSON escape, not encodable text): replacing it keeps
    every file we write valid UTF-8 instead of failing the write (and losing the record).
    """
    return utf8(dumps_line(obj) + "\n")


def utf8(text: str) -> bytes:
    """``text`` as UTF-8, lone surrogates replaced by U+FFFD (never an encoding error).

    Every file calibrate writes passes here: the command's secrets are scrubbed from it."""
    text = scrub(text)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return without_surrogates(text).encode("utf-8")


def without_surrogates(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD: printable and encodable."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def jsonl_lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of JSONL bytes, split on ``\\n`` only.

    Never ``str.splitlines``: it also breaks at U+2028, U+0085 and other characters that JSON
    carries unescaped inside strings, tearing one record into two unreadable halves.
    """
    yield from enumerate(data.split(b"\n"), 1)


def append_jsonl(path: Path, obj: Any) -> None:
    """Append one line and flush; for files written rarely (the ledger).

    A torn last line (a crash or a full disk mid-write) is ended first, under an exclusive
    ``flock``: the new record starts a line of its own instead of being glued to the torn one
    and lost with it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with path.open("a+b") as handle:  # readable too: its last byte is looked at
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                data = encode_line(obj)
                if not ends_with_newline(handle.fileno()):
                    data = b"\n" + data
                handle.write(data)
                handle.flush()
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    except OSError as exc:  # a full disk's error names no file: this one
        exc.filename = exc.filename or str(path)
        raise


def ends_with_newline(fd: int) -> bool:
    """Whether the file is empty or its last byte is a newline (the next append starts a line)."""
    size = os.fstat(fd).st_size
    return size == 0 or os.pread(fd, 1, size - 1) == b"\n"


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Objects of a JSONL file; a torn (unparseable) line is skipped."""
    with path.open("rb") as handle:
        for raw in handle:  # binary lines end at b"\n" only
            if not raw.strip():
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
    error naming the file and line (exit 2), and so is an empty file.
    """
    try:
        data = path.read_bytes().removeprefix(b"\xef\xbb\xbf")  # an editor's byte-order mark
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc}") from exc
    out: list[tuple[int, dict[str, Any]]] = []
    for number, raw in jsonl_lines(data):
        if not raw.strip():
            continue
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
        out.append((number, obj))
    if not out:
        raise InputError(f"{what} {path} holds no records")
    return out


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
        """Append one record as one write; raises OSError (disk full…) with nothing half-done
        on our side. Content never fails the write: see ``encode_line``."""
        self._append(encode_line(obj))

    def write_many(self, objs: Sequence[Any]) -> None:
        """Append several records as one write (one fsync): a batch journal's group commit."""
        self._append(b"".join(encode_line(obj) for obj in objs))

    def _append(self, raw: bytes) -> None:
        data = memoryview(raw)
        try:
            while data:  # a short write (disk nearly full) is continued, or ends in OSError
                written = self._handle.write(data)
                if not written:
                    raise OSError(errno.EIO, "the write made no progress", str(self.path))
                data = data[written:]
            if self.fsync:
                os.fsync(self._handle.fileno())
        except OSError as exc:  # a full disk's error names no file: this one
            exc.filename = exc.filename or str(self.path)
            raise

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
