"""Finishing a ladder: the stage writes tiers.csv and ``--compare`` judges the rows it measured.

A view is told the table once it is written; whatever it does with the file afterwards (rewrite
it, delete it) cannot change the verdict.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from calibrate.config import Config, LadderConfig
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.gpu.vram import VramMonitor
from calibrate.io.tier_table import read_table as read_tiers_csv
from calibrate.io.tier_table import write_tiers_csv
from calibrate.io.tier_table.cells import row_from_cells
from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.ladder.result import LadderResult
from calibrate.stages.ladder.run import Ladder
from calibrate.stages.measure.tier_run import MeasureSpec
from calibrate.stages.measure.tier_stage.compare_tiers import read_table
from calibrate.stages.measure.tier_stage.tier_finish import TierOutcome, finish_tiers
from tests.stage_fakes import ScriptedSender, close_runs, recorder, stage_ctx

__all__ = ["close_runs"]  # the autouse fixture, used by being imported

PER_ITEM_S = {1: 0.1, 2: 0.1, 4: 0.1, 8: 0.1}


def _finished(
    tmp_path: Path, measure: MeasureSpec, shown: list[Path], rewrite: str | None = None
) -> TierOutcome[LadderResult, LadderOptions]:
    cfg = Config(ladder=replace(LadderConfig(), min_round_s=0.0, warmup_waves=0))
    ctx = stage_ctx(tmp_path, cfg, "ladder")
    monitor = VramMonitor([])
    options = LadderOptions.from_config(cfg)
    script = ScriptedSender(lambda b, n: (PER_ITEM_S[b] * b, PER_ITEM_S[b] * b, None))
    result = Ladder(ctx, options, monitor, recorder(ctx, monitor, tmp_path), script).run()

    def view(table: Path, source: str) -> None:
        shown.append(table)
        if rewrite is not None:
            table.write_text(rewrite, encoding="utf-8")  # a view that rewrites what it shows

    return finish_tiers(
        measure,
        ctx,
        "ladder",
        result,
        options,
        [t.row() for t in result.tiers],
        tables=view,
        source=result.vram_source,
        passed=result.passed,
        summary=result.summary(),
        notes=(),
        checks=(),
        streamed=False,
        selfload=SelfLoadMonitor(),
    )


def _baseline(tmp_path: Path, per_item_s: float) -> Path:
    """A committed ladder table whose every tier passed at ``per_item_s``."""
    rows = [
        row_from_cells(
            {"batch_size": b, "verdict": "pass", "per_item_s": per_item_s, "concurrency": 1}
        )
        for b in PER_ITEM_S
    ]
    return write_tiers_csv(tmp_path / f"base-{per_item_s}.csv", rows, "ladder", "none")


def test_the_stage_writes_the_table_before_the_view_sees_it(tmp_path: Path) -> None:
    shown: list[Path] = []
    done = _finished(tmp_path, MeasureSpec(), shown)
    assert done.passed and len(shown) == 1
    rows = read_tiers_csv(shown[0]).rows
    assert [r.batch_size for r in rows] == [1, 2, 4, 8]
    assert [r.per_item_s for r in rows] == [0.1, 0.1, 0.1, 0.1]


def test_compare_judges_the_measured_rows_not_the_file_a_view_rewrote(tmp_path: Path) -> None:
    """Twice as slow as the baseline is a regression, even when the view then overwrites
    tiers.csv with a copy of the baseline (the verdict once read the file back)."""
    baseline = _baseline(tmp_path, 0.05)
    shown: list[Path] = []
    done = _finished(
        tmp_path,
        MeasureSpec(compare=baseline, baseline=tuple(read_table(baseline, "ladder"))),
        shown,
        rewrite=baseline.read_text(encoding="utf-8"),
    )
    comparison = done.record.comparison
    assert comparison is not None and not comparison.passed
    assert not done.passed  # a regression is not a pass (SPEC §4.2)
    assert any("batch_size 1: per_item_s 0.1 is 100% higher" in p for p in comparison.problems)


def test_save_baseline_keeps_the_table_the_stage_wrote(tmp_path: Path) -> None:
    shown: list[Path] = []
    done = _finished(tmp_path, MeasureSpec(save_baseline=True), shown)
    assert done.record.baseline is not None
    dest, _ = done.record.baseline
    assert read_tiers_csv(dest).rows == read_tiers_csv(shown[0]).rows
