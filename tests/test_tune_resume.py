"""tune as a separate process: kill -9 mid-grid leaves no orphan once tune runs again, and
redoes only the candidate it was measuring; Ctrl-C stops the server and says how to resume."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.fakes import pid_gone, pythonpath_env
from tests.tune_helpers import LEVELS, MOCK, lines, tune_config

# slower answers than the other tune tests: the kill must land while a candidate is measured
SLOW = shlex.join([*MOCK[:-1], "0.003"]) + (
    " --port {port} --slots {slots} --memory-fraction {memory_fraction} --max-memory-fraction 0.8"
)
GRID = 'grid = ["slots=2,4", "memory_fraction=0.8"]\nwindow = 0.5\n'
# two levels a candidate: long enough to be killed in, short enough to measure again
TWO_LEVELS = LEVELS.replace("[1, 2, 4]", "[1, 2]")


def _spawn(root: Path, stderr: int = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": pythonpath_env()}
    return subprocess.Popen(
        [sys.executable, "-m", "calibrate", "tune"],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )


def _wait(predicate, what: str, timeout_s: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _server_pid(root: Path) -> int | None:
    try:
        return int(json.loads((root / "runs/server.json").read_text("utf-8"))["pid"])
    except (OSError, ValueError, KeyError):
        return None


def _journal(root: Path) -> list[Path]:
    return sorted((root / "runs").glob("*-tune-*/candidates.jsonl"))


def test_resumes_after_sigkill_without_redoing_finished_candidates_or_an_orphan(
    cli, isolated: Path
) -> None:
    tune_config(isolated, GRID, command=SLOW, levels=TWO_LEVELS)
    victim = _spawn(isolated)
    first_pid: list[int] = []

    def second_candidate_running() -> bool:
        journal = _journal(isolated)
        if not journal or len(lines(journal[0])) != 1:
            pid = _server_pid(isolated)
            if pid is not None and not first_pid:
                first_pid.append(pid)
            return False
        pid = _server_pid(isolated)
        measuring = list(journal[0].parent.glob("candidates/c02-*/records.jsonl"))
        return pid is not None and pid not in first_pid and not pid_gone(pid) and bool(measuring)

    try:
        _wait(second_candidate_running, "the second candidate's server")
        orphan = _server_pid(isolated)
        victim.send_signal(signal.SIGKILL)
    finally:
        victim.wait(10)
    assert victim.returncode == -9 and orphan is not None
    assert not pid_gone(orphan), "the server outlived the killed tune (the case to handle)"
    (journal,) = _journal(isolated)
    result = cli("tune", "--json")
    assert result.code == 0, result.err
    assert (
        f"resuming tune run {journal.parent.name}: 1 of 2 candidates already measured" in result.err
    )
    assert pid_gone(orphan), "the next run stopped the server the killed one started"
    ids = [line["id"] for line in lines(journal)]
    assert ids == ["c01", "c02"], ids
    assert result.json["complete"] is True and result.json["winner"] is not None
    assert list(journal.parent.glob("candidates/c02-*.aborted-1")), (
        "the killed attempt is kept aside"
    )


def test_ctrl_c_stops_the_server_and_says_how_to_resume(isolated: Path) -> None:
    tune_config(isolated, GRID, command=SLOW, levels=TWO_LEVELS)
    victim = _spawn(isolated, subprocess.PIPE)
    try:
        _wait(lambda: (p := _server_pid(isolated)) is not None and not pid_gone(p), "a server")
        time.sleep(0.3)  # into the measurement
        server = _server_pid(isolated)
        victim.send_signal(signal.SIGINT)
        _, err = victim.communicate(timeout=20)
    finally:
        if victim.poll() is None:
            victim.kill()
    text = err.decode()
    assert victim.returncode == 130, text
    assert "tune interrupted" in text and "Resume it: calibrate tune" in text
    assert server is not None and pid_gone(server)
    assert not (isolated / "runs/server.json").exists()
    entry = lines(isolated / "runs/ledger.jsonl")[-1]
    assert entry["stage"] == "tune" and entry["interrupted"] and not entry["passed"]
