"""The managed engine process: who it is, whether it still is, how it ended.

``runs/server.pid`` holds the PID alone (the conventional pidfile other tools read);
``runs/server.json`` holds its identity — the kernel's start time of that PID — so a stale
pidfile whose PID now belongs to another program is recognised and never signalled.
Nothing is ever found or signalled by name. Starting and stopping it is ``start_stop``; whether
it is the target's server, ``target``.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from calibrate import json_text
from calibrate.engines import find
from calibrate.engines.args import ServerKind
from calibrate.engines.redaction import redact_argv
from calibrate.io.atomic import write_atomic, write_json_atomic
from calibrate.io.bounded import read_tail, read_text
from calibrate.server import exit_status
from calibrate.server.pids import start_id

TAIL_BYTES = 1024 * 1024  # a log tail is read from the last MiB, never the whole log


Liveness = Literal["running", "gone", "stranger"]

# The supervisors (calibrate.server.supervise) of the engines this process started, by engine
# PID: reaped when they end, so none lingers as a zombie.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def pid_path(runs_dir: Path) -> Path:
    return runs_dir / "server.pid"


def record_path(runs_dir: Path) -> Path:
    return runs_dir / "server.json"


def log_path(runs_dir: Path) -> Path:
    return runs_dir / "server.log"


def restart_lock_path(runs_dir: Path) -> Path:
    """Held by whoever starts the managed server while a batch may restart it (``batch
    --restart``, a hand ``server start``): one start at a time, never two engines on its port."""
    return runs_dir / "server.restart.lock"


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


def keep_child(pid: int, supervisor: subprocess.Popen[bytes]) -> None:
    """Remember the supervisor of the engine ``pid`` this process started (``start_stop.spawn``),
    to reap it when it ends; the supervisors of engines gone before this start are reaped now."""
    _reap(pid)
    _CHILDREN[pid] = supervisor


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


def forget(runs_dir: Path) -> None:
    pid_path(runs_dir).unlink(missing_ok=True)
    record_path(runs_dir).unlink(missing_ok=True)


def log_tail(runs_dir: Path, lines: int, offset: int = 0) -> list[str]:
    """The last ``lines`` lines of runs/server.log from ``offset`` on."""
    try:
        data = read_tail(log_path(runs_dir), TAIL_BYTES, offset)
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace").splitlines()
    return text[-lines:] if lines > 0 else []
