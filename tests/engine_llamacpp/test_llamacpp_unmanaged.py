"""A llama-server calibrate does NOT manage: a user's `llama-server --parallel 4` already running.

The numbers a user pins come from here: the sweep's knee (SPEC §5.6: against the best level so
far, repeated when ranges overlap) and the ladder's ceiling at the server's own cap (§5.3
``stop: cap``, read from /props ``total_slots``). Run with ``make test-engine ENGINE=llamacpp``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.engine_llamacpp.helpers import GGUF, MODEL_NAME, free_port

pytestmark = pytest.mark.engine

SLOTS = 4
SWEEPS = 5
GAIN_MIN = 0.10  # [sweep] gain_min's default
# Issue 22 asks for the knee at 4 in at least 4 of 5 sweeps on a loaded 2-core box. Measured
# (one compute thread, 2-core box): 3 of 5 in every run, loaded or idle — the others had 4 adding
# under gain_min over 2, which makes 2 the knee by the rule. How often 4 clearly beats 2 on a
# shared CPU is luck; what is asserted is the rule: no level above the knee clearly beats it.


def show(text: str) -> None:
    sys.__stdout__.write(text + "\n")
    sys.__stdout__.flush()


@pytest.fixture
def unmanaged(isolated: Path, llamacpp_bin: Path) -> Iterator[str]:
    """``llama-server --parallel 4`` started by the test, as a user would; calibrate.toml has no
    [server] section, so calibrate only talks to it. Stopped by PID after the test."""
    port = free_port()
    log = (isolated / "llama-server.log").open("wb")
    argv = [
        str(llamacpp_bin),
        "-m",
        str(GGUF),
        "--alias",
        MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--parallel",
        str(SLOTS),
        "-c",
        str(SLOTS * 512),
        "--threads-http",
        str(16 + 2),  # the sweep goes to 16 in flight (SPEC §5.8)
        "--metrics",
    ]
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if server.poll() is not None:
                pytest.fail(f"llama-server exited {server.returncode}; see {log.name}")
            try:
                if requests.get(f"{root}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail("llama-server did not become healthy within 60 s")
            time.sleep(0.2)
        (isolated / "calibrate.toml").write_text(
            f'[target]\nbase_url = "{root}/v1"\nmodel = "{MODEL_NAME}"\ntimeout_s = 60\n\n'
            '[prompt]\ntext = "What is 2 plus 3?"\nmax_tokens = 32\n\n'
            "[ladder]\nbatch_sizes = [1, 2, 4, 8]\nrounds = 2\nmin_round_s = 1\n\n"
            "[sweep]\nconcurrency = [1, 2, 4, 8, 16]\nlevel_s = 4\nrepeats = 3\n",
            encoding="utf-8",
        )
        yield root
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
        log.close()


def test_ladder_stops_at_the_servers_own_cap_and_keeps_batch_4(cli, unmanaged: str) -> None:
    """Above /props total_slots the ladder measured llama.cpp's queue, not batch 8: that tier is
    ``stop: cap``, never kept, never the setting; batch 4 is the highest tier kept. (Which kept
    tier is the setting — the fastest within noise — is the box's to say: on a loaded 2-core
    machine the fixed prompt's 7-token answers ran as fast at 2 as at 4.)"""
    assert requests.get(f"{unmanaged}/props", timeout=5).json()["total_slots"] == SLOTS
    assert cli("single").code == 0 and cli("repro").code == 0
    result = cli("ladder", "--json", "--conservative")  # the cap is the point, not the setting
    show("\n" + result.err)
    assert result.code == 0, result.err
    verdicts = {t["batch_size"]: t["verdict"] for t in result.json["tiers"]}
    assert verdicts[8] == "stop: cap", verdicts
    assert verdicts[SLOTS] in ("pass", "stop: latency"), verdicts
    assert (
        result.json["highest_kept"] == SLOTS or result.json["last_passing"]["batch_size"] == SLOTS
    )
    assert result.json["last_passing"]["batch_size"] <= SLOTS
    assert "every tier passed" not in result.err
    assert "batch 8 not kept: above the server's own cap" in result.err


def test_no_sweep_knee_sits_below_a_level_that_clearly_beats_it(cli, unmanaged: str) -> None:
    """Forced 100-token answers, 1, 2, 4, 8, 16 in flight, five times: one noisy level must not
    hide a real gain above the knee (each level is judged against the best so far). "Clearly":
    the level's slowest run beats the knee's fastest and its median adds gain_min — what the
    old neighbour-only rule missed (knee 1 while 4's slowest run beat 1's fastest)."""
    assert cli("single").code == 0 and cli("repro").code == 0
    assert cli("ladder", "--conservative").code == 0
    knees: list[int] = []
    rows = ["| sweep | knee | " + " | ".join(f"c={c} items/s (range)" for c in (1, 2, 4, 8, 16))]
    for n in range(SWEEPS):
        result = cli("sweep", "--input-tokens", "32", "--output-tokens", "100", "--json")
        assert result.code in (0, 1), result.err
        if result.code == 1:  # the runs could not tell two levels apart: said, no knee (§5.14)
            assert result.json["inconclusive"].startswith("inconclusive: "), result.err
            rows.append(f"| {n + 1} | inconclusive | {result.json['inconclusive']} |")
            continue
        knee = result.json["knee"]["concurrency"]
        knees.append(knee)
        at_knee = next(lv for lv in result.json["levels"] if lv["concurrency"] == knee)
        for lv in result.json["levels"]:
            clearly = (
                lv["items_per_s_min"] > at_knee["items_per_s_max"]
                and lv["items_per_s"] >= (1 + GAIN_MIN) * at_knee["items_per_s"]
            )
            assert lv["concurrency"] <= knee or not clearly, (knee, lv, at_knee)
        cells = {
            lv["concurrency"]: f"{lv['items_per_s']:.1f} ({lv['items_per_s_min']:.1f}–"
            f"{lv['items_per_s_max']:.1f}, ×{lv['repeats']})"
            for lv in result.json["levels"]
        }
        rows.append(
            f"| {n + 1} | {knee} | " + " | ".join(cells.get(c, "—") for c in (1, 2, 4, 8, 16))
        )
    show(
        f"\nllama-server --parallel {SLOTS} (unmanaged), forced 100-token answers, "
        f"{os.cpu_count()} cores\n" + "\n".join(rows)
    )
    show(f"knee at {SLOTS} in {sum(k == SLOTS for k in knees)} of {SWEEPS} sweeps: {knees}")
