"""A managed llama.cpp restarted at ``--parallel B`` for each tier: its cap is read back from
``/props`` after the restart, and a tier whose server runs another number of slots than B is
said to and not kept (some builds run 4 unified slots for ``--parallel 1``, or fewer than B)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import free_port, pythonpath_env
from tests.helpers import write_config
from tests.tier_helpers import FAST, jsonl, run_dir


def _fake_llama_server(bin_dir: Path, slots_for: str) -> None:
    """``llama-server`` on PATH: the mock with the slots ``slots_for`` (a shell expression of
    ``$p``, the --parallel asked) and ``/props`` saying so; no /metrics, so no running gauge
    can tell the cap instead."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "llama-server"
    script.write_text(
        "#!/bin/sh\n"
        'port=""; p=1\n'
        "while [ $# -gt 0 ]; do\n"
        '  case "$1" in --port) port=$2; shift;; --parallel) p=$2; shift;; esac; shift\n'
        "done\n"
        f"slots=$(( {slots_for} ))\n"
        f'exec "{sys.executable}" -m calibrate mock --port "$port" --slots "$slots" '
        "--ttft 0.002 --per-token 0.001 --expose-props --metrics-style llamacpp --no-metrics\n",
        encoding="utf-8",
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def _ladder(cli: Any, root: Path, monkeypatch: pytest.MonkeyPatch, slots_for: str) -> Any:
    bin_dir = root / "fakebin"
    _fake_llama_server(bin_dir, slots_for)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", pythonpath_env())
    port = free_port()
    server = (
        f'[server]\nkind = "llamacpp"\nmodel_path = "/models/m.gguf"\nport = {port}\n'
        "ready_timeout_s = 20\nstop_timeout_s = 5\n"
    )
    extra = FAST + "batch_sizes = [1, 2, 4]\n" + server
    write_config(root / "calibrate.toml", f"http://127.0.0.1:{port}/v1", extra)
    assert cli("server", "start", "--batch-size", "1").code == 0
    try:
        assert cli("single").code == 0 and cli("repro", "--runs", "1").code == 0
        return cli("ladder", "--json")
    finally:
        cli("server", "stop")


def _reasons(root: Path, run_id: str) -> dict[int, str]:
    """Each tier's reason, as tiers.jsonl holds it (a later line supersedes)."""
    return {t["batch_size"]: t["reason"] for t in jsonl(run_dir(root, run_id) / "tiers.jsonl")}


def test_a_tier_whose_restarted_server_runs_fewer_slots_than_b_is_stop_cap(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--parallel 4 on a build that runs 2 slots: batch 4 measured a queue, not batch 4 (it
    read "pass", the setting could be batch 4, and the ladder said the server published no
    cap though /props did)."""
    result = _ladder(cli, isolated, monkeypatch, "p > 2 ? 2 : p")
    assert result.code == 0, result.err
    tiers = result.json["tiers"]
    assert [t["verdict"] for t in tiers] == ["pass", "pass", "stop: cap"], result.err
    reasons = _reasons(isolated, result.json["run_id"])
    assert "restarted at --parallel 4" in reasons[4] and "cap is 2" in reasons[4], reasons
    # never batch 4 (it queued); 1 or 2 as the rounds tell them apart (a loaded machine's
    # noise takes the conservative 1: seen with four test sessions on 2 cores)
    assert result.json["last_passing"]["batch_size"] in (1, 2)
    assert "publishes neither its cap" not in result.err


def test_a_tier_whose_restarted_server_runs_more_slots_than_b_says_so_and_stands(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--parallel 1 on a build that runs 4 unified slots: the tier's one request at a time ran
    alone (nothing queued), so its verdict stands — a ladder that stopped there would end every
    calibration on such a build at its first tier — but its reason says the server ran 4 slots,
    not 1, and what --parallel 1 pinned would run."""
    result = _ladder(cli, isolated, monkeypatch, "p == 1 ? 4 : p")
    assert result.code == 0, result.err
    tiers = result.json["tiers"]
    assert [t["verdict"] for t in tiers] == ["pass", "pass", "pass"], result.err
    reasons = _reasons(isolated, result.json["run_id"])
    assert "the server ran 4 slots" in reasons[1] and "not 1" in reasons[1], reasons
    assert "--parallel 1 pinned would run 4 at once" in reasons[1], reasons
    assert "slots" not in reasons[2] and "slots" not in reasons[4], reasons
    said = " ".join(result.err.split())
    assert said.count("the server runs 4 slots (llama.cpp /props total_slots, restarted") == 1, said
