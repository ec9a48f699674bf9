"""What a ladder or sweep does once its tiers are measured: the table, ``--compare``,
``--save-baseline``, the one ledger verdict, and what the determinism copies found.

The order is the contract: the table is written before it is compared, and the comparison is
in the verdict (a regression or an interruption is never a pass, SPEC §4.2). What is said
about it all is the command line's; here it is only decided and written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from calibrate.config import Config
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.io.tier_table import write_tiers_csv
from calibrate.stages.context import StageContext
from calibrate.stages.determinism import DeterminismCheck, EngineSwitch, overall
from calibrate.stages.determinism.wave import managed_switch
from calibrate.stages.measure.compare_tiers import (
    TableKind,
    TierComparison,
    compare_tables,
    save_baseline,
)
from calibrate.stages.measure.tier_run import MeasureSpec
from calibrate.stages.measure.tiers import queue_note
from calibrate.state.gates import next_step
from calibrate.state.ledger import LedgerEntry
from calibrate.state.summaries import TierChecks, TierSummary

Row = Mapping[str, Any]
Shown = Callable[[Path, str], None]  # told the tiers.csv just written and the VRAM source
Found = TypeVar("Found")
Opts = TypeVar("Opts")


@dataclass(frozen=True)
class TierRecord:
    """What finishing a run decided and wrote, for the command line to say."""

    rows: tuple[Row, ...]
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

    @property
    def passed(self) -> bool:
        return self.record.entry.passed


def finish_tiers(
    spec: MeasureSpec,
    ctx: StageContext,
    kind: TableKind,
    result: Found,
    options: Opts,
    rows: Sequence[Row],
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
    saved = save_table_baseline(spec, ctx, kind, table)
    client_bound = selfload.poll_warning()
    entry = record_run(
        ctx,
        passed=passed,
        summary=summary,
        comparison=comparison,
        selfload=selfload,
        interrupted=interrupted,
    )
    every = (*notes, *queue_notes(rows))
    record = TierRecord(tuple(rows), comparison, saved, every, client_bound, entry)
    outcome = TierOutcome(result, options, record, streamed)
    if interrupted:
        return replace(outcome, interrupted=True)
    hint = next_step(ctx.config, ctx.ledger, ctx.target) if entry.passed else None
    return replace(outcome, determinism=write_determinism(ctx, checks), next_step=hint)


def queue_notes(rows: Sequence[Row]) -> list[str]:
    """One note per tier or level during which the server queued requests (explains a knee)."""
    found = (queue_note(r.get("server_queue_max"), int(r["concurrency"])) for r in rows)
    return [note for note in found if note]


def compare_run(spec: MeasureSpec, kind: TableKind, rows: Sequence[Row]) -> TierComparison | None:
    """``--compare``: this run's rows against the committed table (None without the flag, or
    with no row to compare)."""
    if spec.compare is None or spec.baseline is None or not rows:
        return None
    return compare_tables(
        kind,
        spec.baseline,
        rows,
        tolerance=spec.tolerance,
        baseline_path=str(spec.compare),
    )


def save_table_baseline(
    spec: MeasureSpec, ctx: StageContext, kind: TableKind, table: Path | None
) -> tuple[Path, Path | None] | None:
    """``--save-baseline``: (where the table went, where the previous one was kept)."""
    if not spec.save_baseline or table is None:
        return None
    dest = ctx.config.baselines_dir / f"{kind}.csv"
    return dest, save_baseline(table, dest)


def record_run(
    ctx: StageContext,
    *,
    passed: bool,
    summary: TierSummary,
    comparison: TierComparison | None,
    selfload: SelfLoadMonitor,
    interrupted: bool = False,
) -> LedgerEntry:
    """The run's one ledger verdict, with calibrate's own load and the comparison in it."""
    compared = comparison.to_json() if comparison is not None else None
    checks = TierChecks(selfload.report().to_json(), compared)
    if comparison is not None:
        passed = passed and comparison.passed  # a regression is not a pass (SPEC §4.2)
    entry = ctx.record_result(passed, replace(summary, checks=checks), interrupted=interrupted)
    ctx.run.close()
    return entry


@dataclass(frozen=True)
class Determinism:
    """What the copies of the fixed prompt found over the run (SPEC §13)."""

    line: str  # ``determinism (8 copies each): identical at batch 1, 2; …``
    copies: int
    differed: bool
    switch: EngineSwitch | None  # the managed engine's batch-invariant switch, as read

    def to_json(self) -> dict[str, Any]:
        return {
            "copies": self.copies,
            "deterministic": not self.differed,
            "switch": self.switch.to_json() if self.switch is not None else None,
        }


def judge_determinism(
    cfg: Config, checks: Sequence[tuple[str, DeterminismCheck]]
) -> Determinism | None:
    """The run's determinism and the engine's switch (None when no copies were sent)."""
    line = overall(checks)
    if line is None:
        return None
    differed = any(c.divergence is not None for _, c in checks)
    copies = max(c.copies for _, c in checks)
    return Determinism(line, copies, differed, managed_switch(cfg))


def write_determinism(
    ctx: StageContext, checks: Sequence[tuple[str, DeterminismCheck]]
) -> Determinism | None:
    """``determinism.json`` beside the tiers: the switch as read (SPEC §13)."""
    found = judge_determinism(ctx.config, checks)
    if found is not None:
        ctx.run.write_json("determinism.json", found.to_json())
    return found
