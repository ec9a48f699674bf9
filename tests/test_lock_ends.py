"""A batch that ends never refuses one that starts: shared holders never refuse each other.

The ending batch asked for the target's lock alone (an flock upgrade) to learn whether to clear
the holder's line; in that instant it held the lock exclusively, and a batch starting then was
refused ("a batch … is already sending load to this target", exit 2). Driven here step by step:
after every lock step the ending holder takes, a starting batch's request is made.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calibrate.errors import UsageError
from calibrate.state import target_lock

FLOCK = fcntl.flock  # the real one: the test below watches the lock's steps through its own


def _shared_request(path: Path) -> bool:
    """What a starting batch asks first (``hold``'s shared, non-blocking flock): granted?"""
    fd = os.open(path, os.O_RDONLY)
    try:
        FLOCK(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


@pytest.mark.parametrize("others", [0, 1])
def test_a_batch_ending_never_refuses_a_batch_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, others: int
) -> None:
    path = target_lock.lock_path(tmp_path, "t")
    ending = False
    refused: list[int] = []

    def flock(fd: int, op: int) -> None:
        FLOCK(fd, op)
        if ending and not _shared_request(path):  # a batch starting right after this step
            refused.append(op)

    monkeypatch.setattr(target_lock.fcntl, "flock", flock)
    with target_lock.hold(tmp_path, "t", "batch", shared=True):
        if others:  # a second batch (another shard) still sending when the first ends
            with target_lock.hold(tmp_path, "t", "batch", shared=True):
                ending = True
        else:
            ending = True
    assert refused == [], f"a starting batch was refused after the lock steps {refused}"
    assert path.read_text() == "", "the last batch to end leaves no holder's line"


def test_the_line_of_a_batch_that_ends_goes_and_the_live_ones_stay(tmp_path: Path) -> None:
    """Two batches hold the lock; the later one ends: its line goes (and so does the line a
    killed batch left), the live batch's stays, and a ladder is still refused naming it."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a PID no process has now: a batch killed by kill -9 left this line
    path = target_lock.lock_path(tmp_path, "t")
    path.parent.mkdir(parents=True)
    path.write_text(f"{gone.pid} batch 2026-01-01T00:00:00Z\n")
    with target_lock.hold(tmp_path, "t", "batch", shared=True):
        with target_lock.hold(tmp_path, "t", "batch", shared=True):
            assert len(path.read_text().splitlines()) == 3
        lines = path.read_text().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"{os.getpid()} batch "), lines
        with pytest.raises(UsageError) as refused, target_lock.hold(tmp_path, "t", "ladder"):
            pass
        assert f"a batch (PID {os.getpid()}" in str(refused.value)
    with target_lock.hold(tmp_path, "t", "ladder"):  # no batch left: the ladder runs
        with (
            pytest.raises(UsageError) as beside,
            target_lock.hold(tmp_path, "t", "batch", shared=True),
        ):
            pass
        assert f"a ladder (PID {os.getpid()}" in str(beside.value)
