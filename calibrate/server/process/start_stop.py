"""Starting the managed engine in its own session and stopping only it: SIGTERM to its process
group, SIGKILL after the timeout, until the PID and its workers are gone. A supervisor (its
parent, ``calibrate.server.supervise``) records how it ends."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from calibrate import redact
from calibrate.engines.redaction import argv_secret_values
from calibrate.io.records import utc_now_iso
from calibrate.server import exit_status, log_filter, supervise
from calibrate.server.pids import start_id
from calibrate.server.process import (
    Liveness,
    ServerRecord,
    end_code,
    keep_child,
    liveness,
    log_path,
)

log = logging.getLogger("calibrate")

Clock = Callable[[], float]
Sleep = Callable[[float], None]

# Engines started but not yet recorded (see ``adopt``).
_UNADOPTED: dict[int, supervise.Launched] = {}


@dataclass(frozen=True)
class Spawned:  # the engine, where its output begins in the log, the supervisor that reaps it
    pid: int
    start_id: str
    log_offset: int
    supervisor_pid: int
    supervisor_id: str | None


def spawn(
    argv: Sequence[str], env: Sequence[tuple[str, str]], runs_dir: Path, header: str
) -> Spawned:
    """Start argv in its own session (= process group), output appended to runs/server.log.

    The extra environment goes through ``env`` so the log and the pidfile show exactly what
    ran. A supervisor (its parent) records how it ends.
    Call ``adopt(pid)`` once the engine is recorded (``save``): until then, if this process
    dies, the supervisor stops the engine.
    """
    full = [*(["env", *(f"{k}={v}" for k, v in env)] if env else []), *argv]
    line = f"\n=== {utc_now_iso()} {header} ===\n"
    with log_filter.open_log(log_path(runs_dir), line) as handle:
        offset = handle.tell()
        secrets = (*argv_secret_values(full), *redact.remembered())
        launched = supervise.launch(full, handle, exit_status.status_path(runs_dir), secrets)
    keep_child(launched.engine_pid, launched.supervisor)
    _UNADOPTED[launched.engine_pid] = launched
    pid, supervisor = launched.engine_pid, launched.supervisor.pid
    return Spawned(pid, start_id(pid) or "", offset, supervisor, start_id(supervisor))


def adopt(pid: int) -> None:
    """The engine ``pid`` is recorded in runs/server.json: its supervisor lets it run."""
    launched = _UNADOPTED.pop(pid, None)
    if launched is not None:
        supervise.adopt(launched)


def abandon(pid: int) -> None:
    """The engine could not be recorded: its supervisor stops it."""
    launched = _UNADOPTED.pop(pid, None)
    if launched is not None:
        supervise.abandon(launched)


@dataclass(frozen=True)
class StopResult:
    pid: int
    was: Liveness
    signal_sent: str | None  # "SIGTERM", "SIGKILL" or None (already gone / not ours)
    exit_code: int | None
    elapsed_s: float
    gone: bool


def stop(
    record: ServerRecord,
    timeout_s: float,
    *,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    kill_grace_s: float = 5.0,
) -> StopResult:
    """SIGTERM the server's process group, SIGKILL after ``timeout_s``; confirm the PID is gone.

    A PID that now belongs to another program (``stranger``) is left alone.
    """
    start = clock()
    was = liveness(record)
    if was != "running":  # gone: its supervisor may be writing how it ended right now
        code = end_code(record, wait=was == "gone")
        return StopResult(record.pid, was, None, code, clock() - start, was == "gone")
    sent = "SIGTERM"
    _signal_group(record.pid, signal.SIGTERM)
    if not _wait_gone(record, start + timeout_s, clock, sleep):
        log.warning("server PID %s ignored SIGTERM for %.0f s: SIGKILL", record.pid, timeout_s)
        sent = "SIGKILL"
        _signal_group(record.pid, signal.SIGKILL)
        _wait_gone(record, clock() + kill_grace_s, clock, sleep)
    gone = liveness(record) != "running"
    code = end_code(record, wait=gone)
    return StopResult(record.pid, was, sent, code, clock() - start, gone)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_exists(pgid: int) -> bool:
    # While any member lives, the kernel does not hand this number to a new process.
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _wait_gone(record: ServerRecord, deadline: float, clock: Clock, sleep: Sleep) -> bool:
    """Wait until the leader and its workers (same process group) have all exited."""
    while liveness(record) == "running" or _group_exists(record.pid):
        if clock() >= deadline:
            return False
        sleep(0.05)
    return True
