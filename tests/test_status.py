"""status: what passed for this target and what to run next."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import write_config


def test_status_walks_the_stages(cli, mock, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    first = cli("status", "--json")
    assert first.code == 0 and first.json["next"] == "calibrate single"
    assert not (isolated / "runs").exists(), "status writes nothing"
    assert cli("single").code == 0
    assert cli("status", "--json").json["next"] == "calibrate repro"
    assert cli("repro").code == 0
    after = cli("status", "--json")
    assert after.json["next"] == "calibrate ladder"
    assert after.json["stages"]["repro"]["passed"] is True
    assert "repro     passed" in after.err


def test_status_is_per_target(cli, mock, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    assert cli("single").code == 0 and cli("repro").code == 0
    other = cli("status", "--model", "other-model", "--json")
    assert "repro" not in other.json["stages"]


def test_forced_repro_without_baseline_says_what_to_run(cli, mock, isolated: Path) -> None:
    write_config(isolated / "calibrate.toml", mock.base_url)
    result = cli("repro", "--force")
    assert "FORCED" in result.err
    assert result.code == 2 and "calibrate single" in result.err


def test_status_shows_the_setting_a_rollback_left(cli, mock, isolated: Path) -> None:
    from calibrate.config import Overrides, load
    from calibrate.state.ledger import Ledger, LedgerEntry, target_fingerprint

    write_config(isolated / "calibrate.toml", mock.base_url)
    cfg = load(Overrides(), {})
    summary = {"setting": {"batch_size": 4, "concurrency": 1}, "failed_step": None}
    entry = LedgerEntry("rollback", "r1", target_fingerprint(cfg), True, summary)
    Ledger(cfg.runs_dir).append(entry)
    result = cli("status", "--json")
    setting = result.json["setting"]
    assert (setting["batch_size"], setting["concurrency"], setting["source"]) == (4, 1, "rollback")
    assert "calibrated setting: batch 4, concurrency 1 (from rollback)" in result.err
