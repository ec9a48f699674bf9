"""The engine's supervisor: start it, wait for it, write how it ended (``runs/server.exit.json``).

``calibrate server start`` returns while the engine keeps running, so calibrate cannot reap it:
its exit code and the signal that killed it would be lost. ``launch`` therefore starts this
small process (detached, its own session), which starts the engine as its child in the
engine's own session (so the engine leads its process group and ``stop`` signals only that
group), hands the engine's PID back through a pipe, waits, and records the exit status.

    python -c "$ENTRY" --status PATH --pid-fd N -- ENGINE ARGV…

It is started with ``-c`` and an import, not ``-m``: ``calibrate.server`` imports this module,
so ``-m`` would find it already imported and runpy would open every server log with a
RuntimeWarning.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from calibrate.server import exit_status

HANDOFF_TIMEOUT_S = 30.0
#: what the supervisor's Python runs (``-c``): an import, so runpy never re-executes this module
ENTRY = "import sys; from calibrate.server.supervise import main; sys.exit(main(sys.argv[1:]))"


@dataclass(frozen=True)
class Launched:
    engine_pid: int
    supervisor: subprocess.Popen[bytes]  # reap it when it ends (it ends right after the engine)


def launch(argv: Sequence[str], log: IO[bytes], status: Path) -> Launched:
    """Start ``argv`` under a supervisor; output to ``log``. OSError when the engine cannot start."""
    read_fd, write_fd = os.pipe()
    command = [
        sys.executable,
        "-c",
        ENTRY,
        "--status",
        str(status),
        "--pid-fd",
        str(write_fd),
        "--",
        *argv,
    ]
    try:
        supervisor = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(write_fd,),
        )
    finally:
        os.close(write_fd)
    try:
        answer = _read_handoff(read_fd, HANDOFF_TIMEOUT_S)
    finally:
        os.close(read_fd)
    if answer.startswith("pid "):
        return Launched(int(answer.split()[1]), supervisor)
    supervisor.wait(timeout=HANDOFF_TIMEOUT_S)
    if answer.startswith("error "):
        _, errno_text, message = answer.split(" ", 2)
        raise OSError(int(errno_text), message)
    raise OSError(f"the supervisor did not start the engine (answered {answer!r})")


def _read_handoff(fd: int, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def supervise(argv: Sequence[str], status: Path, pid_fd: int) -> int:
    """Run the engine to its end; its exit status goes to ``status``. Returns a shell-style code."""
    try:
        engine = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, start_new_session=True, restore_signals=True
        )
    except OSError as exc:
        os.write(pid_fd, f"error {exc.errno or 0} {exc.strerror or exc}\n".encode())
        os.close(pid_fd)
        return 127
    # Ignore signals meant for a terminal or a group (after the start: an ignored signal stays
    # ignored across exec, and the engine must still answer SIGTERM): outlive the engine.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    os.write(pid_fd, f"pid {engine.pid}\n".encode())
    os.close(pid_fd)
    returncode = engine.wait()
    ended = exit_status.ExitStatus.from_returncode(engine.pid, returncode)
    exit_status.write(status, ended)
    return returncode if returncode >= 0 else 128 - returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibrate.server.supervise")
    parser.add_argument("--status", required=True, type=Path)
    parser.add_argument("--pid-fd", required=True, type=int)
    parser.add_argument("engine", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    engine = args.engine[1:] if args.engine[:1] == ["--"] else args.engine
    if not engine:
        parser.error("no engine command after --")
    return supervise(engine, args.status, args.pid_fd)


if __name__ == "__main__":
    raise SystemExit(main())
