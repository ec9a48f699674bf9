"""The engine's supervisor: start it, wait for it, write how it ended (``runs/server.exit.json``).

``calibrate server start`` returns while the engine keeps running, so calibrate cannot reap it:
its exit code and the signal that killed it would be lost. ``launch`` therefore starts this
small process (detached, its own session), which starts the engine as its child in the
engine's own session (so the engine leads its process group and ``stop`` signals only that
group), hands the engine's PID back through a pipe, waits, and records the exit status.

Adoption: calibrate answers ``ok`` on a second pipe once the engine's PID is in
``runs/server.json``. If that pipe closes first (calibrate was killed, even by kill -9, before
it could record the engine), the supervisor stops the engine: none is ever left unrecorded.

    python -c "$ENTRY" --status PATH --pid-fd N --adopt-fd M -- ENGINE ARGV…

It is started with ``-c`` and an import, not ``-m``: ``calibrate.server`` imports this module,
so ``-m`` would find it already imported and runpy would open every server log with a
RuntimeWarning.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from calibrate import json_text
from calibrate.server import exit_status, log_filter

HANDOFF_TIMEOUT_S = 30.0
ADOPT_TIMEOUT_S = 60.0  # calibrate records the engine within this, or the engine is stopped
ORPHAN_STOP_S = 10.0  # SIGTERM, then SIGKILL, for an engine nobody recorded
COPY_SETTLE_S = 1.0  # after the engine exits, how long its last output may take to arrive
#: what the supervisor's Python runs (``-c``): an import, so runpy never re-executes this module
ENTRY = "import sys; from calibrate.server.supervise import main; sys.exit(main(sys.argv[1:]))"


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


def launch(
    argv: Sequence[str], log: IO[bytes], status: Path, secrets: Sequence[str] = ()
) -> Launched:
    """Start ``argv`` under a supervisor; output to ``log``. OSError when the engine cannot start.

    With ``secrets`` (values in its command, keys), the engine's output reaches ``log`` through
    the supervisor with each of them masked (``log_filter``); they travel over a pipe, not argv.
    """
    read_fd, write_fd = os.pipe()
    adopt_read, adopt_write = os.pipe()
    secrets_fd = _secrets_pipe(secrets) if secrets else -1
    extra = ["--secrets-fd", str(secrets_fd)] if secrets_fd >= 0 else []
    command = [
        sys.executable,
        "-c",
        ENTRY,
        "--status",
        str(status),
        "--pid-fd",
        str(write_fd),
        "--adopt-fd",
        str(adopt_read),
        *extra,
        "--",
        *argv,
    ]
    passed = (write_fd, adopt_read, *([secrets_fd] if secrets_fd >= 0 else []))
    try:
        supervisor = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=passed,
        )
    except BaseException:
        os.close(adopt_write)
        os.close(read_fd)
        raise
    finally:
        for fd in passed[1:]:
            os.close(fd)
        os.close(write_fd)
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


def _secrets_pipe(secrets: Sequence[str]) -> int:
    """A pipe holding the secrets as JSON (read end returned); small enough for its buffer."""
    data = json.dumps(sorted(set(secrets))).encode("utf-8")[:60000]
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, data)
    finally:
        os.close(write_fd)
    return read_fd


def _read_secrets(fd: int) -> tuple[str, ...]:
    if fd < 0:
        return ()
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    try:
        found = json_text.loads(b"".join(chunks))
    except ValueError:
        return ()
    return tuple(s for s in found if isinstance(s, str)) if isinstance(found, list) else ()


def _read_handoff(fd: int, timeout_s: float) -> str:
    """The supervisor's first line, within ``timeout_s``. Polled, never ``select``ed: a batch
    restarting its server holds a socket per request in flight, and ``select`` refuses any
    descriptor past 1023 (a ValueError, where the start's own line should be)."""
    deadline = time.monotonic() + timeout_s
    data = b""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
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


def supervise(
    argv: Sequence[str],
    status: Path,
    pid_fd: int,
    adopt_fd: int = -1,
    secrets: Sequence[str] = (),
) -> int:
    """Run the engine to its end; its exit status goes to ``status``. Returns a shell-style code."""
    piped = subprocess.PIPE if secrets else None
    try:
        engine = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=piped,
            stderr=subprocess.STDOUT if secrets else None,
            start_new_session=True,
            restore_signals=True,
        )
    except OSError as exc:
        os.write(pid_fd, f"error {exc.errno or 0} {exc.strerror or exc}\n".encode())
        os.close(pid_fd)
        return 127
    # Ignore signals meant for a terminal or a group (after the start: an ignored signal stays
    # ignored across exec, and the engine must still answer SIGTERM): outlive the engine.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    copier = None
    if engine.stdout is not None:  # the engine's output, secrets masked, into the log
        copier = threading.Thread(
            target=log_filter.copy,
            args=(engine.stdout.fileno(), sys.stdout.buffer, log_filter.LogFilter(secrets)),
            daemon=True,
        )
        copier.start()
    os.write(pid_fd, f"pid {engine.pid}\n".encode())
    os.close(pid_fd)
    if not _adopted(adopt_fd, ADOPT_TIMEOUT_S):
        print(f"calibrate did not record engine PID {engine.pid}: stopping it", flush=True)
        _stop_orphan(engine)
    returncode = engine.wait()
    if copier is not None:
        copier.join(COPY_SETTLE_S)  # its last lines (workers may hold the pipe open longer)
    ended = exit_status.ExitStatus.from_returncode(engine.pid, returncode)
    exit_status.write(status, ended)
    return returncode if returncode >= 0 else 128 - returncode


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m calibrate.server.supervise", allow_abbrev=False
    )
    parser.add_argument("--status", required=True, type=Path)
    parser.add_argument("--pid-fd", required=True, type=int)
    parser.add_argument("--adopt-fd", type=int, default=-1)
    parser.add_argument("--secrets-fd", type=int, default=-1)
    parser.add_argument("engine", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    engine = args.engine[1:] if args.engine[:1] == ["--"] else args.engine
    if not engine:
        parser.error("no engine command after --")
    secrets = _read_secrets(args.secrets_fd)
    return supervise(engine, args.status, args.pid_fd, args.adopt_fd, secrets)


if __name__ == "__main__":
    raise SystemExit(main())
