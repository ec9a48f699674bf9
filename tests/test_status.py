"""status: what passed for this target and what to run next."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.batch_helpers import batch_process, wait_for_lines, write_tasks
from tests.fakes import KNEE_NOT_SURE, append_ledger, passing_ladder, unsure_setting
from tests.helpers import reaped, write_config
from tests.mockserver import start_mock


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


def test_status_says_how_sure_the_setting_is(cli, isolated: Path) -> None:
    """A sweep that passed with its knee "not sure" (the best was the last level tried) and a
    ladder setting taken under noise: status showed "calibrated setting: batch 4, concurrency 2"
    with neither (SPEC §5.6: the recommendation says how sure it is; §5.14: recorded as taken
    under noise) — only ``calibrate run`` printed them."""
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:9/v1")
    target = str(cli("status", "--json").json["target"])
    taken = "batch 4, taken under noise (--conservative): the runs could not tell 8 from 4"
    unsure_setting(isolated, target, taken)
    status = cli("status", "--json")
    assert status.code == 0, status.err
    assert "calibrated setting: batch 4, concurrency 2" in status.err
    assert f"ladder: {taken}" in status.err
    assert KNEE_NOT_SURE in status.err
    assert status.json["why"] == [f"ladder: {taken}", KNEE_NOT_SURE]


def test_status_says_what_a_passing_rollback_or_verify_left_unchecked(
    cli, mock, isolated: Path
) -> None:
    """A verify against a server whose cap cannot be read (the mock has no /props) prints
    "config consistent (the answer; whether it runs at batch 4 … is unchecked)", and a rollback
    against a server it does not manage records VRAM release and the cap as unchecked: status
    showed both as a bare "passed", surer than the runs."""
    from calibrate.config import Overrides, load
    from calibrate.state.ledger import Ledger, LedgerEntry, target_fingerprint

    write_config(isolated / "calibrate.toml", mock.base_url)
    assert cli("single").code == 0
    cfg = load(Overrides(), {})
    target = target_fingerprint(cfg)
    ladder = {"last_passing": {"batch_size": 4, "concurrency": 4}}
    Ledger(cfg.runs_dir).append(LedgerEntry("ladder", "l1", target, True, ladder))
    said = cli("verify")
    assert said.code == 0 and "is unchecked" in said.err
    shown = cli("status")
    assert "verify    passed (not checked: the server's cap)" in shown.err
    steps = [
        {"step": "stop", "ok": True},
        {"step": "vram", "ok": True, "unchecked": "not checked: VRAM release not measured"},
        {"step": "active", "ok": True},
        {"step": "restart", "ok": True, "unchecked": "not checked: its cap could not be read"},
        {"step": "compare", "ok": True},
    ]
    summary = {"setting": {"batch_size": 4, "concurrency": 1}, "failed_step": None}
    rollback = LedgerEntry("rollback", "r1", target, True, {**summary, "steps": steps})
    Ledger(cfg.runs_dir).append(rollback)
    shown = cli("status")
    checked = "not checked: VRAM release, the server's cap"
    assert f"rollback  passed ({checked})" in shown.err


def test_status_shows_a_batch_stopped_by_ctrl_c_as_interrupted(cli, isolated: Path) -> None:
    """A batch stopped by Ctrl-C prints "interrupted: N of 200 done" and exits 130, its summary
    saying ``interrupted``: status showed it as "batch     FAILED" (and --json interrupted
    false), as though its items had failed. The batch's own ledger line says it now too."""
    write_tasks(isolated / "tasks.jsonl", 200)
    out = isolated / "out.jsonl"
    with start_mock(ttft_s=0.03, per_token_s=0.0005) as server:
        write_config(isolated / "calibrate.toml", server.base_url)
        args = ("--input", "tasks.jsonl", "--out", "out.jsonl", "-c", "4")
        with reaped(batch_process(isolated, *args)) as proc:
            wait_for_lines(out, 20, proc)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=15)
        assert proc.returncode == 130, err
        shown = cli("status", "--json")
    assert "  batch     interrupted  " in shown.err and "FAILED" not in shown.err
    line = shown.json["stages"]["batch"]
    assert line["passed"] is False and line["interrupted"] is True
    ledger = (isolated / "runs/ledger.jsonl").read_text("utf-8").splitlines()
    assert (
        json.loads(ledger[-1])["interrupted"] is True
    )  # the line's own flag, not only its summary


def test_a_newer_ladder_that_did_not_pass_is_said_beside_the_setting_it_did_not_confirm(
    cli, isolated: Path
) -> None:
    """The newest ladder failed (the server changed, a tier that passed before failed); the
    setting still stood on the older passing ladder, and status said only "ladder FAILED" on
    one line and "calibrated setting: batch 4" on another, as if that batch still held."""
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:9/v1")
    target = str(cli("status", "--json").json["target"])
    passing_ladder(isolated, target)
    failed = {"last_passing": None, "stopped_by": "failure"}
    append_ledger(isolated, "ladder", target, failed, passed=False, run_id="20261130T0-ladder-b")
    status = cli("status", "--json")
    assert status.code == 0, status.err
    said = (
        "the newest ladder (run 20261130T0-ladder-b) did not pass: the setting is still ladder "
        "run 20261129T160000Z-ladder-abcdef's, which nothing since has confirmed — run "
        "calibrate ladder again"
    )
    assert said in status.json["why"], status.json["why"]
    assert said in " ".join(status.err.split()), status.err
    passing_ladder(isolated, target)  # run again, and passing: nothing more to say
    assert not any("newest" in line for line in cli("status", "--json").json["why"])
