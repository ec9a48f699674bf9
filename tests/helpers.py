"""Helpers the tests import: the fake key, a target's config file, a run folder's text, the CLI's
result, a calibrate child process that never outlives its test."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAKE_KEY = "sk-calibrate-test-0123456789abcdef"
REPO = Path(__file__).resolve().parent.parent


@dataclass
class CliResult:
    """What ``calibrate ARGS`` run in-process gave back: exit code, stdout, stderr.

    ``err`` is what the command said, each message in one line (``calibrate.cli.lines.unfit``:
    a log wraps prose at 100 columns); ``printed`` is stderr exactly as printed."""

    code: int
    out: str
    err: str
    printed: str = ""

    @property
    def json(self) -> Any:
        return json.loads(self.out.strip().splitlines()[-1])


def said(stderr: str) -> str:
    """A calibrate child's stderr with each wrapped message joined back into one line."""
    from calibrate.cli.lines import unfit
    from calibrate.cli.output import log_width

    return unfit(stderr, log_width())


# The suite reads tables, not pictures: a ladder's or sweep's plot.png is 0.3 s of CPU, and the
# parallel part drew 233 of them in its own processes alone (77 s of its 287 s of in-process
# CPU). A config that names its own [report] (the tests of plot.png) draws them.
NO_PLOT = "[report]\nplot = false\n"


def write_config(path: Path, base_url: str, extra: str = "", *, model: str = "internlm-s2") -> Path:
    """A calibrate.toml naming the target (30 s timeout), plus ``extra`` TOML after it; no
    plot.png unless ``extra`` has a [report] table."""
    report = "" if "[report]" in extra else "\n" + NO_PLOT  # last: extra may go on [target]
    path.write_text(
        f'[target]\nbase_url = "{base_url}"\nmodel = "{model}"\ntimeout_s = 30\n{extra}{report}',
        encoding="utf-8",
    )
    return path


def all_files_text(root: Path) -> str:
    """Every file under ``root`` as text, joined: what a secret must never appear in."""
    return "\n".join(
        p.read_text(encoding="utf-8", errors="replace") for p in root.rglob("*") if p.is_file()
    )


def calibrate_process(root: Path, *args: str) -> subprocess.Popen[str]:
    """``python -m calibrate ARGS`` in ``root`` from this checkout; stdout and stderr as text.
    SIGABRT makes it print every thread's stack (``stacks_of``), for a test it outlived."""
    return subprocess.Popen(
        [sys.executable, "-m", "calibrate", *args],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextlib.contextmanager
def reaped(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """``proc`` for the block; killed after it if still running, whatever the test asserted."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def stacks_of(proc: subprocess.Popen[str]) -> str:
    """Where a ``calibrate_process`` that should have ended is stuck: its threads' stacks (the
    faulthandler's dump on SIGABRT) and what it had printed."""
    proc.send_signal(signal.SIGABRT)
    try:
        return proc.communicate(timeout=10)[1]
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()[1]


def kill_9(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc`` and wait for it; it died of that signal."""
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGKILL


# A whole, ordinary chat completion: what a canned server answers for one fixed-prompt call.
CHAT_REPLY: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "internlm-s2",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


RESTART_LOCK = "runs/server.restart.lock"


@contextlib.contextmanager
def restart_lock_held(root: Path) -> Iterator[None]:
    """``runs/server.restart.lock`` under ``root`` held by this test, its PID in it, as another
    calibrate process starting or stopping the managed server holds it."""
    path = root / RESTART_LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)
