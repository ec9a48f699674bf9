"""Ctrl-C, SIGHUP and SIGTERM on a real `python -m calibrate batch` process: clean stop, resume, rerun."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.batch_helpers import (
    assert_each_item_once,
    batch_process,
    ok_ids,
    results,
    wait_for_lines,
    write_tasks,
)
from tests.helpers import reaped, write_config
from tests.mockserver import start_mock


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_ctrl_c_stops_cleanly_prints_resume_and_rerun_completes(
    cli, isolated: Path, sig: signal.Signals
) -> None:
    write_tasks(isolated / "tasks.jsonl", 200)
    out = isolated / "out.jsonl"
    with start_mock(ttft_s=0.03, per_token_s=0.0005) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        args = ("--input", "tasks.jsonl", "--out", "out.jsonl", "-c", "4")
        with reaped(batch_process(isolated, *args)) as proc:
            wait_for_lines(out, 20, proc)
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=15)
        assert proc.returncode == 130, err
        assert "Traceback" not in err
        assert "stopping: no new items" in err
        assert "resume with: calibrate batch --input tasks.jsonl --out out.jsonl -c 4" in err
        done = len(ok_ids(out))
        assert 20 <= done < 200
        assert f"interrupted: {done} of 200 done, {200 - done} remaining" in err
        assert out.read_bytes().endswith(b"\n")  # in-flight items finished and were flushed

        again = cli("batch", *args, "--json")
    assert again.code == 0, again.err
    assert again.json["skipped"] == done and again.json["done"] == 200 - done
    assert_each_item_once(out, 200)


def test_sigterm_abandons_slow_items_after_the_grace_period(isolated: Path) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 10)
    with start_mock(ttft_s=5.0, per_token_s=0.0) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        args = ("--input", str(tasks), "--out", "out.jsonl", "-c", "2", "--grace-s", "0.5")
        with reaped(batch_process(isolated, *args)) as proc:
            deadline = time.monotonic() + 15
            while server.model.snapshot().in_flight < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            stopped_at = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=10)
            took_s = time.monotonic() - stopped_at
    assert proc.returncode == 130, err
    assert took_s < 3.0, f"took {took_s:.1f} s to stop with --grace-s 0.5"
    assert "interrupted: 0 of 10 done, 10 remaining (2 abandoned in flight)" in err
    assert not results(isolated / "out.jsonl")


def test_a_sample_stopped_before_its_end_is_not_said_to_pass(isolated: Path) -> None:
    """Ctrl-C during `--sample 10`: the outputs that came had one shape, and the sample said
    "sample passed: every output has the same shape; run the batch with --out" from a part of
    it (exit 130 all the same). What was read, and that the rest is unknown, is said now."""
    tasks = write_tasks(isolated / "tasks.jsonl", 10)
    with start_mock(ttft_s=0.3, per_token_s=0.0) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        args = ("--input", str(tasks), "--sample", "10", "-c", "2")
        with reaped(batch_process(isolated, *args)) as proc:
            deadline = time.monotonic() + 15
            while server.model.snapshot().in_flight < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=15)
    assert proc.returncode == 130, err
    said = " ".join(err.split())
    assert "sample passed" not in said
    assert "sample incomplete: " in said and " of 10 outputs (interrupted)" in said
