"""What a batch's drift is held to (``state.calibrated.calibration_for``), read from ledger lines
as sweep and ladder write them: the newest passing sweep level at the setting's batch size and
the batch's concurrency, else the ladder's tier of that many in flight; after a tune only what
was measured with its flags; an older line without its ``measured`` block completed from its run
folder's tiers.csv; and, when nothing fits, why — in words a user can act on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from calibrate.state.calibrated import Calibrated, calibration_for, measured_of
from calibrate.state.ledger import Ledger, LedgerEntry

TARGET = "t0"


def _row(items_per_s: float, p50: float) -> dict[str, Any]:
    return {"items_per_s": items_per_s, "items": 40, "errors": 0, "latency_p50_s": p50}


def _sweep(run_id: str, rates: list[float], *, batch_size: int = 4) -> LedgerEntry:
    level = {"concurrency": 4, "verdict": "pass", "items_per_s": rates[1]}
    level["measured"] = measured_of(_row(rates[1], 0.2), rates)
    summary = {"batch_size": batch_size, "levels": [level]}
    return LedgerEntry("sweep", run_id, TARGET, True, summary)


def _ladder(run_id: str, items_per_s: float, *, measured: bool = True) -> LedgerEntry:
    tier: dict[str, Any] = {"batch_size": 4, "verdict": "pass", "per_item_s": 1 / items_per_s}
    if measured:
        tier["measured"] = measured_of(_row(items_per_s, 0.25), [items_per_s * 0.95, items_per_s])
    summary = {"last_passing": {"batch_size": 4, "concurrency": 4}, "tiers": [tier]}
    return LedgerEntry("ladder", run_id, TARGET, True, summary)


def _found(ledger: Ledger, tmp_path: Path, *, tuned: bool = False) -> Calibrated | str:
    return calibration_for(ledger, TARGET, tmp_path / "runs", 4, 4, tuned=tuned)


def test_the_newest_sweep_at_the_batch_size_is_preferred_with_its_repeats_interval(
    tmp_path: Path,
) -> None:
    ledger = Ledger(tmp_path / "runs")
    ledger.append(_sweep("s-old", [10.0, 11.0, 12.0]))
    ledger.append(_ladder("l-new", 30.0))
    ledger.append(_sweep("s-other-batch", [40.0, 41.0, 42.0], batch_size=8))
    found = _found(ledger, tmp_path)
    assert isinstance(found, Calibrated)
    assert (found.stage, found.run_id, found.items_per_s) == ("sweep", "s-old", 11.0)
    assert (found.items_per_s_low, found.items_per_s_high, found.repeats) == (10.0, 12.0, 3)
    assert found.where == "sweep run s-old at concurrency 4"


def test_after_a_tune_only_what_was_measured_with_its_flags_counts(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "runs")
    ledger.append(_sweep("s-before", [10.0, 11.0, 12.0]))
    ledger.append(LedgerEntry("tune", "tune-1", TARGET, True, {}))
    said = _found(ledger, tmp_path, tuned=True)
    assert isinstance(said, str) and "with the engine flags tune chose" in said
    assert "calibrate sweep" in said
    ledger.append(_ladder("l-after", 30.0))
    found = _found(ledger, tmp_path, tuned=True)
    assert isinstance(found, Calibrated) and found.run_id == "l-after"
    assert found.where == "ladder run l-after, batch 4"


def test_an_older_ladder_line_is_completed_from_its_run_folder(tmp_path: Path) -> None:
    """A ladder recorded before the ``measured`` block: its throughput from the tier's
    per_item_s, its latency from the run's tiers.csv; without the folder, no latency (the rule
    then says it cannot compare, rather than guess)."""
    ledger = Ledger(tmp_path / "runs")
    ledger.append(_ladder("l-old", 20.0, measured=False))
    bare = _found(ledger, tmp_path)
    assert isinstance(bare, Calibrated) and bare.items_per_s == 20.0
    assert bare.latency_p50_s is None
    run = tmp_path / "runs" / "l-old"
    run.mkdir(parents=True)
    (run / "tiers.csv").write_text(
        "batch_size,concurrency,items_per_s,latency_p50_s,items,errors\n4,4,20.0,0.21,40,0\n",
        encoding="utf-8",
    )
    full = _found(ledger, tmp_path)
    assert isinstance(full, Calibrated) and full.latency_p50_s == 0.21 and full.items == 40


def test_nothing_measured_at_that_concurrency_says_what_to_run(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "runs")
    ledger.append(LedgerEntry("sweep", "failed", TARGET, False, {"batch_size": 4}))
    said = _found(ledger, tmp_path)
    assert said == (
        "no passing sweep at batch 4 or ladder measured concurrency 4 for this target "
        "(calibrate sweep measures it)"
    )


def test_a_calibration_reads_back_what_it_wrote_and_a_malformed_one_reads_as_none() -> None:
    cal = Calibrated("sweep", "s", 4, 4, 11.0, 10.0, 12.0, 3, latency_p50_s=0.2, workload="w")
    assert Calibrated.from_json(cal.to_json()) == cal
    assert Calibrated.from_json({**cal.to_json(), "items_per_s": "fast"}) is None
    assert Calibrated.from_json([1, 2]) is None


def test_a_prompt_list_ladder_is_no_calibration_of_a_batch_at_that_concurrency(
    tmp_path: Path,
) -> None:
    """A ladder in prompt-list mode sent each tier as one request of B prompts; a batch at -c B
    sends B requests at once. Its tier was held up as the batch's calibration ("batch 4") with
    nothing saying it measured something else; now it is passed over, an older wave ladder or a
    sweep taken instead, and with none the reason names the mode."""
    ledger = Ledger(tmp_path / "runs")
    ledger.append(_ladder("l-wave", 20.0))
    ledger.append(_ladder("l-list", 30.0))
    for run_id, mode in (("l-wave", "wave"), ("l-list", "prompt-list")):
        run = tmp_path / "runs" / run_id
        run.mkdir(parents=True)
        manifest = {"config": {"ladder": {"mode": mode}}}
        (run / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    found = _found(ledger, tmp_path)
    assert isinstance(found, Calibrated) and found.run_id == "l-wave", found
    alone = Ledger(tmp_path / "alone" / "runs")
    alone.append(_ladder("l-list", 30.0))
    said = calibration_for(alone, TARGET, tmp_path / "runs", 4, 4, tuned=False)
    assert isinstance(said, str), said
    assert "ladder run l-list ran in prompt-list mode (one request of 4 prompts)" in said
    assert "calibrate sweep" in said
