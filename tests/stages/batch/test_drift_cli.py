"""The batch watches its drift from the calibration, end to end: a real ladder on the mock, then
the real ``calibrate batch`` against the same target — a mock that slows down after N items
(``calibrate mock --slow-after N``) warns once, with the numbers and a cause, records it in the
run and the ledger, and ``calibrate status`` shows it; a healthy batch never warns, not with a
CPU hog beside it. The setting is never changed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from calibrate.cli import main
from tests.batch_helpers import batch_process, write_tasks
from tests.mockserver import MockProcess
from tests.tier_helpers import FAST, jsonl, open_gate

# ~0.14 s an answer on 4 slots: about 28 items/s at 4 in flight
MOCK = ("--ttft", "0.02", "--per-token", "0.004", "--slots", "4")
# ~0.095 s an answer: about 42 items/s at 4 in flight, and 4× slower still ~10 items/s, so a slow
# window closes on its 4 × C items (1.6 s; at 7 items/s it took 2.3 s)
QUICK = ("--ttft", "0.02", "--per-token", "0.0025", "--slots", "4")
# the batch's concurrency (4) is the one tier it is compared with; the tiers below it only cost time
LADDER = FAST + "batch_sizes = [4]\n"
# the batches are a few seconds: their drift windows last half a second at least (a user's
# --drift-window-s), not the default 2 s — a 2 s window held ~85 fast answers, half a second ~21
WINDOWS = ("--drift-window-s", "0.5")
# the quick mock's first 60 answers (~1.4 s: two windows or three) are fast; the next 90 take
# the window the slowdown begins in, the 3 slow windows in a row that make drift (16 answers,
# 1.6 s each) and one more
SLOW_AFTER, ITEMS = 60, 150


def _calibrated(cli: Any, root: Path, mock_args: tuple[str, ...] = MOCK) -> int:
    """A passing ladder (batch 4) of the mock; the port its target is at."""
    with MockProcess(*mock_args) as mock:
        open_gate(root, mock.base_url, LADDER)
        ladder = cli("ladder", "--json")
        assert ladder.code == 0, ladder.err
        return mock.port


@pytest.fixture(scope="module")
def quick_template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    """Once a module: the quick mock's passing ladder (batch 4) in a folder of its own, and the
    port its target is at. The tests only read the calibration; each gets a copy (``quick``)."""
    root = tmp_path_factory.mktemp("calibrated")
    with MockProcess(*QUICK) as mock, pytest.MonkeyPatch.context() as env:
        for name in list(os.environ):
            if name.startswith("CALIBRATE_") or name == "OPENAI_API_KEY":
                env.delenv(name)
        env.chdir(root)
        open_gate(root, mock.base_url, LADDER)
        with open(os.devnull, "w") as quiet, redirect_stdout(quiet), redirect_stderr(quiet):
            assert main(["ladder"]) == 0, "the quick mock's ladder did not pass"
        port = mock.port
    yield root, port


@pytest.fixture
def quick(quick_template: tuple[Path, int], isolated: Path) -> int:
    """The module's calibration of the quick mock, copied into this test's directory; its port."""
    root, port = quick_template
    shutil.copytree(root, isolated, dirs_exist_ok=True, symlinks=True)
    return port


def _setting(cli: Any) -> Any:
    status = cli("status", "--json")
    assert status.code == 0, status.err
    return status.json


def _drift_rows(root: Path, run_id: str) -> list[dict[str, Any]]:
    return jsonl(root / "runs" / run_id / "drift.jsonl")


def _junit_drift(path: Path, err: str) -> None:
    """--junit says the drift line the summary says, word for word: a passing case for "drift:
    none", else the line as its <skipped> message (a warning, never a <failure>: exit 0 stays
    green)."""
    said = [line for line in err.replace("\n  ", " ").splitlines() if "drift: " in line]
    (case,) = [c for c in ET.parse(path).iter("testcase") if c.get("name", "").startswith("drift")]
    assert case.find("failure") is None, ET.tostring(case)
    skipped = case.find("skipped")
    if skipped is None:
        assert len(said) == 1 and said[0].startswith("drift: none — "), said
        return
    message = " ".join(skipped.get("message", "").split())  # word for word, however wrapped
    assert any(message in " ".join(line.split()) for line in said), f"{message!r} not in {said!r}"


@pytest.mark.parametrize("workers", ["1", "2"])  # 2: the watch sees the workers' lines
def test_a_mock_that_slows_after_n_items_warns_once_records_it_and_status_shows_it(
    cli: Any, isolated: Path, quick: int, workers: str
) -> None:
    port = quick
    before = _setting(cli)
    tasks = write_tasks(isolated / "tasks.jsonl", ITEMS)
    slows = ("--port", str(port), "--slow-after", str(SLOW_AFTER), "--slow-after-factor", "4")
    with MockProcess(*QUICK, *slows):
        args = ("--out", "out.jsonl", "-c", "4", "--workers", workers, "--json", "--junit", "j.xml")
        result = cli("batch", "--input", str(tasks), *args, *WINDOWS)
    assert result.code == 0, result.err
    _junit_drift(isolated / "j.xml", result.err)  # CI reads what the summary says
    (drift,) = result.json["drift"]
    if not drift["compared"]:  # calibrated beside CPU burners: its runs 5.41–23.8 items/s
        assert "too far apart to tell a slower server" in drift["text"], drift
        assert "drift: not compared" in result.err and "drift: the server" not in result.err
        return
    if drift["windows_off_at_end"]:  # a busy machine left fewer judged slow windows than drift
        # takes (seen: the slowdown from item 209 on, 2 windows): "undecided", never "none"
        assert drift["at_item"] > SLOW_AFTER and not drift["drifted"], drift
        assert "drift: undecided" in result.err and "drift: none" not in result.err
        assert "whether it lasted is not known" in drift["text"], drift
        return
    if not drift["drifted"]:  # calibrated beside a loaded suite: its runs 16.3–27.3 items/s
        # admit 3.9× the expected latency, and the mock is 4× slower (less what the client's own
        # threads waited): "none" then says how much slower would read within its runs' noise
        admits = float(drift["text"].split("within which a latency up to ")[1].split("×")[0])
        assert admits > 3, drift  # a calibration that could tell 4× must have told it
        assert "drift: none" in result.err and "drift: the server" not in result.err
        return
    assert result.err.count("drift: the server is slower than calibrated") == 1, result.err
    said = result.err.split("drift: the server is slower than calibrated", 1)[1]
    assert "items/s against" in said and "calibrated (its runs" in said and "p50 " in said
    assert "likely cause: " in said and "The setting is unchanged" in said
    assert drift["compared"] and drift["drifted"] and drift["causes"], drift
    assert drift["calibration"]["stage"] == "ladder" and drift["calibration"]["concurrency"] == 4
    rows = _drift_rows(isolated, result.json["run_id"])  # every window, in the run's folder
    # drift is found from the window that holds the first slow answer on, never before it
    turn = next(r for r in rows if r["first_item"] + r["items"] > SLOW_AFTER)
    assert drift["at_item"] >= turn["first_item"] > rows[0]["first_item"], rows
    assert drift["items_per_s"] < drift["calibration"]["items_per_s"]
    # slower than its own start: 4× by the mock's answers, 1.9× once beside two CPU burners (the
    # client's own waits set part of the pace at the start and after)
    assert drift["items_per_s"] < rows[0]["items_per_s"], rows
    assert len(rows) >= drift["windows_judged"] >= 4 and rows[0]["judged"], rows
    ledger = jsonl(isolated / "runs/ledger.jsonl")
    assert ledger[-1]["stage"] == "batch" and ledger[-1]["summary"]["drift"][0]["drifted"]

    status = cli("status")
    assert status.code == 0
    shown = " ".join((status.out + status.err).split())
    assert f"last batch that watched its drift: run {result.json['run_id']}" in shown
    assert "drift: slower than calibrated from item" in status.err, status.out + status.err
    after = _setting(cli)
    assert after["drift"]["run_id"] == result.json["run_id"]
    assert after["drift"]["endpoints"][0]["drifted"]
    assert after["setting"] == before["setting"]  # watched, never changed


def test_a_calibration_too_noisy_to_hold_a_batch_to_says_so_in_the_summary(
    cli: Any, isolated: Path, quick: int
) -> None:
    """A calibration whose own runs lie far apart (beside CPU burners: 5.41–23.8 items/s around
    8.82) cannot tell a slower server from its own noise: the batch says so, with the stage to
    measure again, in its summary as in --json — never "drift: none", never silent. The range is
    widened in the ledger, as a noisy machine would have recorded it, so the case is certain
    (on a quiet machine the ladder's rounds agree)."""
    port = quick
    ledger = isolated / "runs/ledger.jsonl"
    entries = jsonl(ledger)
    assert entries[-1]["stage"] == "ladder"
    (tier,) = [t for t in entries[-1]["summary"]["tiers"] if t["batch_size"] == 4]
    middle = tier["measured"]["items_per_s"]
    tier["measured"].update(items_per_s_min=middle * 0.6, items_per_s_max=middle * 2.7)
    ledger.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    tasks = write_tasks(isolated / "tasks.jsonl", 80)  # ~2 s: a window or two to judge
    with MockProcess(*QUICK, "--port", str(port)):
        args = ("--out", "out.jsonl", "-c", "4", "--json", "--junit", "j.xml", *WINDOWS)
        result = cli("batch", "--input", str(tasks), *args)
    assert result.code == 0, result.err
    _junit_drift(isolated / "j.xml", result.err)
    (drift,) = result.json["drift"]
    assert not drift["compared"] and "too far apart to tell a slower server" in drift["text"]
    assert drift["rerun"] == "calibrate ladder", drift
    said = [line for line in result.err.splitlines() if line.startswith("drift: ")]
    assert len(said) == 1 and said[0].startswith("drift: not compared — "), result.err
    assert said[0].endswith("Measure it again on a quieter machine: calibrate ladder"), said


@pytest.mark.serial  # a process spinning a core beside it: alone, or it slows the other tests
def test_a_healthy_batch_never_warns_not_with_a_cpu_hog_beside_it(cli: Any, isolated: Path) -> None:
    port = _calibrated(cli, isolated)
    # ~3.6 s at 28 items/s: windows of half a second at least (16 answers, ~0.6 s), so three or
    # more are judged (the last is the run's end), as many as drift takes in a row — fewer, and
    # it could not have been found (not compared)
    tasks = write_tasks(isolated / "tasks.jsonl", 100)
    # the hog is the batch's sibling, not its child: "other processes" to its noise meter
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with MockProcess(*MOCK, "--port", str(port)):
            args = ("--input", str(tasks), "--out", "out.jsonl", "-c", "4", "--json", *WINDOWS)
            batch = batch_process(isolated, *args)
            out, err = batch.communicate(timeout=120)
        assert hog.poll() is None, "the hog ended before the batch did"
    finally:
        hog.kill()
        hog.wait()
    assert batch.returncode == 0, err
    assert "drift: the server" not in err and "warning: drift" not in err, err
    (drift,) = json.loads(out)["drift"]
    rows = _drift_rows(isolated, json.loads(out)["run_id"])
    assert drift["compared"] and not drift["drifted"] and drift["windows_judged"] >= 3, rows
    others = [r["noise_other_cpu_cores"] for r in rows if r["judged"]]  # the machine, read
    assert None not in others and max(others) >= 0.8, rows  # the hog's core among "others"


# the breaker opens (3 refused in a row) and probes at 0, 1, 3 s; or, back within the items'
# retries (8, from 0.2 s), it never opens: only the server's /metrics say it restarted
BREAKER = ("--retries", "2", "--backoff-s", "0.05", "--outage-after", "3")
RETRIES = ("--retries", "8", "--backoff-s", "0.2", "--outage-after", "1000")


@pytest.mark.parametrize(("outage", "down_s"), [(BREAKER, 2.5), (RETRIES, 1.5)])
def test_a_server_that_died_and_came_back_is_never_one_run_of_drift_with_its_old_self(
    cli: Any, isolated: Path, quick: int, outage: tuple[str, ...], down_s: float
) -> None:
    """The mock slows 4× after 60 items and is killed at item 100 (two slow windows in a row,
    the third holds the kill); a few seconds later another mock on its port answers, slow from
    its first item (restarted with other flags). The windows that held the outage and the
    restart are left out — whether the batch's breaker saw the outage or only the server's
    /metrics said it (its counters from 0) — and no run of windows spans them: drift, if found,
    is the new server's, from a window after them. (It said "drift: the server is slower than
    calibrated from item 166 on (3 windows in a row …)": two windows of the old server and one
    of the new.) The summary and ``status`` say the windows left out and why."""
    port = quick
    tasks = write_tasks(isolated / "tasks.jsonl", ITEMS + 30)
    out = isolated / "out.jsonl"
    slow = ("--slow-after-factor", "4", "--port", str(port))
    old = MockProcess(*QUICK, *slow, "--slow-after", str(SLOW_AFTER))
    revived: list[MockProcess] = []

    def kill_then_revive() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            not out.exists() or out.read_bytes().count(b"\n") < SLOW_AFTER + 40
        ):
            time.sleep(0.01)
        old.stop(signal.SIGKILL)
        time.sleep(down_s)
        revived.append(MockProcess(*QUICK, *slow, "--slow-after", "0"))

    thread = threading.Thread(target=kill_then_revive, daemon=True)
    thread.start()
    try:
        result = cli(
            "batch",
            "--input",
            str(tasks),
            "--out",
            "out.jsonl",
            "-c",
            "4",
            *outage,
            "--outage-s",
            "60",
            "--json",
            *WINDOWS,
        )
        thread.join()
    finally:
        old.stop()
        for mock in revived:
            mock.stop()
    assert result.code == 0, result.err
    events = [e["event"] for e in result.json["outages"]]
    assert events[:2] == ["down", "up"] if outage == BREAKER else events == [], events
    (drift,) = result.json["drift"]
    rows = _drift_rows(isolated, result.json["run_id"])
    left = [r for r in rows if r["left_out"]]
    assert left and not any(r["judged"] for r in left), rows
    assert "restart" in drift["windows_left_out"], rows  # the mock's counters began from 0
    assert sum(drift["windows_left_out"].values()) == len(left), drift
    said = " ".join(result.err.split())
    assert "left out: " in said and "(no run of windows spans one)" in said, result.err
    if not drift["compared"]:  # calibrated beside CPU burners
        assert "too far apart to tell a slower server" in drift["text"], drift
        return
    back = max(r["first_item"] + r["items"] for r in left)  # the first item after the outage
    if drift["drifted"] or drift["windows_off_at_end"]:  # the new server's windows, only
        assert drift["at_item"] >= back, (drift["at_item"], back, rows)
    else:  # calibrated beside a loaded suite: its runs admit a server 4× slower
        admits = float(drift["text"].split("within which a latency up to ")[1].split("×")[0])
        assert admits > 3, drift
    status = cli("status")
    assert status.code == 0
    shown = " ".join((status.out + status.err).split())
    assert "left out: " in shown and "(no run of windows spans one)" in shown, shown
