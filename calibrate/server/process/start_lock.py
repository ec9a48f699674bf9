"""``runs/server.restart.lock``: one process at a time starts or stops the managed server.

``lifecycle.start`` and ``lifecycle.stop`` hold it (``one_change``), so every start and stop
calibrate makes does — a hand ``server start`` or ``server stop``, the ladder's restart at each
``--parallel B``, the sweep's at cap B, tune's per candidate, a rollback's, a batch's
``--restart``. A caller that stops the server and starts it again holds it across both
(``refusing``, or ``held`` to wait as a batch does): no other process's start slips between.
Within the thread that holds it, it is held again at no cost; held by another process, a start or
stop is refused (exit 2), one line naming that process's PID.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from calibrate.errors import UsageError
from calibrate.io.lock import HeldBy, one_at_a_time
from calibrate.server.process import restart_lock_path

P = ParamSpec("P")
R = TypeVar("R")
WAIT_HINT = "Wait for that start to end, then see: calibrate server status"

_mine = threading.local()  # .paths: the lock files this thread holds now


@contextlib.contextmanager
def held(
    runs_dir: Path,
    wait_s: float = 0.0,
    waiting: Callable[[str], None] = lambda holder: None,
    stop: threading.Event | None = None,
) -> Iterator[None]:
    """Hold the lock for the duration (``one_at_a_time``: wait up to ``wait_s`` for another
    holder, then ``HeldBy`` naming its PID); already held by this thread, held on."""
    path = restart_lock_path(runs_dir)
    key = os.path.abspath(path)
    paths: set[str] = _mine.__dict__.setdefault("paths", set())
    if key in paths:
        yield
        return
    runs_dir.mkdir(parents=True, exist_ok=True)
    with one_at_a_time(path, wait_s, waiting, stop=stop):
        paths.add(key)
        try:
            yield
        finally:
            paths.discard(key)


@contextlib.contextmanager
def refusing(runs_dir: Path, not_done: str, hint: str = WAIT_HINT) -> Iterator[None]:
    """``held`` without a wait: held by another process, UsageError (exit 2) naming its PID and
    saying what was ``not_done`` ("not started")."""
    taken = False
    try:
        with held(runs_dir):
            taken = True
            yield
    except HeldBy as exc:
        if taken:  # not the lock's: the body's own
            raise
        raise UsageError(
            f"PID {exc.holder} is starting or stopping the managed server "
            f"(lock {restart_lock_path(runs_dir)}); {not_done}",
            hint,
        ) from None


def one_change(
    not_done: str, hint: str = WAIT_HINT
) -> Callable[[Callable[Concatenate[Path, P], R]], Callable[Concatenate[Path, P], R]]:
    """Decorate a function of ``runs_dir`` (first) that starts or stops the managed server: it
    runs holding the lock, ``refusing`` when another process holds it."""

    def wrap(fn: Callable[Concatenate[Path, P], R]) -> Callable[Concatenate[Path, P], R]:
        @functools.wraps(fn)
        def locked(runs_dir: Path, /, *args: P.args, **kwargs: P.kwargs) -> R:
            with refusing(runs_dir, not_done, hint):
                return fn(runs_dir, *args, **kwargs)

        return locked

    return wrap
