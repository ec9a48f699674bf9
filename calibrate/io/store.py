"""Run folders and files: JSONL appended and flushed per record, summaries written atomically.

Paths come from pure functions so every run is a self-describing folder (SPEC §4).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

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


def new_run_id(stage: str, now: dt.datetime | None = None) -> str:
    """``20261129T164129Z-ladder-a1b2c3``."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{stage}-{secrets.token_hex(3)}"


def run_path(runs_dir: Path, run_id: str) -> Path:
    return runs_dir / run_id


def ledger_path(runs_dir: Path) -> Path:
    return runs_dir / "ledger.jsonl"


def file_mode() -> int:
    """The mode a new file gets here: 0666 less the umask (what ``open`` would give it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc: read it by setting it (and put it back at once)
    os.umask(mask)
    return 0o666 & ~mask


def refuse_special(path: Path) -> None:
    """Raise InputError (exit 2) if ``path`` exists and is not a regular file (links followed):
    a rename onto it would replace a device, a FIFO or a folder."""
    try:
        found = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(found.st_mode):
        raise InputError(
            f"{path} exists and is not a regular file (a device, FIFO or folder): "
            "writing it would replace it",
            "Give a path for a new or regular file.",
        )


def temp_beside(path: Path) -> tuple[int, Path]:
    """A new temp file beside ``path`` (``.NAME.PID.XXXX``), mode 0666 less the umask.

    The PID in the name lets a later run tell a temp file left by a dead process (kill -9)
    from one still being written: see ``remove_stale_temps``.
    """
    refuse_special(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", dir=path.parent)
    with contextlib.suppress(OSError):  # a file system without modes: mkstemp's 0600 stays
        os.fchmod(fd, file_mode())
    return fd, Path(tmp)


def remove_stale_temps(path: Path, *, own: bool = False) -> int:
    """Remove the temp files of ``temp_beside(path)`` whose writer is dead (``own``: ours,
    after an interruption, wherever it struck); how many."""
    removed = 0
    prefix = f".{path.name}."
    try:
        names = os.listdir(path.parent)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(prefix):
            continue
        pid_text = name[len(prefix) :].split(".", 1)[0]
        if not pid_text.isdigit():
            continue
        mine = int(pid_text) == os.getpid()
        if mine != own or (not mine and _alive(int(pid_text))):
            continue
        with contextlib.suppress(OSError):
            (path.parent / name).unlink()
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process (or no such number): leave its file alone
    return True


def write_atomic(path: Path, text: str) -> None:
    """Write to a temp file beside ``path`` and rename it into place (never onto a device)."""
    fd, tmp = temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(utf8(text))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, ensure_ascii=False, indent=2, sort_keys=True) + "\n")


def append_jsonl(path: Path, obj: Any) -> None:
    """Append one line and flush; for files written rarely (the ledger).

    A torn last line (a crash or a full disk mid-write) is ended first, under an exclusive
    ``flock``: the new record starts a line of its own instead of being glued to the torn one
    and lost with it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as handle:  # readable too: the last byte is looked at
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            data = encode_line(obj)
            if not ends_with_newline(handle.fileno()):
                data = b"\n" + data
            handle.write(data)
            handle.flush()
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


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
                obj = json.loads(raw)
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
        data = path.read_bytes()
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
            obj = json.loads(line)
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
        while data:  # a short write (disk nearly full) is continued, or ends in OSError
            written = self._handle.write(data)
            if not written:
                raise OSError(errno.EIO, "the write made no progress", str(self.path))
            data = data[written:]
        if self.fsync:
            os.fsync(self._handle.fileno())

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


