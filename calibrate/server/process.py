"""The managed engine process: start it in its own session, remember who it is, stop only it.

``runs/server.pid`` holds the PID alone (the conventional pidfile other tools read);
``runs/server.json`` holds its identity — the kernel's start time of that PID — so a stale
pidfile whose PID now belongs to another program is recognised and never signalled.
Nothing is ever found or signalled by name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from calibrate import json_text, redact
from calibrate.config import Config
from calibrate.engines import find
from calibrate.engines.args import ServerKind
from calibrate.engines.redaction import argv_secret_values, redact_argv
from calibrate.io.atomic import write_atomic, write_json_atomic
from calibrate.io.bounded import read_tail, read_text
from calibrate.io.records import utc_now_iso
from calibrate.server import exit_status, log_filter, supervise
from calibrate.server.pids import start_id
from calibrate.state.identity import LOOPBACK, url_host

log = logging.getLogger("calibrate")

TAIL_BYTES = 1024 * 1024  # a log tail is read from the last MiB, never the whole log


Clock = Callable[[], float]
Sleep = Callable[[float], None]
Liveness = Literal["running", "gone", "stranger"]

# The supervisors (calibrate.server.supervise) of the engines this process started, by engine
# PID: reaped when they end, so none lingers as a zombie.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
# Engines started but not yet recorded (see ``adopt``).
_UNADOPTED: dict[int, supervise.Launched] = {}


def pid_path(runs_dir: Path) -> Path:
    return runs_dir / "server.pid"


def record_path(runs_dir: Path) -> Path:
    return runs_dir / "server.json"


def log_path(runs_dir: Path) -> Path:
    return runs_dir / "server.log"


@dataclass(frozen=True)
class ServerRecord:
    """Who the managed server is and how it was started (``runs/server.json``)."""

    pid: int
    start_id: str  # kernel start time of the PID: the same number can never mean another process
    argv: tuple[str, ...]
    kind: str | None
    port: int
    health_path: str | None
    started_at: str
    log_offset: int  # where this start's output begins in runs/server.log
    batch_size: int | None = None
    concurrency: int | None = None
    script: str | None = None
    vram_used_mib_before: float | None = None
    status_file: str | None = None  # where the supervisor records how the engine ended
    supervisor_pid: int | None = None  # … that supervisor and its start time (it writes, then
    supervisor_id: str | None = None  # exits; None: a record from an older calibrate)
    # "starting" from before the readiness wait until the engine answered, then "ready";
    # starter: the calibrate process waiting for it (its PID and start time)
    phase: str = "ready"
    starter_pid: int | None = None
    starter_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "argv": list(redact_argv(self.argv))}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServerRecord:
        known = {f for f in cls.__dataclass_fields__}
        fields = {k: v for k, v in data.items() if k in known}
        return cls(**{**fields, "argv": tuple(data.get("argv") or ())})

    def left_starting(self) -> bool:
        """Still "starting" although the calibrate that started it is gone (kill -9, a crash)."""
        if self.phase != "starting" or self.starter_pid is None:
            return False
        alive = self.starter_pid == os.getpid() or start_id(self.starter_pid) == self.starter_id
        return not alive


def _reap(pid: int, wait_s: float = 0.0) -> int | None:
    """Collect our own exited child so its PID really disappears; its exit code, if known.
    Every other supervisor that has ended is collected too (one whose engine was killed and
    restarted is never asked about again, and would stay a zombie)."""
    for other in [p for p in _CHILDREN if p != pid]:
        if _CHILDREN[other].poll() is not None:
            del _CHILDREN[other]
    child = _CHILDREN.get(pid)
    if child is None:
        return None
    try:
        return child.wait(wait_s) if wait_s > 0 else child.poll()
    except subprocess.TimeoutExpired:
        return None


def liveness(record: ServerRecord) -> Liveness:
    _reap(record.pid)
    current = start_id(record.pid)
    if current is None:
        return "gone"
    return "running" if current == record.start_id else "stranger"


def recorded_end(record: ServerRecord, wait: bool = True) -> exit_status.ExitStatus | None:
    """How the recorded engine ended, as its supervisor wrote it (None: not written); with
    ``wait``, waited for while that supervisor lives (``exit_status.WRITE_LIMIT_S`` at most)."""
    if record.status_file is None:
        return None
    writing = exit_status.supervisor_lives(record.supervisor_pid, record.supervisor_id)
    limit = (exit_status.WRITE_LIMIT_S if writing else exit_status.SETTLE_S) if wait else 0.0
    ended = exit_status.wait_for(Path(record.status_file), record.pid, limit, writing=writing)
    _reap(record.pid, 1.0 if ended is not None else 0.0)  # it exits right after writing
    return ended


def end_code(record: ServerRecord, wait: bool = True) -> int | None:
    """``recorded_end``'s exit code (``Popen.returncode``; None: not known)."""
    ended = recorded_end(record, wait)
    return ended.exit_code if ended is not None else None


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
    _reap(launched.engine_pid)  # supervisors of engines gone before this start
    _CHILDREN[launched.engine_pid] = launched.supervisor
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


