"""A managed engine killed by a signal is reported as such everywhere an exit is reported —
tune's line, its table and report, its incident, server start, server stop, rollback — never as
"exit code None" or "exit code -9"."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import threading
from pathlib import Path

import pytest

from calibrate.server import exit_status
from tests.fakes import (
    free_port,
    kill_9,
    managed_config,
    mock_command,
    passing_ladder,
)
from tests.tune_helpers import MOCK, tune_config

pytestmark = pytest.mark.usefixtures("repo_on_pythonpath")

WRONG = re.compile(r"exit code (None|-\d+)|exited with code -\d+")


def test_the_words_for_every_end() -> None:
    assert exit_status.ended_words(-signal.SIGKILL) == "killed by SIGKILL"
    assert exit_status.ended_words(-signal.SIGTERM) == "killed by SIGTERM"
    assert exit_status.ended_words(3) == "exit code 3"
    assert exit_status.ended_words(None) == "its exit status was not recorded"
    assert exit_status.exited(-9) == "was killed by SIGKILL" and exit_status.exited(0).endswith("0")


def test_an_engine_killed_mid_tune_is_said_to_be_killed_by_sigkill(cli, isolated: Path) -> None:
    dying = [sys.executable, "-m", "tests.fakes.dying_engine", "--die-at", "6", *MOCK[4:]]
    tune_config(
        isolated,
        'grid = ["slots=2"]\n',
        command=shlex.join(dying) + " --port {port} --slots {slots}",
    )
    result = cli("tune", "--json")
    assert "crashed (killed by SIGKILL)" in result.err, result.err
    assert not WRONG.search(result.err), result.err
    (candidate,) = result.json["candidates"]
    assert candidate["crashed"] is True and candidate["exit_code"] == -signal.SIGKILL
    run = isolated / "runs" / result.json["run_id"]
    (bundle,) = run.glob("candidates/*/incidents/server.json")
    incident = json.loads(bundle.read_text("utf-8"))
    assert (
        incident["server"]["signal"] == "SIGKILL"
        and "killed by SIGKILL" in (incident["error"]["message"])
    )
    report = cli("report", str(run))
    assert report.code in (0, 1) and "crashed (killed by SIGKILL)" in report.err + report.out
    assert not WRONG.search(report.err + report.out)


def test_server_start_and_stop_say_the_signal(cli, isolated: Path) -> None:
    suicide = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    managed_config(isolated, free_port(), shlex.join([sys.executable, "-c", suicide]))
    start = cli("server", "start")
    assert start.code == 4 and "the server was killed by SIGKILL before it was ready" in start.err
    assert not WRONG.search(start.err)
    managed_config(isolated, free_port(), mock_command())
    started = cli("server", "start", "--concurrency", "1", "--json")
    assert started.code == 0, started.err
    kill_9(started.json["pid"])
    stop = cli("server", "stop", "--json")  # at once: the supervisor may still be writing
    assert "had already ended (killed by SIGKILL)" in stop.err, stop.err
    assert stop.json["exit_code"] == -signal.SIGKILL and stop.json["ended_by"] == "SIGKILL"


def _started_and_measured(cli, root: Path) -> dict[str, int]:
    """A managed mock that answered and passed a ladder (what rollback goes back to); its
    record in runs/server.json (the engine's PID and its supervisor's)."""
    managed_config(root, free_port(), mock_command())
    started = cli("server", "start", "--concurrency", "4", "--json")
    assert started.code == 0, started.err
    single = cli("single", "--json")
    assert single.code == 0, single.err
    passing_ladder(root, single.json["record"]["target"], batch_size=4)
    record: dict[str, int] = json.loads((root / "runs" / "server.json").read_text("utf-8"))
    assert record["pid"] == started.json["pid"] and record["supervisor_pid"] > 0
    return record


def test_rollback_says_how_the_server_it_found_dead_ended(cli, isolated: Path) -> None:
    """Its supervisor writes how it ended after the engine is gone; on a loaded machine that took
    longer than the 2 s rollback waited, and the line lacked "killed by SIGKILL". Here the
    supervisor is held (SIGSTOP) past that while rollback already reads: the wait lasts as long
    as the supervisor lives, so rollback still says how the server ended."""
    record = _started_and_measured(cli, isolated)
    supervisor = record["supervisor_pid"]
    os.kill(supervisor, signal.SIGSTOP)  # a supervisor that gets no CPU for a while
    held = threading.Timer(exit_status.SETTLE_S + 2, os.kill, (supervisor, signal.SIGCONT))
    held.start()  # the supervisor runs again past the old wait, whatever happens here
    try:
        kill_9(record["pid"])
        result = cli("rollback")
    finally:
        held.join()
        cli("server", "stop")
    assert "had already exited, killed by SIGKILL" in result.err, result.err
    assert not WRONG.search(result.err)


def test_rollback_says_when_how_the_server_ended_cannot_be_known(cli, isolated: Path) -> None:
    """Its supervisor gone too (killed before the engine), nothing records how the engine ended:
    rollback says so, at once, rather than leave it out or guess."""
    record = _started_and_measured(cli, isolated)
    kill_9(record["supervisor_pid"])
    kill_9(record["pid"])  # its parent now init, which reaps and tells no one
    try:
        result = cli("rollback")
    finally:
        cli("server", "stop")
    said = f"the managed server (PID {record['pid']}) had already exited, its exit status was not"
    assert said in result.err, result.err
    assert not WRONG.search(result.err)


# an engine that, once calibrate has recorded it, kills its supervisor and then itself: nothing
# is left to record how it ended
ORPHANED = """
import json, os, pathlib, signal, sys, time
record = pathlib.Path(sys.argv[1])
while True:
    try:
        if json.loads(record.read_text())["pid"] == os.getpid():
            break
    except (OSError, ValueError, KeyError):
        pass
    time.sleep(0.01)
supervisor = os.getppid()
os.kill(supervisor, signal.SIGKILL)
while os.getppid() == supervisor:
    time.sleep(0.01)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_server_start_says_when_how_the_server_ended_cannot_be_known(cli, isolated: Path) -> None:
    """It said "was killed by SIGHUP" (a made-up -1) when nothing had recorded the end."""
    record = isolated / "runs" / "server.json"
    command = shlex.join([sys.executable, "-c", ORPHANED, str(record)])
    managed_config(isolated, free_port(), command)
    start = cli("server", "start")
    assert start.code == 4, start.err
    said = "the server exited (its exit status was not recorded) before it was ready"
    assert said in start.err, start.err
    assert "SIGHUP" not in start.err and not WRONG.search(start.err)


def test_no_line_words_an_exit_by_itself() -> None:
    """Every exit is worded by ``exit_status`` (a line formatting ``exit code {n}`` on its own
    prints "exit code -9" for a SIGKILL and "exit code None" when nothing was recorded)."""
    package = Path(exit_status.__file__).parents[1]
    own = re.compile(r"exit(ed with)? code \{|\(exit \{")
    found = [
        f"{path.relative_to(package)}:{n}"
        for path in package.rglob("*.py")
        if path.name != "exit_status.py"
        for n, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if own.search(line)
    ]
    assert found == []