class ExclusiveLock:
    """An exclusive ``flock`` on a lock file, held until ``release``; the file holds our PID.

    The kernel drops the lock when its process dies (even by kill -9), so a lock file left
    behind never blocks a later run. The file is removed on release; a run that locked a file
    just removed by the previous holder notices (another inode is at the path) and locks again.
    The lock file is never a link (it is opened with ``O_NOFOLLOW`` and must have one name): a
    link planted there would have us truncate its target. With ``guards``, the file it guards
    is locked too, by its identity (device and inode): a second name for it (a symlink, a hard
    link) finds it held.
    """

    def __init__(self, path: Path, fd: int, guard_fd: int | None = None) -> None:
        self.path = path
        self._fd: int | None = fd
        self._guard_fd = guard_fd

    @classmethod
    def acquire(cls, path: Path, what: str, *, guards: Path | None = None) -> ExclusiveLock:
        """Lock ``path`` now or raise InputError (exit 2) naming the holder's PID."""
        while True:
            fd = open_lock_file(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = _pid_in(fd)
                os.close(fd)
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise InputError(f"cannot lock {path}: {exc.strerror or exc}") from exc
                raise InputError(
                    f"{what} is in use by another run (PID {holder or 'unknown'}; lock {path})",
                    "Wait for that run to finish or stop it: two runs must not write one file.",
                ) from exc
            try:
                current = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                current = None
            mine = os.fstat(fd)
            if current is not None and (current.st_dev, current.st_ino) == (
                mine.st_dev,
                mine.st_ino,
            ):
                break
            os.close(fd)  # the previous holder removed it as we opened it: lock the new one
        try:
            guard_fd = None if guards is None else _lock_identity(guards, what)
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return cls(path, fd, guard_fd)

    def release(self) -> None:
        if self._guard_fd is not None:
            os.close(self._guard_fd)
            self._guard_fd = None
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)  # while still locked: see the class docstring
        os.close(self._fd)
        self._fd = None


def open_lock_file(path: Path) -> int:
    """Open (or create) a lock file that is ours to truncate: never through a link, never a
    FIFO or device, never a file with a second name; else InputError (exit 2)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(
                f"the lock file {path} is a symbolic link; calibrate never writes through one",
                f"Remove it (rm {path}) and run again.",
            ) from exc
        raise InputError(
            f"cannot create the lock file {path}: {exc.strerror or exc}",
            "Check that the folder exists and is writable.",
        ) from exc
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode) or found.st_nlink > 1:
        os.close(fd)
        why = "has another name (a hard link)" if stat.S_ISREG(found.st_mode) else "is special"
        raise InputError(
            f"the lock file {path} {why}: it is not a lock calibrate made",
            f"Remove it (rm {path}) and run again.",
        )
    return fd


def _lock_identity(path: Path, what: str) -> int:
    """Lock the file ``path`` names (created if absent), whatever name it is reached by."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, file_mode())
    except OSError as exc:
        raise InputError(
            f"cannot open {what}: {exc.strerror or exc}",
            "Choose a writable place for it; nothing was sent.",
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise InputError(
            f"{what} is in use by another run: it is the same file as the one that run "
            "writes, under another name (a symlink or hard link)",
            "Wait for that run to finish or stop it: two runs must not write one file.",
        ) from exc
    return fd


def _pid_in(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""
    return text if text.isdigit() else ""


class RunDir:
    """One command run's folder: manifest, records, tables, incidents.

    The folder appears with the run's first file, its manifest written first: a command that
    stops before anything was sent or measured (bad input, no server) leaves nothing behind.
    """

    def __init__(self, runs_dir: Path, stage: str, run_id: str | None = None) -> None:
        self.run_id = run_id or new_run_id(stage)
        self.stage = stage
        self.path = run_path(runs_dir, self.run_id)
        self._writers: dict[str, JsonlWriter] = {}
        self._manifest: Any = None

    def set_manifest(self, manifest: Any) -> None:
        """Write ``manifest.json`` now if the folder exists, else with the first file."""
        self._manifest = manifest
        if self.path.exists():
            write_json_atomic(self.path / "manifest.json", manifest)

    def update_manifest(self, **fields: Any) -> None:
        """Add what was learnt during the run (e.g. the server's identity) to the manifest."""
        self.set_manifest({**(self._manifest or {}), **fields})

    def _ensure(self) -> None:
        if self.path.exists():
            return
        self.path.mkdir(parents=True, exist_ok=True)
        if self._manifest is not None:
            write_json_atomic(self.path / "manifest.json", self._manifest)

    def file(self, name: str) -> Path:
        """The path of ``name`` in the folder (the folder is created if need be)."""
        self._ensure()
        return self.path / name

    def append(self, name: str, obj: Any) -> None:
        """Append one record to ``name`` (e.g. records.jsonl), flushed at once."""
        writer = self._writers.get(name)
        if writer is None:
            writer = self._writers[name] = JsonlWriter(self.file(name))
        writer.write(obj)

    def write_json(self, name: str, obj: Any) -> Path:
        path = self.file(name)
        write_json_atomic(path, obj)
        return path

    def write_text(self, name: str, text: str) -> Path:
        path = self.file(name)
        write_atomic(path, text)
        return path

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
