"""One load-sending stage per target at a time (SPEC §11): a lock in runs/locks/.

ladder, sweep, tune and rollback hold ``runs/locks/<target>.lock`` (``fcntl.flock``) alone while
they run: they measure the server, and another stage's load would be measured with theirs. A
batch holds it shared: several batches (the shards of one job) may send to one server at once,
but none beside a stage that measures it, nor such a stage beside them. The file says who holds
it (PID, stage, since when): an exclusive holder's line alone, a line added by each batch; a
refused stage names the latest holder still alive. A batch's line is added, and taken out again
when it ends (with any line whose PID is gone), under a second, short lock beside it
(``<target>.lock.lines``), never by asking for the target's lock alone: a batch ending that
asked for it alone held it so for an instant, and a batch starting in that instant was refused
beside a batch that was ending. The kernel drops the lock when its holder dies, so a lock left
by a crashed or killed run never blocks the next one; only a live holder does, and the stage
that would run beside it stops at once (exit 2) naming it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from calibrate.errors import InputError, UsageError
from calibrate.io.atomic import pid_lives
from calibrate.io.lock import open_lock_file
from calibrate.io.records import utc_now_iso

#: how much of the lock file's end is read for its holder (a line a batch, ~50 bytes each)
_TAIL = 4096
#: how much of the lock file a batch that ends reads to take its line out (more: emptied)
_LINES_MAX = 1 << 20


def lock_path(runs_dir: Path, target: str) -> Path:
    return runs_dir / "locks" / f"{target}.lock"


def _holder(fd: int) -> str:
    """``a batch (PID 1234, since …)``: the latest line of the lock file whose PID still lives,
    or a vaguer text when none does or it is unreadable."""
    try:
        start = max(0, os.fstat(fd).st_size - _TAIL)
        lines = os.pread(fd, _TAIL, start).decode("utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    for line in reversed(lines):
        text = line.split()
        if len(text) >= 2 and text[0].isdigit() and pid_lives(int(text[0])):
            since = f", since {text[2]}" if len(text) > 2 else ""
            return f"a {text[1]} (PID {text[0]}{since})"
    return "another calibrate process"


@contextlib.contextmanager
def hold(runs_dir: Path, target: str, stage: str, *, shared: bool = False) -> Iterator[Path]:
    """Hold the target's lock for the duration; exit 2 at once when a live stage holds it
    (``shared``: a batch, which other batches may hold it with)."""
    path = lock_path(runs_dir, target)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_lock_file(path)  # never through a link: a planted one would be truncated
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(
                f"{_holder(fd)} is already sending load to this target ({target}); "
                f"two load-sending stages at once would measure each other's load ({path})",
                f"Wait for it to finish, or stop it first; then run {stage} again.",
            ) from None
        line = f"{os.getpid()} {stage} {utc_now_iso()}\n".encode()
        try:  # who holds it, for a second stage's message; the lock itself is the flock
            if shared:  # beside the other batches' lines
                with _lines_held(path):
                    os.pwrite(fd, line, os.fstat(fd).st_size)
            else:
                os.ftruncate(fd, 0)
                os.pwrite(fd, line, 0)
        except OSError:  # a full disk: held all the same, its holder shown as unknown
            pass
        try:
            yield path
        finally:
            if shared:  # the others' lines stay; the target's lock is never asked for alone
                with contextlib.suppress(OSError, InputError), _lines_held(path):
                    _take_out(fd, line)  # (a link planted at its lines' lock: line left)
            else:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _lines_held(path: Path) -> Iterator[None]:
    """The lock under which batches add and take out their lines: held for the few bytes it
    guards (blocking, never refusing), beside the target's lock and never it."""
    fd = open_lock_file(path.with_name(path.name + ".lines"))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _take_out(fd: int, line: bytes) -> None:
    """Rewrite the lock file without ``line`` (once) and the lines whose PID is gone."""
    lines = os.pread(fd, _LINES_MAX, 0).splitlines(keepends=True)
    if line in lines:
        lines.remove(line)
    kept = [held for held in lines if held.endswith(b"\n") and _lives(held)]
    if os.fstat(fd).st_size > _LINES_MAX:  # not lines batches wrote: start again
        kept = []
    os.ftruncate(fd, 0)
    os.pwrite(fd, b"".join(kept), 0)


def _lives(line: bytes) -> bool:
    pid = line.split(b" ", 1)[0]
    return pid.isdigit() and pid_lives(int(pid))
