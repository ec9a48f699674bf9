"""Files written atomically: a temp file beside the target, fsynced, renamed into place.

A temp file left by a dead writer (kill -9) is recognised by the PID in its name and removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from calibrate.errors import InputError
from calibrate.io.bounded import read_bounded
from calibrate.io.jsonl import json_safe, utf8


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
        if mine != own or (not mine and pid_lives(int(pid_text))):
            continue
        with contextlib.suppress(OSError):
            (path.parent / name).unlink()
            removed += 1
    return removed


def pid_lives(pid: int) -> bool:
    """Whether a process has ``pid`` (signal 0: nothing is sent); unknown reads as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process (or no such number): leave its file alone
    return True


def write_atomic(path: Path, text: str) -> None:
    """Write to a temp file beside ``path`` and rename it into place (never onto a device)."""
    write_bytes_atomic(path, utf8(text))


def copy_atomic(source: Path, path: Path) -> None:
    """``source`` copied to ``path`` like ``write_atomic`` writes, read with the bound (exit 2
    past ``MAX_FILE_BYTES``: a device or FIFO is never copied without end)."""
    write_bytes_atomic(path, read_bounded(source))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    write_atomic_with(path, lambda handle: handle.write(data))


def write_atomic_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``write`` into a temp file beside ``path``, then rename it into place. When anything
    fails nothing of it is left — no temp file, no empty file, no folder made for it — and an
    OSError names ``path`` (a full disk's error names no file)."""
    made = missing_folders(path.parent)
    try:
        fd, tmp = temp_beside(path)
    except BaseException as exc:
        remove_folders(made)
        named(exc, path)
        raise
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        remove_folders(made)
        named(exc, path)
        raise


def named(exc: BaseException, path: Path) -> None:
    """An OSError of writing ``path`` made to name it (not a temp file, not nothing)."""
    if isinstance(exc, OSError):
        exc.filename, exc.filename2 = str(path), None


def missing_folders(folder: Path) -> list[Path]:
    """The folders up to ``folder`` that do not exist yet, outermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing[::-1]


def remove_folders(made: list[Path]) -> None:
    """Remove the folders ``missing_folders`` listed (innermost first), where still empty."""
    for folder in reversed(made):
        with contextlib.suppress(OSError):
            folder.rmdir()


def write_json_atomic(path: Path, obj: Any) -> None:
    safe = json_safe(obj)  # a path that is not UTF-8 as \\xNN, and still JSON
    write_atomic(path, json.dumps(safe, ensure_ascii=False, indent=2, sort_keys=True) + "\n")
