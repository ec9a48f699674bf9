"""Lock files: an exclusive ``flock`` that never writes through a link and names its holder."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from calibrate.errors import InputError
from calibrate.io.atomic import file_mode


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
        try:  # the holder's PID, for the message a second run gets; the lock is the flock
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:  # a full disk: held all the same, its holder shown as unknown
            pass
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


class HeldBy(TimeoutError):
    """``one_at_a_time`` waited its ``wait_s`` out; ``holder``: the PID in the lock file."""

    def __init__(self, holder: str, path: Path, wait_s: float) -> None:
        super().__init__(f"PID {holder} held {path} for {wait_s:.0f} s")
        self.holder = holder


class WaitStopped(Exception):
    """``one_at_a_time`` gave up its wait: the caller's ``stop`` was set (a Ctrl-C)."""


@contextlib.contextmanager
def one_at_a_time(
    path: Path,
    wait_s: float,
    waiting: Callable[[str], None],
    poll_s: float = 0.05,
    stop: threading.Event | None = None,
) -> Iterator[None]:
    """Hold the exclusive ``flock`` on ``path`` for the duration, one process at a time: while
    another holds it, wait for it (``waiting`` told once, with the holder's PID), at most
    ``wait_s`` — then ``HeldBy`` (a TimeoutError) naming that PID — and no longer than
    ``stop`` stays unset (then WaitStopped, within ``poll_s``). The file stays (it holds the
    latest PID): a waiter never locks a file its holder has just removed."""
    fd = open_lock_file(path)
    stop = stop or threading.Event()
    try:
        deadline = time.monotonic() + wait_s
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _pid_in(fd) or "unknown"
                if time.monotonic() >= deadline:
                    raise HeldBy(holder, path, wait_s) from None
                if not told:
                    waiting(holder)
                    told = True
                if stop.wait(poll_s):
                    raise WaitStopped(f"stopped while PID {holder} held {path}") from None
        with contextlib.suppress(OSError):  # the holder's PID, for a waiter's message
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


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
            "Choose a writable place for it; nothing was done.",
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
