"""A PID on this machine: its kernel start time, its command line, whether it lives, who listens
on a port. Read from /proc (``ps`` where there is none); never found by name, never signalled here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from calibrate.engines.redaction import redact_argv, redact_text
from calibrate.gpu.proc import listening_owners


def start_id(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (None when no such live process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone, or gone while it was read (ESRCH)
        return None
    except OSError:
        return _ps(pid, "lstart=")
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _ps(pid: int, column: str) -> str | None:
    """Where there is no /proc (macOS): ask ps about this one PID."""
    try:
        done = subprocess.run(
            ["ps", "-o", column, "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = done.stdout.strip()
    return text if done.returncode == 0 and text and not text.startswith("Z") else None


def cmdline(pid: int) -> str:
    """The command line of ``pid``, for messages (empty when unknown), secret values masked."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return redact_text(_ps(pid, "command=") or "")
    words = [part.decode(errors="replace") for part in raw.split(b"\0") if part]
    return " ".join(redact_argv(words))


def listener_pid(port: int, root: Path = Path("/proc")) -> int | None:
    """The PID listening on TCP ``port`` on this machine, to print a stop command (Linux only);
    the lowest where several hold the socket (a server's forked workers: its first process).

    Found through the socket, never by name (``gpu.proc.listening_owners``, the one search), and
    only ever shown to the user, never signalled.
    """
    return min(listening_owners(port, root) or (), default=None)
