"""One load-sending stage per target at a time: a second ladder/sweep/rollback exits 2 at once
naming the holder; a batch shares the target with other batches, never with a stage that
measures it; a lock left by a dead process never blocks."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.batch_helpers import write_tasks
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
    assert after.code == 0, after.err  # the dead holder's lock did not block it
    # and the ladder measured both tiers: batch 2 on an idle fast mock passes. (The setting read
    # 1 once in a crowded fresh-clone run: one-wave rounds that noise cannot tell apart, taken
    # conservatively — the setting is the ladder's rule's business, not this test's.)
    assert [t["batch_size"] for t in after.json["tiers"]] == [1, 2], after.err
    assert all(t["verdict"] == "pass" for t in after.json["tiers"]), after.err


def _running(isolated: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "calibrate", *args],
        cwd=isolated,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _holds(isolated: Path, target: str, stage: str) -> None:
    """Wait until a ``stage`` holds the target's lock (its word is in the lock file)."""
    lock = isolated / "runs/locks" / f"{target}.lock"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if lock.exists() and f" {stage} " in lock.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"no {stage} took the lock")


def test_a_batch_never_runs_beside_a_ladder_and_a_ladder_never_beside_a_batch(
    cli, isolated: Path
) -> None:
    """A batch beside a ladder would be measured as the ladder's load (its tier fails, or passes
    on the wrong numbers): each refuses the other at once, exit 2, naming it, sending nothing;
    a second batch (another shard of the job) runs beside the first."""
    with start_mock(ttft_s=0.002, per_token_s=0.0005, slow_above=2, slow_factor=100000.0) as mock:
        target = open_gate(isolated, mock.base_url)
        append_ledger(isolated, "ladder", target, {"last_passing": {"batch_size": 2}})
        tasks = write_tasks(isolated / "tasks.jsonl", 12)
        ladder = _running(isolated, "ladder")
        try:
            _holds(isolated, target, "ladder")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not list(isolated.glob("runs/*/tiers.jsonl")):
                time.sleep(0.05)
            time.sleep(0.5)  # the ladder is inside its slow tier now: it sends nothing more
            sent = mock.model.snapshot().requests_total
            refused = cli("batch", "--input", str(tasks), "--out", "out.jsonl", "-c", "1")
            assert mock.model.snapshot().requests_total == sent, "the batch sent nothing"
        finally:
            ladder.send_signal(signal.SIGKILL)
            ladder.wait()
    assert refused.code == 2, refused.err
    assert f"a ladder (PID {ladder.pid}" in refused.err, refused.err
    assert "already sending load to this target" in refused.err
    assert not (isolated / "out.jsonl").exists(), "a refused batch leaves no --out behind"

    with start_mock(port=mock.port, ttft_s=0.002, per_token_s=0.05) as slow:  # ~1 s an answer
        batch = _running(isolated, "batch", "--input", str(tasks), "--out", "a.jsonl", "-c", "1")
        try:
            _holds(isolated, target, "batch")
            second = cli("ladder")
            beside = cli(
                "batch", "--input", str(tasks), "--out", "b.jsonl", "-c", "4", "--limit", "4"
            )
            still = batch.poll()
        finally:
            batch.send_signal(signal.SIGKILL)
            batch.wait()
        assert slow.model.snapshot().requests_total > 0
    assert still is None, "the first batch ran throughout"
    assert second.code == 2, second.err
    assert f"a batch (PID {batch.pid}" in second.err, second.err
    assert beside.code == 0, beside.err  # a shard beside a shard: both send
    assert len((isolated / "b.jsonl").read_text().splitlines()) == 4


# --- one writer per journal, whatever name reaches it; lock files are never followed ----------


def _alias(isolated: Path, kind: str) -> Path:
    """Another name for ``a.jsonl`` (which exists): a symlink, a hard link, a linked folder."""
    if kind == "symlink":
        (isolated / "b.jsonl").symlink_to("a.jsonl")
        return isolated / "b.jsonl"
    if kind == "hard link":
        os.link(isolated / "a.jsonl", isolated / "c.jsonl")
        return isolated / "c.jsonl"
    (isolated / "linked").symlink_to(isolated)
    return isolated / "linked" / "a.jsonl"


