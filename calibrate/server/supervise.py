"""The engine's supervisor: start it, wait for it, write how it ended (``runs/server.exit.json``).

``calibrate server start`` returns while the engine keeps running, so calibrate cannot reap it:
its exit code and the signal that killed it would be lost. ``launch`` therefore starts this
small process (detached, its own session), which starts the engine as its child in the
engine's own session (so the engine leads its process group and ``stop`` signals only that
group), hands the engine's PID back through a pipe, waits, and records the exit status.

Adoption: calibrate answers ``ok`` on a second pipe once the engine's PID is in
``runs/server.json``. If that pipe closes first (calibrate was killed, even by kill -9, before
it could record the engine), the supervisor stops the engine: none is ever left unrecorded.

    python -m calibrate.server.supervise --status PATH --pid-fd N --adopt-fd M -- ENGINE ARGV…
"""

from __future__ import annotations

import argparse
import contextlib
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
ADOPT_TIMEOUT_S = 60.0  # calibrate records the engine within this, or the engine is stopped
ORPHAN_STOP_S = 10.0  # SIGTERM, then SIGKILL, for an engine nobody recorded


@dataclass(frozen=True)
class Launched:
    engine_pid: int
    supervisor: subprocess.Popen[bytes]  # reap it when it ends (it ends right after the engine)
    adopt_fd: int  # write "ok" here once the engine is recorded (``adopt``); closing = stop it


def adopt(launched: Launched) -> None:
    """The engine is recorded: the supervisor lets it run."""
    try:
        os.write(launched.adopt_fd, b"ok\n")
    except OSError:
        pass
    finally:
        abandon(launched)


def abandon(launched: Launched) -> None:
    """Close the adoption pipe (without "ok" first, the supervisor stops the engine)."""
    with contextlib.suppress(OSError):
        os.close(launched.adopt_fd)


def launch(argv: Sequence[str], log: IO[bytes], status: Path) -> Launched:
    """Start ``argv`` under a supervisor; output to ``log``. OSError when the engine cannot start."""
    read_fd, write_fd = os.pipe()
    adopt_read, adopt_write = os.pipe()
    command = [
        sys.executable,
        "-m",
        "calibrate.server.supervise",
        "--status",
        str(status),
        "--pid-fd",
        str(write_fd),
        "--adopt-fd",
        str(adopt_read),
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
            pass_fds=(write_fd, adopt_read),
        )
    except BaseException:
        os.close(adopt_write)
        raise
    finally:
        os.close(write_fd)
        os.close(adopt_read)
    try:
        answer = _read_handoff(read_fd, HANDOFF_TIMEOUT_S)
    except BaseException:
        os.close(adopt_write)
        raise
    finally:
        os.close(read_fd)
    if answer.startswith("pid "):
        return Launched(int(answer.split()[1]), supervisor, adopt_write)
    os.close(adopt_write)
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


def _adopted(fd: int, timeout_s: float) -> bool:
    """Whether calibrate said "ok" (it recorded the engine) before closing the pipe."""
    if fd < 0:
        return True
    try:
        return _read_handoff(fd, timeout_s) == "ok"
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def _stop_orphan(engine: subprocess.Popen[bytes]) -> None:
    """SIGTERM the engine's group, SIGKILL after ``ORPHAN_STOP_S``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(engine.pid, sig)
        try:
            engine.wait(ORPHAN_STOP_S)
            return
        except subprocess.TimeoutExpired:
            continue


def supervise(argv: Sequence[str], status: Path, pid_fd: int, adopt_fd: int = -1) -> int:
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
    if not _adopted(adopt_fd, ADOPT_TIMEOUT_S):
        print(f"calibrate did not record engine PID {engine.pid}: stopping it", flush=True)
        _stop_orphan(engine)
    returncode = engine.wait()
    ended = exit_status.ExitStatus.from_returncode(engine.pid, returncode)
    exit_status.write(status, ended)
    return returncode if returncode >= 0 else 128 - returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calibrate.server.supervise")
    parser.add_argument("--status", required=True, type=Path)
    parser.add_argument("--pid-fd", required=True, type=int)
    parser.add_argument("--adopt-fd", type=int, default=-1)
    parser.add_argument("engine", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    engine = args.engine[1:] if args.engine[:1] == ["--"] else args.engine
    if not engine:
        parser.error("no engine command after --")
    return supervise(engine, args.status, args.pid_fd, args.adopt_fd)


if __name__ == "__main__":
    raise SystemExit(main())
