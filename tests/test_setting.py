"""The one resolver of the calibrated setting, and the gates it shares with status (no HTTP)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from calibrate.state.ledger import Ledger, LedgerEntry
from calibrate.state.setting import resolve

T = "abc123"


def _ladder(
    run_id: str, batch: int, *, passed: bool = True, interrupted: bool = False
) -> LedgerEntry:
    summary = {
        "last_passing": {"batch_size": batch, "concurrency": batch},
        "stopped_by": "completed",
    }
    return LedgerEntry("ladder", run_id, T, passed, summary, interrupted=interrupted)


def _entry(stage: str, run_id: str, summary: dict[str, Any], passed: bool = True) -> LedgerEntry:
    return LedgerEntry(stage, run_id, T, passed, summary)


def _ledger(tmp_path: Path, *entries: LedgerEntry) -> Ledger:
    ledger = Ledger(tmp_path / "runs")
    for entry in entries:
        ledger.append(entry)
    return ledger


def _sweep(run_id: str, conc: int, ladder_run_id: str, batch: int = 4) -> LedgerEntry:
    return _entry(
        "sweep",
        run_id,
        {"recommended_concurrency": conc, "batch_size": batch, "ladder_run_id": ladder_run_id},
    )


def test_ladder_alone_sets_batch_with_concurrency_1(tmp_path: Path) -> None:
    found = resolve(_ledger(tmp_path, _ladder("L1", 4)), T)
    assert found is not None and (found.batch_size, found.concurrency) == (4, 1)
    assert found.set_by == "ladder" and "ladder run L1" in found.batch_from


def test_a_sweep_on_that_ladder_raises_concurrency(tmp_path: Path) -> None:
    found = resolve(_ledger(tmp_path, _ladder("L1", 4), _sweep("S1", 8, "L1")), T)
    assert found is not None and (found.batch_size, found.concurrency, found.set_by) == (
        4,
        8,
        "sweep",
    )


def test_a_sweep_of_an_older_ladder_does_not_count(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, _ladder("L1", 4), _sweep("S1", 8, "L1"), _ladder("L2", 2))
    found = resolve(ledger, T)
    assert found is not None and (found.batch_size, found.concurrency) == (2, 1)


def test_rollback_after_a_pin_wins_and_uses_concurrency_1(tmp_path: Path) -> None:
    pin = _entry("pin", "P1", {"batch_size": 4, "concurrency": 8, "kind": "vllm"})
    rollback = _entry("rollback", "R1", {"setting": {"batch_size": 2, "concurrency": 1}}, False)
    found = resolve(_ledger(tmp_path, _ladder("L1", 4), _sweep("S1", 8, "L1"), pin, rollback), T)
    assert found is not None and (found.batch_size, found.concurrency) == (2, 1)
    assert found.set_by == "rollback"


def test_a_pin_after_a_rollback_wins(tmp_path: Path) -> None:
    rollback = _entry("rollback", "R1", {"setting": {"batch_size": 2, "concurrency": 1}})
    pin = _entry("pin", "P1", {"batch_size": 2, "concurrency": 1, "kind": "vllm"})
    found = resolve(_ledger(tmp_path, _ladder("L1", 4), rollback, pin), T)
    assert found is not None and found.set_by == "pin"


def test_rollback_that_failed_before_its_active_step_sets_nothing(tmp_path: Path) -> None:
    rollback = _entry("rollback", "R1", {"setting": None, "failed_step": "stop"}, False)
    found = resolve(_ledger(tmp_path, _ladder("L1", 4), rollback), T)
    assert found is not None and found.set_by == "ladder"


def test_failed_or_interrupted_ladders_never_set_anything(tmp_path: Path) -> None:
    ledger = _ledger(
        tmp_path,
        _ladder("L1", 8),
        _ladder("L2", 2, interrupted=True),
        _ladder("L3", 1, passed=False),
    )
    found = resolve(ledger, T)
    assert found is not None and found.batch_size == 8
    assert resolve(_ledger(tmp_path / "b", _ladder("L2", 2, interrupted=True)), T) is None


def test_legacy_active_lines_read_as_a_rollback(tmp_path: Path) -> None:
    active = _entry("active", "R0", {"batch_size": 2, "concurrency": 1, "source": "rollback"})
    found = resolve(_ledger(tmp_path, _ladder("L1", 4), active), T)
    assert found is not None and (found.batch_size, found.set_by) == (2, "rollback")


def test_a_malformed_ledger_line_is_skipped_with_a_warning(tmp_path: Path, caplog) -> None:
    ledger = _ledger(tmp_path, _ladder("L1", 4))
    with ledger.path.open("a", encoding="utf-8") as handle:
        handle.write('{"stage": "pin", "summary": [1]}\n{"truncated\n')
    ledger.append(_sweep("S1", 2, "L1"))
    found = resolve(ledger, T)
    assert found is not None and (found.batch_size, found.concurrency) == (4, 2)
    assert "line 2" in caplog.text and "line 3" in caplog.text


def test_batch_after_a_rollback_defaults_to_concurrency_1(cli, mock, isolated: Path) -> None:
    """SPEC §5.7: a rollback restarts at concurrency 1, and batch follows it, not the older sweep."""
    from calibrate.config import Overrides, load
    from calibrate.state.ledger import target_fingerprint
    from tests.helpers import write_config

    write_config(isolated / "calibrate.toml", mock.base_url)
    target = target_fingerprint(load(Overrides(), {}))
    ledger = Ledger(isolated / "runs")
    ladder = _ladder("L1", 8)
    for entry in (
        replace(ladder, target=target),
        replace(_sweep("S1", 8, "L1", batch=8), target=target),
        LedgerEntry(
            "rollback", "R1", target, True, {"setting": {"batch_size": 4, "concurrency": 1}}
        ),
    ):
        ledger.append(entry)
    tasks = isolated / "tasks.jsonl"
    tasks.write_text("".join(f'{{"id": {i}, "text": "t{i}"}}\n' for i in range(3)), "utf-8")
    result = cli("batch", "--input", str(tasks), "--out", "out.jsonl", "--json")
    assert result.code == 0, result.err
    assert result.json["concurrency"] == 1 and result.json["concurrency_source"] == "rollback"


def _pin(batch: int, conc: int) -> LedgerEntry:
    return _entry(
        "pin", "P1", {"batch_size": batch, "concurrency": conc, "kind": "vllm", "script": "s.sh"}
    )


def test_a_ladder_run_again_at_the_swept_batch_keeps_the_sweeps_concurrency(tmp_path: Path) -> None:
    """The issue: after a ladder ran again the ladder said "batch 4, concurrency 4", status
    "concurrency 1 … (no sweep has passed at this batch size)" though a sweep had passed at 4,
    next: "calibrate batch" (at c = 1), the script 4. One concurrency now: the sweep at the same
    B on the same workload still holds, and all of them read it."""
    ledger = _ledger(
        tmp_path, _ladder("L1", 4), _sweep("S1", 4, "L1"), _pin(4, 4), _ladder("L2", 4)
    )
    found = resolve(ledger, T)
    assert found is not None and (found.batch_size, found.concurrency) == (4, 4)
    assert found.measured_concurrency and "sweep run S1 (at batch 4" in found.concurrency_from


def test_a_ladder_run_again_at_another_batch_asks_for_a_sweep_and_a_new_pin(
    tmp_path: Path,
) -> None:
    ledger = _ledger(
        tmp_path, _ladder("L1", 4), _sweep("S1", 4, "L1"), _pin(4, 4), _ladder("L2", 8)
    )
    found = resolve(ledger, T)
    assert found is not None and (found.batch_size, found.concurrency) == (8, 1)
    assert not found.measured_concurrency
    other = _ledger(tmp_path / "w", _ladder("L1", 4), _sweep("S1", 4, "L1"))
    with_tasks = replace(
        _ladder("L2", 4),
        summary={**_ladder("L2", 4).summary, "workload": {"source": "tasks", "tasks": "t.jsonl"}},
    )
    other.append(with_tasks)
    again = resolve(other, T)
    assert again is not None and again.concurrency == 1, "another workload: the sweep is not it"


def test_status_next_and_the_ladder_agree_after_a_ladder_is_run_again(cli, isolated: Path) -> None:
    """The same four steps through status: at the swept batch size status says concurrency 4
    and next goes on (no sweep asked for again, the pin agrees); at another batch size next is
    'calibrate sweep' and status names the pinned script as stale."""
    from calibrate.config import Overrides, load
    from calibrate.state.ledger import target_fingerprint
    from tests.helpers import write_config

    write_config(isolated / "calibrate.toml", "http://127.0.0.1:9/v1")
    target = target_fingerprint(load(Overrides(), {}))
    ledger = Ledger(isolated / "runs")
    single, repro = _entry("single", "A1", {}), _entry("repro", "B1", {})
    verify = _entry("verify", "V1", {})
    for entry in (single, repro, _ladder("L1", 4), _sweep("S1", 4, "L1"), _pin(4, 4), verify):
        ledger.append(replace(entry, target=target))
    ledger.append(replace(_ladder("L2", 4), target=target))
    same = cli("status", "--json")
    assert same.code == 0, same.err
    assert same.json["setting"]["concurrency"] == 4 and same.json["stale"] is None
    assert same.json["next"] not in ("calibrate sweep", "calibrate pin")
    ledger.append(replace(_ladder("L3", 8), target=target))
    moved = cli("status", "--json")
    assert moved.json["setting"]["concurrency"] == 1 and moved.json["next"] == "calibrate sweep"
    assert moved.json["stale"].startswith("the pinned script (s.sh) says batch 4, concurrency 4")
    assert "it is stale — run calibrate sweep" in moved.err
    ledger.append(replace(_sweep("S2", 8, "L3", batch=8), target=target))
    swept = cli("status", "--json")
    assert swept.json["next"] == "calibrate pin", "the script still says batch 4"
