"""What a ladder or sweep does once its tiers are measured: the table, ``--compare``,
``--save-baseline``, the one ledger verdict, and what the determinism copies found.

The order is the contract: the table is written before it is compared, and the comparison is
in the verdict (a regression or an interruption is never a pass, SPEC §4.2). What is said
about it all is the command line's; here it is only decided and written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Generic, TypeVar

from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.io.tier_table import write_tiers_csv
from calibrate.io.tier_table.row import TierRow
from calibrate.stages.context import StageContext
from calibrate.stages.determinism import Determinism, DeterminismCheck, write_determinism
from calibrate.stages.measure.tier_run import MeasureSpec
from calibrate.stages.measure.tier_stage.compare_tiers import (
    TableKind,
    TierComparison,
    compare_run,
    save_table_baseline,
)
from calibrate.stages.server_account.queue_note import row_queue_note
from calibrate.state.gates import next_step
from calibrate.state.ledger import LedgerEntry
from calibrate.state.setting import CalibratedSetting, resolve
from calibrate.state.summaries import TierChecks, TierSummary

Shown = Callable[[Path, str], None]  # told the tiers.csv just written and the VRAM source
Found = TypeVar("Found")
Opts = TypeVar("Opts")


@dataclass(frozen=True)
class TierRecord:
    """What finishing a run decided and wrote, for the command line to say."""

    rows: tuple[TierRow, ...]
    comparison: TierComparison | None
    baseline: tuple[Path, Path | None] | None  # (where the table went, the previous one kept)
    notes: tuple[str, ...]
    client_bound: str | None  # calibrate's own CPU was the limit (not said during the run)
    entry: LedgerEntry


@dataclass(frozen=True)
class TierOutcome(Generic[Found, Opts]):
    """A finished (or interrupted) ladder or sweep, recorded: what there is to say about it."""

    result: Found
    options: Opts  # as run: streamed only where the probe let it
    record: TierRecord
    streamed: bool  # streaming was asked for, and the server took streamed requests
    determinism: Determinism | None = None
    next_step: str | None = None  # what to run next (after a pass)
    interrupted: bool = False
    setting: CalibratedSetting | None = None  # the calibrated setting now (after a pass)

    @property
    def passed(self) -> bool:
        return self.record.entry.passed


def finish_tiers(
    spec: MeasureSpec,
    ctx: StageContext,
    kind: TableKind,
    result: Found,
    options: Opts,
    rows: Sequence[TierRow],
    *,
    tables: Shown,
    source: str,
    passed: bool,
    summary: TierSummary,
    notes: Sequence[str],
    checks: Sequence[tuple[str, DeterminismCheck]],  # the determinism copies, per tier or level
    streamed: bool,
    selfload: SelfLoadMonitor,
    interrupted: bool = False,
) -> TierOutcome[Found, Opts]:
    """The table, --compare / --save-baseline, the notes; then the stage's ledger verdict,
    determinism.json and the next step (none of those two after Ctrl-C).

    tiers.csv is written here (``tier_table``, its one writer) and then shown through
    ``tables``; ``--compare`` judges the rows in memory, never the file a view wrote."""
    table = write_tiers_csv(ctx.run.file("tiers.csv"), rows, kind, source) if rows else None
    if table is not None:
        tables(table, source)
    comparison = compare_run(spec, kind, rows)
    saved = save_table_baseline(spec, ctx.config.baselines_dir, kind, table)
    client_bound = selfload.poll_warning()
    # the run's one ledger verdict, with calibrate's own load and the comparison in it
    compared = comparison.to_json() if comparison is not None else None
    measured = TierChecks(selfload.report().to_json(), compared)
    if comparison is not None:
        passed = passed and comparison.passed  # a regression is not a pass (SPEC §4.2)
    entry = ctx.record_result(passed, replace(summary, checks=measured), interrupted=interrupted)
    ctx.run.close()
    every = (*notes, *queue_notes(rows))
    record = TierRecord(tuple(rows), comparison, saved, every, client_bound, entry)
    outcome = TierOutcome(result, options, record, streamed)
    if interrupted:
        return replace(outcome, interrupted=True)
    hint = next_step(ctx.config, ctx.ledger, ctx.target) if entry.passed else None
    now = resolve(ctx.ledger, ctx.target) if entry.passed else None
    return replace(outcome, determinism=write_determinism(ctx, checks), next_step=hint, setting=now)


def queue_notes(rows: Sequence[TierRow]) -> list[str]:
    """One note per tier or level during which the server queued requests (explains a knee)."""
    running = [n for r in rows if (n := r.server.server_running_max) is not None]
    most = max(running, default=None)
    found = (row_queue_note(r, most) for r in rows)
    return [note for note in found if note]