def save(record: ServerRecord, runs_dir: Path) -> None:
    write_json_atomic(record_path(runs_dir), record.to_json())
    write_atomic(pid_path(runs_dir), f"{record.pid}\n")


def load(runs_dir: Path) -> ServerRecord | None:
    """The managed server's record, or None when calibrate manages none."""
    try:
        data = json_text.loads(read_text(record_path(runs_dir)))
        return ServerRecord.from_json(data)
    except (OSError, ValueError, TypeError):
        return None


def kind_of(record: ServerRecord | None, configured: str | None) -> ServerKind | None:
    """The engine kind a stage treats the server as: the kind the managed server was started as
    (``record``: what runs, whatever the config says now), else ``[server] kind``; a kind
    calibrate does not know counts as none. Every stage asks this one rule: a cap, a restart,
    output forcing, VRAM preallocation, the notes."""
    for name in (record.kind if record is not None else None, configured):
        found = find(name)
        if found is not None:
            return found.kind
    return None


def running_kind(cfg: Config) -> ServerKind | None:
    """``kind_of`` the managed server while it runs and is the target; ``[server] kind``
    otherwise (a managed engine beside another target is not the target's engine)."""
    return kind_of(managed_target(cfg), cfg.server.kind)


def forget(runs_dir: Path) -> None:
    pid_path(runs_dir).unlink(missing_ok=True)
    record_path(runs_dir).unlink(missing_ok=True)


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


def log_tail(runs_dir: Path, lines: int, offset: int = 0) -> list[str]:
    """The last ``lines`` lines of runs/server.log from ``offset`` on."""
    try:
        data = read_tail(log_path(runs_dir), TAIL_BYTES, offset)
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace").splitlines()
    return text[-lines:] if lines > 0 else []


# -- whether the managed server is the target's: asked before its record is read as the
# target's account (its cap, its engine) or it is stopped and started for the target; a managed
# server beside another target (a second server given by --base-url, a proxy in front of it)
# says nothing of the target and is never touched for it

THIS_MACHINE = (LOOPBACK, "0.0.0.0", "::")  # a target host that is the managed server's machine


def managed_target(cfg: Config) -> ServerRecord | None:
    """The server calibrate manages, when it runs and the target is it (this machine, its
    port); None otherwise. Its record says its cap and how to restart it — of itself only: a
    managed server beside the target (another server given by ``--base-url``, a proxy in front
    of it) says nothing of the target's cap, and restarting it changes nothing there."""
    record = load(cfg.runs_dir)
    if record is None or liveness(record) != "running" or not is_target(cfg, record):
        return None
    return record


def is_target(cfg: Config, record: ServerRecord) -> bool:
    """Whether the managed server of ``record`` is the one the target points at: this machine
    (by any of its names), the server's port."""
    return serves_target(cfg, record.port)


def serves_target(cfg: Config, port: int) -> bool:
    """Whether a server on ``port`` of this machine is the one the target points at."""
    target = urlsplit(cfg.target.base_url)
    try:
        target_port = target.port or (443 if target.scheme == "https" else 80)
    except ValueError:
        return False
    return url_host(cfg.target.base_url) in THIS_MACHINE and port == target_port
