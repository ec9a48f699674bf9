"""Two shards with ``--restart`` whose managed server died: one restarts it, the other waits for
that restart and goes on against the same server — never a second engine on the port.

Before, nothing serialised the restart: both shards found the engine gone, both started one,
the second died on the port (or took it), and runs/server.json named whichever wrote last —
seen: the recorded PID dead, the serving engine unrecorded (never stopped by ``server stop``).
The race is held open here, not left to timing: both shards are stopped while the engine is
killed and this test holds the restart lock (as another calibrate process restarting the server
would), so each finds the server gone and waits at its restart; the lock is let go only once
both wait, and then the two race for it. (An earlier form held the port with a socket instead;
a shard that reached its restart 5 s before the other met that socket, not the other shard, and
its restart failed on "port in use" — two restarts, on a busy machine.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from calibrate.io.atomic import pid_lives
from tests.batch_helpers import assert_valid_jsonl, write_tasks
from tests.fakes import free_port
from tests.helpers import restart_lock_held, write_config
from tests.mockserver import REPO

RESTARTING = "; restarting it:"
WAITING = "waiting for that restart"


def _shard(isolated: Path, index: int, tasks: Path) -> subprocess.Popen[str]:
    with open(isolated / f"err{index}.txt", "w") as err:  # the child keeps its own copy
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "calibrate", "batch", "--input", str(tasks)),
                *("--out", f"out{index}.jsonl", "--shard", f"{index}/2", "-c", "2", "--restart"),
                *("--retries", "1", "--backoff-s", "0.05", "--outage-after", "3"),
                *("--outage-s", "60", "--json"),
            ],
            cwd=isolated,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )


def _wait(what: str, done, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what}")
        time.sleep(0.02)


# Not serial: nothing here is timed. The shards are stopped while the engine dies and this test
# holds the restart lock until both wait at it, so a busy machine only makes it take longer.
def test_two_shards_restart_a_dead_managed_server_once_and_both_go_on(cli, isolated: Path) -> None:
    tasks = write_tasks(isolated / "tasks.jsonl", 400)
    port = free_port()
    write_config(
        isolated / "calibrate.toml",
        f"http://127.0.0.1:{port}/v1",
        f'\n[server]\ncommand = "{sys.executable} -m calibrate mock --port {{port}} '
        f'--slots 4 --ttft 0.05 --per-token 0.001"\nport = {port}\n'
        "ready_timeout_s = 30\nstop_timeout_s = 5\n",
    )
    assert cli("server", "start", "--kind", "custom").code == 0
    engine = int((isolated / "runs/server.pid").read_text())
    shards = [_shard(isolated, i, tasks) for i in range(2)]
    errs = [isolated / f"err{i}.txt" for i in range(2)]
    try:
        _wait(
            "both shards to send",
            lambda: (
                all((isolated / f"out{i}.jsonl").exists() for i in range(2))
                and all(
                    len((isolated / f"out{i}.jsonl").read_bytes().splitlines()) >= 5
                    for i in range(2)
                )
            ),
        )
        for shard in shards:
            shard.send_signal(signal.SIGSTOP)
        held_by = f"PID {os.getpid()} is restarting it: {WAITING}"
        with restart_lock_held(isolated):
            os.kill(engine, signal.SIGKILL)
            _wait("the engine to end", lambda: not pid_lives(engine))
            for shard in shards:
                shard.send_signal(signal.SIGCONT)
            _wait(
                "each shard to wait for the restart this test holds",
                lambda: all(held_by in " ".join(e.read_text().split()) for e in errs),
            )
        answers = [shard.communicate(timeout=120)[0] for shard in shards]
    finally:
        for shard in shards:
            if shard.poll() is None:
                shard.kill()
                shard.communicate()
        serving = (isolated / "runs/server.pid").read_text().strip()
        cli("server", "stop")
        for started in re.findall(
            r"restarted as\s+PID\s+(\d+)", "".join(e.read_text() for e in errs)
        ):
            if pid_lives(int(started)):  # a second engine the record no longer names
                os.kill(int(started), signal.SIGKILL)
    said = [" ".join(e.read_text().split()) for e in errs]  # however a line was wrapped
    assert [shard.returncode for shard in shards] == [0, 0], said
    assert sum(text.count(RESTARTING) for text in said) == 1, said  # one shard, once
    assert all(text.count(WAITING) == 1 for text in said), said  # each waited, told once
    reports = [json.loads(answer) for answer in answers]
    assert sorted(r["endpoints"][0]["restarts"] for r in reports) == [0, 1], said
    restarts = [e["detail"] for r in reports for e in r["outages"] if e["event"] == "restart"]
    assert len(restarts) == 2 and all(f"(PID {engine}) was killed" in d for d in restarts)
    (first,) = [shard.pid for shard, text in zip(shards, said, strict=True) if RESTARTING in text]
    assert any(f"by PID {first} as PID {serving}: going on with it" in d for d in restarts)
    assert not [e for r in reports for e in r["outages"] if e["event"] == "restart_failed"]
    rows = [row for i in range(2) for row in assert_valid_jsonl(isolated / f"out{i}.jsonl")]
    assert len({row["id"] for row in rows if row["ok"]}) == 400
