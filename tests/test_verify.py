"""`calibrate verify` after restarts of a managed mock: the same answer, or the diff."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.fakes import free_port, managed_config, mock_command, passing_ladder
from tests.helpers import write_config

pytestmark = pytest.mark.usefixtures("repo_on_pythonpath")


def test_verify_after_clean_restart_and_from_the_pinned_script(cli, isolated: Path) -> None:
    port = free_port()
    managed_config(isolated, port, mock_command())
    assert cli("server", "start", "--concurrency", "2").code == 0
    try:
        single = cli("single", "--json")
        assert single.code == 0, single.err
        assert cli("server", "stop").code == 0
        assert cli("server", "start", "--concurrency", "2").code == 0
        clean = cli("verify", "--json", "--junit", "verify.xml")
        assert clean.code == 0, clean.err
        assert "config consistent" in clean.err and clean.json["consistent"] is True

        passing_ladder(isolated, single.json["record"]["target"], batch_size=4)
        assert cli("pin").code == 0
        assert cli("server", "stop").code == 0
        started = cli("server", "start", "--script", "scripts/launch.sh", "--json")
        assert started.code == 0, started.err
        assert started.json["argv"] == ["bash", "scripts/launch.sh"]
        assert started.json["batch_size"] == 4 and started.json["concurrency"] == 1
        pinned = cli("verify")
        assert (
            pinned.code == 0
            # a custom engine has no cap flag: the setting is said, and said unchecked
            and "config consistent (the answer; whether it runs at batch 4, concurrency 1 (from "
            "pin) is unchecked): "
            in " ".join(pinned.err.split())
        )
        assert "expected setting" not in pinned.err  # the verdict names it: one line, not two
    finally:
        cli("server", "stop")
    suite = ET.parse(isolated / "verify.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "1" and suite.get("failures") == "0"
    ledger = [json.loads(x) for x in (isolated / "runs/ledger.jsonl").read_text().splitlines()]
    assert [e["passed"] for e in ledger if e["stage"] == "verify"] == [True, True]


def test_verify_after_the_served_text_changed_shows_the_diff(cli, isolated: Path) -> None:
    port = free_port()
    managed_config(isolated, port, mock_command())
    assert cli("server", "start", "--concurrency", "1").code == 0
    try:
        assert cli("single").code == 0
        assert cli("server", "stop").code == 0
        managed_config(isolated, port, mock_command("--text-seed", "3"))
        assert cli("server", "start", "--concurrency", "1").code == 0
        result = cli("verify", "--junit", "verify.xml")
    finally:
        cli("server", "stop")
    assert result.code == 1
    assert "differs in" in result.err and '+ "text": ' in result.err
    assert "config consistent" not in result.err
    failure = ET.parse(isolated / "verify.xml").getroot().find(".//failure")
    assert failure is not None and "text" in (failure.get("message") or "")


def test_verify_gate_and_unreachable_server(cli, isolated: Path) -> None:
    port = free_port()
    write_config(isolated / "calibrate.toml", f"http://127.0.0.1:{port}/v1")
    gated = cli("verify")
    assert gated.code == 3 and "calibrate single" in gated.err
    (isolated / "baselines").mkdir()
    (isolated / "baselines/single.jsonl").write_text('{"text": "x"}\n', encoding="utf-8")
    down = cli("verify")
    assert down.code == 4 and f"http://127.0.0.1:{port}/v1" in down.err
