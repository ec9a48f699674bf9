"""One load-sending stage per target at a time: a second ladder/sweep/rollback exits 2 at once
naming the holder; a lock left by a dead process never blocks."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.fakes import append_ledger
from tests.mockserver import REPO, start_mock
from tests.tier_helpers import FAST, open_gate


def test_a_second_load_stage_on_the_same_target_exits_2_naming_the_holder(
    cli, isolated: Path
) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, slow_above=2, slow_factor=100000.0) as mock:
        target = open_gate(isolated, mock.base_url)
        append_ledger(isolated, "ladder", target, {"last_passing": {"batch_size": 2}})
        proc = subprocess.Popen(
            [sys.executable, "-m", "calibrate", "ladder"],
            cwd=isolated,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not list(isolated.glob("runs/*/tiers.jsonl")):
                time.sleep(0.05)
            time.sleep(0.5)  # the subprocess is inside its slow tier now
            for stage in ("ladder", "sweep", "rollback"):
                started = time.monotonic()
                second = cli(stage)
                assert second.code == 2, second.err
                assert time.monotonic() - started < 5
                assert f"a ladder (PID {proc.pid}" in second.err
                assert "already sending load to this target" in second.err
                assert "Traceback" not in second.err
            runs = [p.name for p in (isolated / "runs").iterdir() if p.is_dir()]
            assert [r for r in runs if r != "locks" and "-ladder-" not in r] == [], runs
            assert len(runs) == 2, "only the holder's run folder (and the locks) exist"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    # kill -9 left the lock file with the dead holder's PID in it: it does not block
    lock = isolated / "runs/locks" / f"{target}.lock"
    assert re.match(rf"{proc.pid} ladder ", lock.read_text())
    (isolated / "calibrate.toml").write_text(
        (isolated / "calibrate.toml").read_text().replace(FAST, FAST + "batch_sizes = [1, 2]\n")
    )
    with start_mock(port=mock.port, ttft_s=0.002, per_token_s=0.0005):  # same URL, same target
        after = cli("ladder", "--json")
    assert after.code == 0, after.err
    assert after.json["last_passing"]["batch_size"] == 2
