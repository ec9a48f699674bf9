"""An engine log that cannot be written — runs/server.log a folder, a FIFO, a link to /dev/full,
or a full disk — is exit 2 naming the file before any engine starts (it was exit 4, "cannot start
calibrate: Is a directory / Is the engine installed and on PATH?"), in every command that starts
an engine (server start, tune)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import free_port, managed_config, mock_command
from tests.helpers import REPO
from tests.tune_helpers import tune_config

pytestmark = pytest.mark.usefixtures("repo_on_pythonpath")


def _spoil(log: Path, how: str) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    if how == "a folder":
        log.mkdir()
    elif how == "a FIFO (named pipe)":
        os.mkfifo(log)
    else:
        log.symlink_to("/dev/full")


@pytest.mark.parametrize("how", ["a folder", "a FIFO (named pipe)", "a character device"])
@pytest.mark.parametrize("command", ["server start", "tune"])
def test_an_engine_log_that_is_not_a_file_is_exit_2_naming_it(
    cli, isolated: Path, how: str, command: str
) -> None:
    if command == "tune":
        tune_config(isolated, 'grid = ["slots=1", "kv_tokens=50000"]\n')
    else:
        managed_config(isolated, free_port(), mock_command())
    _spoil(isolated / "runs/server.log", how)
    result = cli(*command.split(), *(["--concurrency", "1"] if command != "tune" else []))
    assert result.code == 2, result.err
    assert f"the engine's log runs/server.log is {how}" in result.err
    assert "installed" not in result.err and "Traceback" not in result.err
    assert not (isolated / "runs/server.json").exists(), "no engine was started"


def _no_room() -> None:  # in the child: every file write past 0 bytes fails (EFBIG)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def test_an_engine_log_on_a_full_disk_is_exit_2_naming_it(isolated: Path) -> None:
    managed_config(isolated, free_port(), mock_command())
    done = subprocess.run(
        [sys.executable, "-m", "calibrate", "server", "start", "--concurrency", "1"],
        cwd=isolated,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        preexec_fn=_no_room,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "cannot write the engine's log runs/server.log: File too large" in done.stderr
    assert "nothing was started" in done.stderr and "Traceback" not in done.stderr
    assert not (isolated / "runs/server.log").exists(), "no empty log left behind"
    assert not (isolated / "runs/server.json").exists()
