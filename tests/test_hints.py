"""Every stage's "next:" hint is what `status` prints next right after (both from pipeline).

Each case runs the real CLI against the real mock: the hint a stage printed (before its
"   (…)" explanation) must equal the "next:" line of the `status` that follows it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import free_port, managed_config, mock_command, pythonpath_env
from tests.helpers import FAKE_KEY
from tests.mockserver import REPO, start_mock
from tests.tier_helpers import jsonl
from tests.workload_helpers import FAST_MOCK, LADDER, calibrated

SWEEP = "[sweep]\nconcurrency = [1, 2]\nlevel_s = 0.1\nrepeats = 1\n"
SERVER = '[server]\nmodel_path = "/models/m"\n'


def hint(err: str) -> str:
    """The command of the last "next:" line a stage printed ("" when it printed none)."""
    lines = [line for line in err.splitlines() if line.startswith("next: ")]
    return lines[-1][len("next: ") :].split("   (")[0].strip() if lines else ""


def status_next(cli: Any) -> str:
    result = cli("status")
    assert result.code == 0, result.err
    return hint(result.err)


def agrees(cli: Any, *args: str) -> str:
    """Run ``calibrate ARGS``; it passes and its hint is status's next. Returns the hint."""
    result = cli(*args)
    assert result.code == 0, result.err
    said = hint(result.err)
    assert said, f"`calibrate {' '.join(args)}` passed but printed no next: hint"
    assert said == status_next(cli), f"`calibrate {' '.join(args)}` said next: {said}"
    return said


def test_each_stage_of_the_main_line_says_what_status_says(cli, isolated: Path) -> None:
    with start_mock(**FAST_MOCK) as mock:
        calibrated_extra = LADDER + "batch_sizes = [1, 2]\n" + SWEEP + SERVER
        from tests.helpers import write_config

        write_config(isolated / "calibrate.toml", mock.base_url, calibrated_extra)
        assert agrees(cli, "single") == "calibrate repro"
        assert agrees(cli, "repro", "--runs", "1") == "calibrate ladder"
        assert agrees(cli, "ladder") == "calibrate sweep"
        assert agrees(cli, "sweep") == "calibrate pin"
        pinned = agrees(cli, "pin", "--kind", "vllm")
        # the same server is the restarted one here: verify, then the production run
        assert agrees(cli, "verify") == "calibrate batch --input tasks.jsonl --out out.jsonl"
    assert pinned.startswith("calibrate server start --script scripts/launch.sh")
    assert pinned.endswith("then: calibrate verify")


def test_a_context_ladder_says_the_next_step_of_the_main_line(cli, isolated: Path) -> None:
    with start_mock(**FAST_MOCK, max_model_len=4096) as mock:
        calibrated(cli, isolated, mock.base_url, LADDER + "batch_sizes = [1, 2]\n" + SWEEP)
        lengths = ("--context-lengths", "512,1024")
        # before the batch ladder: the main line still needs it
        assert agrees(cli, "ladder", "--axis", "context", *lengths) == "calibrate ladder"
        assert agrees(cli, "ladder") == "calibrate sweep"
        # after it: a context ladder does not send the user back to the batch ladder
        assert agrees(cli, "ladder", "--axis", "context", *lengths) == "calibrate sweep"


@pytest.fixture
def _managed_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", pythonpath_env())
    monkeypatch.setenv("CALIBRATE_API_KEY", FAKE_KEY)


def _kill_server_after_tiers(root: Path, tiers: int) -> threading.Thread:
    """SIGKILL the managed server once the ladder has written ``tiers`` tier rows."""

    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = list(root.glob("runs/*-ladder-*/tiers.jsonl"))
            if done and len(jsonl(done[0])) >= tiers:
                time.sleep(0.3)  # the next tier's requests are in flight (and hang)
                pid = int(__import__("json").loads((root / "runs/server.json").read_text())["pid"])
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.usefixtures("_managed_env")
def test_a_ladder_whose_managed_server_died_sends_the_user_to_rollback(cli, isolated: Path) -> None:
    port = free_port()
    # batch 1 and 2 answer at once; past 2 in flight every token takes minutes: batch 4 hangs
    command = mock_command("--slow-above", "2", "--slow-factor", "100000")
    extra = LADDER + "batch_sizes = [1, 2, 4]\n" + SWEEP
    managed_config(isolated, port, command, extra=extra)
    try:
        assert cli("server", "start", "--concurrency", "4").code == 0
        assert cli("single").code == 0 and cli("repro", "--runs", "1").code == 0
        killer = _kill_server_after_tiers(isolated, 2)
        ladder = cli("ladder", "--json")
        killer.join(timeout=5)
        assert ladder.code == 0, ladder.err  # batch 2 passed: the ladder found its ceiling
        assert ladder.json["server_died"] is True, ladder.err
        said = hint(ladder.err)
        assert said == "calibrate rollback", ladder.err  # not "calibrate sweep": no server
        assert said == status_next(cli)
        # the rollback restarts the server at batch 2; its hint and status agree again
        assert agrees(cli, "rollback") == "calibrate batch --input tasks.jsonl --out out.jsonl"
    finally:
        cli("server", "stop")


def test_status_shows_an_interrupted_sweep_as_interrupted(cli, isolated: Path) -> None:
    long_level = "[sweep]\nconcurrency = [1]\nlevel_s = 60\nrepeats = 1\n"  # stopped long before
    with start_mock(**FAST_MOCK) as mock:
        calibrated(cli, isolated, mock.base_url, LADDER + "batch_sizes = [1]\n" + long_level)
        assert cli("ladder").code == 0
        log = isolated / "sweep.err"
        with log.open("w", encoding="utf-8") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "calibrate", "sweep"],
                cwd=isolated,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and proc.poll() is None:
                if "sweep: concurrency 1" in log.read_text(encoding="utf-8"):
                    break  # the level has begun
                time.sleep(0.05)
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        err = log.read_text(encoding="utf-8")
        assert proc.returncode == 130, err
        status = cli("status")
    line = next(x for x in status.err.splitlines() if x.strip().startswith("sweep"))
    assert "interrupted" in line and "FAILED" not in line, status.err
    assert hint(status.err) == "calibrate sweep"  # run it again


@pytest.mark.usefixtures("_managed_env")
def test_after_tune_the_hint_and_status_both_say_pin(cli, isolated: Path) -> None:
    """A passing tune stands in for the sweep: the next step is to pin its winner's flags."""
    from tests.fakes import append_ledger
    from tests.tune_helpers import tune_config

    grid = 'grid = ["slots=1,2", "kv_tokens=50000"]\nmemory_fractions = [0.8]\n'
    target = tune_config(isolated, grid)
    (isolated / "baselines").mkdir()
    (isolated / "baselines/single.jsonl").write_text("{}\n", encoding="utf-8")
    append_ledger(isolated, "single", target, {})
    append_ledger(isolated, "repro", target, {})
    assert status_next(cli) == "calibrate sweep"  # before the tune: the main line's next step
    assert agrees(cli, "tune") == "calibrate pin"
    pinned = agrees(cli, "pin")
    assert pinned.startswith("calibrate server start --script") and pinned.endswith("verify")
