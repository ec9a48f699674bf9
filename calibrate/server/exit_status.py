"""How the managed engine ended: ``runs/server.exit.json``, written by its supervisor.

Once ``calibrate server start`` returns, the engine is no longer calibrate's child, so only the
supervisor (``calibrate.server.supervise``, its parent) can reap it and learn its exit status.
It writes that here; incidents, ``server status``, ``server stop`` and rollback read it.

``exit_code`` follows Python's ``Popen.returncode``: the code the engine exited with, or the
negated signal number when a signal ended it (``-9`` with ``signal`` ``"SIGKILL"``).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from calibrate import json_text
from calibrate.errors import ErrorInfo
from calibrate.io.atomic import write_json_atomic
from calibrate.io.bounded import read_text
from calibrate.io.records import utc_now_iso
from calibrate.server.pids import start_id

# What a request meets when the server it talks to dies (an HTTP answer means something lived).
DEATH_KINDS = frozenset({"connect", "reset", "timeout"})

# After the engine is gone, its supervisor reaps it, writes the file, and exits. While that
# supervisor is known to live, the file is still to come: waited for up to WRITE_LIMIT_S (a
# loaded machine may take seconds to run it); once it has exited, the file is there or never
# will be. Where nothing says whether it lives (a record from an older calibrate): SETTLE_S.
SETTLE_S = 2.0
WRITE_LIMIT_S = 30.0


def status_path(runs_dir: Path) -> Path:
    return runs_dir / "server.exit.json"


@dataclass(frozen=True)
class ExitStatus:
    pid: int
    exit_code: int  # Popen.returncode: negative = the signal number that ended it
    signal: str | None  # "SIGKILL", … when a signal ended it
    ended_at: str

    @classmethod
    def from_returncode(cls, pid: int, returncode: int) -> ExitStatus:
        return cls(
            pid, returncode, signal_name(-returncode) if returncode < 0 else None, utc_now_iso()
        )

    def describe(self) -> str:
        """``killed by SIGKILL`` / ``exited with code 1``."""
        if self.signal is not None:
            return f"killed by {self.signal}"
        return f"exited with code {self.exit_code}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def ended_words(exit_code: int | None) -> str:
    """How a process ended, from its ``Popen.returncode``, for every line that reports an exit:
    ``exit code 1``, ``killed by SIGKILL`` (never ``exit code -9``), or, when nothing recorded
    it, ``its exit status was not recorded`` (never ``exit code None``)."""
    if exit_code is None:
        return "its exit status was not recorded"
    if exit_code < 0:
        return f"killed by {signal_name(-exit_code)}"
    return f"exit code {exit_code}"


def exited(exit_code: int) -> str:
    """``exited with code 3`` / ``was killed by SIGKILL``: after "the server"."""
    return f"exited with code {exit_code}" if exit_code >= 0 else f"was {ended_words(exit_code)}"


def signal_of(exit_code: int | None) -> str | None:
    """``"SIGKILL"`` for a ``Popen.returncode`` of -9; None for an exit or an unknown end."""
    return signal_name(-exit_code) if exit_code is not None and exit_code < 0 else None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def write(path: Path, status: ExitStatus) -> None:
    write_json_atomic(path, status.to_json())


def read(path: Path, pid: int) -> ExitStatus | None:
    """The recorded end of ``pid``; None when none is recorded (yet) for that PID."""
    try:
        data = json_text.loads(read_text(path))
        status = ExitStatus(
            int(data["pid"]),
            int(data["exit_code"]),
            data.get("signal"),
            str(data.get("ended_at") or ""),
        )
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return status if status.pid == pid else None


def wait_for(
    path: Path,
    pid: int,
    timeout_s: float = SETTLE_S,
    *,
    writing: Callable[[], bool] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ExitStatus | None:
    """``read``, retried for up to ``timeout_s`` (the engine is gone, its supervisor is writing)
    and, where ``writing`` says whether that supervisor still lives, no longer than it does:
    once it has exited, what it wrote is there, or nothing ever will be."""
    deadline = clock() + timeout_s
    while True:
        status = read(path, pid)
        if status is not None:
            return status
        if writing is not None and not writing():
            return read(path, pid)  # written just before it exited, or never
        if clock() >= deadline:
            return None
        sleep(0.05)


def supervisor_lives(pid: int | None, its_id: str | None) -> Callable[[], bool] | None:
    """Whether the supervisor ``pid`` (kernel start time ``its_id``) still lives, asked afresh
    (``wait_for``'s ``writing``); None where the record names no supervisor."""
    if pid is None or not its_id:
        return None
    return lambda: start_id(pid) == its_id


def died_error(error: ErrorInfo, pid: int, status: ExitStatus | None) -> ErrorInfo:
    """A request that failed because the managed server died: kind ``server_died``."""
    how = status.describe() if status is not None else "exited (status not recorded)"
    return ErrorInfo(
        "server_died",
        f"the managed server (PID {pid}) {how}; the request failed with: {error.message}",
        error.status,
        error.retry_after_s,
        error.body,
    )
