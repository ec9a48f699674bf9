"""``runs/server.restart.lock``: one process at a time (re)starts the managed server.

A ``batch --restart`` that finds another process restarting the server waits for it; a Ctrl-C or
SIGTERM ends that wait, and a stopped batch starts no engine. Before, the wait ran in the probe
thread blind to the stop: the batch went on waiting through its grace period and, once the lock
was let go, restarted the server the user had just stopped it on.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.batch_helpers import assert_valid_jsonl, write_tasks
from tests.fakes import free_port, managed_config, mock_command
from tests.helpers import RESTART_LOCK, calibrate_process, reaped, restart_lock_held
from tests.mockserver import REPO, start_mock

LOCK = RESTART_LOCK
WAITING = "waiting for that restart"


def _wait(what: str, done: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what}")
        time.sleep(0.02)


def _said(root: Path) -> str:
    return (root / "err.txt").read_text("utf-8")


def _has_open(pid: int, name: str) -> bool:
    """Whether process ``pid`` has a file named ``name`` open (a waiter polls the lock's fd)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    found = False
    for fd in fds:
        with contextlib.suppress(OSError):
            found = found or os.readlink(f"/proc/{pid}/fd/{fd}").endswith(name)
    return found


def test_a_stop_ends_the_wait_for_a_restart_and_starts_no_engine(cli, isolated: Path) -> None:
    """The managed endpoint died while the lock is held (another process "restarting" it); a
    second endpoint keeps an item in flight, so the stopped batch lives through its grace
    period. SIGTERM: the wait ends at once (the batch lets go of the lock file), the lock
    released later starts nothing, and a second SIGTERM ends the batch as any Ctrl-C does."""
    tasks = write_tasks(isolated / "tasks.jsonl", 200)
    port = free_port()
    # ready_timeout_s 300: the wait for another's restart lasts up to 2 × 300 + 5 + 30 s
    config = managed_config(isolated, port, mock_command(), ready_timeout_s=300)
    # and the item in flight on the second endpoint outlasts the test (no 30 s timeout ends it)
    config.write_text(config.read_text().replace("timeout_s = 30\n", "timeout_s = 3600\n", 1))
    assert cli("server", "start", "--concurrency", "2").code == 0
    engine = int((isolated / "runs/server.pid").read_text())
    out = isolated / "out.jsonl"
    try:
        # the second endpoint answers its check, then takes hours over each request
        with start_mock(
            ttft_s=0.01, per_token_s=0.001, slow_after=1, slow_after_factor=1e6
        ) as slow:
            args = (
                *("--input", str(tasks), "--out", "out.jsonl", "--restart", "--grace-s", "600"),
                *("--base-url", f"http://127.0.0.1:{port}/v1#c=2"),
                *("--base-url", f"{slow.base_url}#c=1"),
                *("--retries", "1", "--backoff-s", "0.05", "--outage-after", "3"),
                *("--outage-s", "600"),
            )
            held = restart_lock_held(isolated)
            with reaped(_batch(isolated, args)) as proc:
                with held:
                    _wait("5 answers", lambda: out.exists() and out.read_bytes().count(b"\n") >= 5)
                    os.kill(engine, signal.SIGKILL)
                    _wait("the batch to wait for the restart", lambda: WAITING in _said(isolated))
                    proc.send_signal(signal.SIGTERM)
                    _wait("the stop", lambda: "stopping: no new items" in _said(isolated))
                    _wait("the wait to end", lambda: not _has_open(proc.pid, LOCK))
                    assert proc.poll() is None, _said(isolated)  # in its grace period, not ended
                # the lock let go (its holder gave up): the stopped batch starts nothing
                proc.send_signal(signal.SIGTERM)  # a second one abandons the item in flight
                proc.wait(timeout=60)
        said = _said(isolated)
        assert proc.returncode == 130, said
        assert "; restarting it:" not in said and "restarted as" not in said, said
        assert int((isolated / "runs/server.pid").read_text()) == engine  # its record untouched
        rows = assert_valid_jsonl(out)
        assert f"interrupted: {len(rows)} of 200 done, {200 - len(rows)} remaining" in said
        assert "resume with: calibrate batch --input" in said and "Traceback" not in said
    finally:
        cli("server", "stop")


def _batch(root: Path, args: tuple[str, ...]) -> subprocess.Popen[bytes]:
    """``calibrate batch ARGS`` in ``root``, what it says written to err.txt as it goes."""
    with open(root / "err.txt", "w") as err:  # the child keeps its own copy
        return subprocess.Popen(
            [sys.executable, "-m", "calibrate", "batch", *args],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def test_a_start_by_hand_is_refused_while_another_process_restarts_the_server(
    cli, isolated: Path
) -> None:
    """Before, ``server start`` ignored the lock: started beside a batch's restart, both passed
    their port check and two engines raced for the port. Now: exit 2, naming the PID."""
    managed_config(isolated, free_port(), mock_command())
    (isolated / "runs").mkdir()
    with restart_lock_held(isolated):
        result = cli("server", "start", "--concurrency", "2")
    assert result.code == 2, result.err
    said = result.err.strip().splitlines()
    assert said[0] == (
        f"error: PID {os.getpid()} is starting or stopping the managed server (lock {LOCK}); "
        "not started"
    ), said
    assert len(said) == 2 and "calibrate server status" in said[1], said
    assert not (isolated / "runs/server.json").exists()  # nothing started, nothing recorded


def test_a_start_by_hand_holds_the_lock_a_batch_restart_waits_on(isolated: Path) -> None:
    """While ``server start`` brings its engine up, the restart lock is its (a batch that finds
    the server gone waits for this start, then goes on against it)."""
    loading = "import time; print('loading weights...', flush=True); time.sleep(120)"
    managed_config(isolated, free_port(), shlex.join([sys.executable, "-c", loading]))
    with reaped(calibrate_process(isolated, "server", "start")) as proc:
        record = isolated / "runs/server.json"
        _wait("the engine's record", lambda: record.exists() or proc.poll() is not None)
        assert proc.poll() is None, proc.communicate()
        fd = os.open(isolated / LOCK, os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = False
            except BlockingIOError:
                held = True
            holder = os.pread(fd, 32, 0).decode().strip()
        finally:
            os.close(fd)
        proc.send_signal(signal.SIGINT)  # the start stops the engine it was starting
        _, err = proc.communicate(timeout=30)
    assert held and holder == str(proc.pid), (held, holder)
    assert proc.returncode == 130 and "stopped the engine it was starting" in err, err