def test_two_batches_never_share_a_journal_through_a_link(cli, isolated: Path) -> None:
    from tests.batch_helpers import batch_process, ok_ids, wait_for_lines, write_tasks
    from tests.helpers import write_config

    tasks = write_tasks(isolated / "tasks.jsonl", 40)
    journal = isolated / "a.jsonl"
    with start_mock(ttft_s=0.15, per_token_s=0.0) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        first = batch_process(isolated, "--input", str(tasks), "--out", str(journal), "-c", "2")
        try:
            wait_for_lines(journal, 1, first)
            sent = server.model.snapshot().requests_total
            for kind in ("symlink", "hard link", "linked folder"):
                other = _alias(isolated, kind)
                second = cli("batch", "--input", str(tasks), "--out", str(other), "-c", "8")
                assert second.code == 2, (kind, second.err)
                assert "in use by another run" in second.err, (kind, second.err)
                assert "Traceback" not in second.err
            # only the first batch's own requests went out meanwhile (2 in flight at most)
            assert server.model.snapshot().requests_total - sent < 40
            _, err = first.communicate(timeout=60)
        finally:
            if first.poll() is None:
                first.kill()
                first.communicate()
    assert first.returncode == 0, err
    lines = journal.read_text("utf-8").splitlines()
    assert len(lines) == 40 and sorted(ok_ids(journal)) == sorted(f"t{i}" for i in range(40))


LOCK_TRAPS = ["symlink", "dangling symlink", "hard link", "fifo"]


def _trap(lock: Path, victim: Path, kind: str) -> None:
    if kind == "symlink":
        lock.symlink_to(victim)
    elif kind == "dangling symlink":
        lock.symlink_to(victim.with_name("created-by-calibrate.txt"))
    elif kind == "hard link":
        os.link(victim, lock)
    else:
        os.mkfifo(lock)


@pytest.mark.parametrize("kind", LOCK_TRAPS)
def test_a_link_planted_at_the_journal_lock_is_never_written_through(
    cli, mock, isolated: Path, kind: str
) -> None:
    from tests.batch_helpers import write_tasks
    from tests.helpers import write_config

    write_config(isolated / "calibrate.toml", mock.base_url)
    tasks = write_tasks(isolated / "tasks.jsonl", 3)
    victim = isolated / "victim.txt"
    victim.write_text("precious\n", "utf-8")
    _trap(isolated / "out.jsonl.lock", victim, kind)
    sent = mock.model.snapshot().requests_total
    started = time.monotonic()
    result = cli("batch", "--input", str(tasks), "--out", "out.jsonl")
    assert time.monotonic() - started < 10, "a FIFO at the lock path must not block"
    assert result.code == 2, result.err
    assert "the lock file" in result.err and "out.jsonl.lock" in result.err
    assert "Traceback" not in result.err
    assert victim.read_text("utf-8") == "precious\n"
    assert not (isolated / "created-by-calibrate.txt").exists()
    assert mock.model.snapshot().requests_total == sent


@pytest.mark.parametrize("kind", LOCK_TRAPS)
def test_a_link_planted_at_the_target_lock_is_never_written_through(
    cli, isolated: Path, kind: str
) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005) as mock:
        target = open_gate(isolated, mock.base_url)
        append_ledger(isolated, "ladder", target, {"last_passing": {"batch_size": 2}})
        victim = isolated / "victim.txt"
        victim.write_text("precious\n", "utf-8")
        (isolated / "runs/locks").mkdir(parents=True, exist_ok=True)
        _trap(isolated / "runs/locks" / f"{target}.lock", victim, kind)
        result = cli("sweep")
    assert result.code == 2, result.err
    assert "the lock file" in result.err and "Traceback" not in result.err
    assert victim.read_text("utf-8") == "precious\n"
    assert not (isolated / "created-by-calibrate.txt").exists()


def test_the_lock_names_a_batch_that_still_holds_it_when_another_has_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two batches hold the lock; the later one ends first: a ladder refused then names the batch
    still sending, never the PID of the one that has ended."""
    from calibrate.errors import UsageError
    from calibrate.state import target_lock

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a PID no process has now
    with target_lock.hold(tmp_path, "t", "batch", shared=True):
        with monkeypatch.context() as patched:
            patched.setattr(target_lock.os, "getpid", lambda: gone.pid)
            with target_lock.hold(tmp_path, "t", "batch", shared=True):
                pass
        with pytest.raises(UsageError) as refused, target_lock.hold(tmp_path, "t", "ladder"):
            pass
    assert f"a batch (PID {os.getpid()}" in str(refused.value)
    assert str(gone.pid) not in str(refused.value)
