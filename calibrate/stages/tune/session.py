"""A tune run from its setup to its ledger line: the search, then the tables, plot and verdict.

The verdict passes when a winner served a passing level; the run is marked finished (a rerun
starts a new one) only when every candidate was measured, or refine's search stopped on its own
(converged, or out of patience) — not when a budget cut it. An interrupted run is recorded
``interrupted: true`` and stays resumable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from calibrate.io.tier_table.tune import TuneRow
from calibrate.stages.measure.slo import describe, has_slo
from calibrate.stages.tune.candidate import Lifecycle
from calibrate.stages.tune.outcome import TuneOutcome
from calibrate.stages.tune.result import CandidateResult
from calibrate.stages.tune.search import Notify, Tune
from calibrate.stages.tune.setup import TuneSetup
from calibrate.stages.tune.store import TuneStore, ranked_rows, write_plot, write_tables
from calibrate.state.ledger import LedgerEntry
from calibrate.state.summaries import PlainSummary, TuneSummary

# Draws plot.svg from the ranked rows and a title (the renderer's, so the stage draws nothing).
DrawPlot = Callable[[Sequence[TuneRow], str], str]


@dataclass(frozen=True)
class TuneFinished:
    """What a finished (or budget-cut) tune wrote, for the command to show."""

    setup: TuneSetup
    outcome: TuneOutcome
    table: tuple[TuneRow, ...]
    title: str
    tables: Path | None
    plot: Path | None
    summary: TuneSummary
    entry: LedgerEntry
    next_step: str | None = None  # the pipeline's next command, when the tune passed

    @property
    def passed(self) -> bool:
        return self.entry.passed

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` result: every candidate (ranked) and the winner."""
        setup, o, win = self.setup, self.outcome, self.summary.winner
        winner = None
        if win is not None and o.winner is not None:
            lead = {**o.lead_json(), "margin": o.margin}  # --json's margin unrounded, as before
            winner = {**win.to_json(), "id": o.winner.candidate.id, **lead}
        return {
            "passed": self.entry.passed,
            "run_id": self.entry.run_id,
            "resumed": setup.resumed,
            "complete": o.complete,
            "grid_fingerprint": setup.fingerprint,
            "candidates": [{**r.to_json(), "rank": n} for n, r in enumerate(o.ranked, 1)],
            "winner": winner,
            "untested": [c.to_json() for c in o.untested],
            "memory": self.summary.details.get("memory"),
            "search": setup.search,
            "restarts": o.restarts,
            "search_stop": o.stopped or None,
            "pareto": self.summary.details.get("pareto"),
            "pinned_reason": self.summary.details.get("pinned_reason"),
        }


class Session:
    """One invocation of tune on its run: resumable, one server at a time."""

    def __init__(
        self,
        setup: TuneSetup,
        notify: Notify,
        on_result: Callable[[CandidateResult], None],
        draw_plot: DrawPlot,
    ) -> None:
        self.setup = setup
        self.draw_plot = draw_plot
        self.store = TuneStore(setup.ctx.run)
        self.measured_before = len({r.candidate.index for r in self.store.results()})
        self.lifecycle = Lifecycle(setup.ctx, setup.kind, setup.settings, notify=notify)
        self.tune = Tune(
            setup.plan,
            self.store,
            self.lifecycle,
            setup.search,
            setup.window,
            setup.budget_s,
            notify=notify,
            on_result=on_result,
            rank_by=setup.rank_by,
            level=setup.ctx.config.confidence.level,
            gain_min=setup.ctx.config.sweep.gain_min,
            conservative=setup.conservative,
            restarts=setup.restarts,
            patience=setup.patience,
            slos=has_slo(setup.settings.slo),
        )
        plan_json = {**setup.plan.to_json(), "search": setup.search}
        self.store.write_plan(plan_json, setup.fingerprint)

    @property
    def measured(self) -> int:
        return len({index for _, index in self.tune.done})

    def run(self) -> TuneFinished:
        return self.finish(self.tune.run())

    def interrupted(self) -> None:
        """Ctrl-C / SIGTERM: stop the server calibrate started, record the run as interrupted."""
        self.lifecycle.stop_managed()
        ctx, plan = self.setup.ctx, self.setup.plan
        progress = {
            "candidates": plan.size,
            "measured": self.measured,
            "grid_fingerprint": self.setup.fingerprint,
        }
        ctx.record_result(False, PlainSummary(progress), interrupted=True)
        ctx.run.close()

    def finish(self, outcome: TuneOutcome) -> TuneFinished:
        setup, ctx = self.setup, self.setup.ctx
        table = tuple(ranked_rows(outcome.ranked))
        title = f"tune {ctx.run.run_id} (ranked by {setup.rank_by}, {describe(setup.settings.slo)})"
        tables = write_tables(ctx.run, table) if table else None
        plot = write_plot(ctx.run, self.draw_plot(table, title)) if table else None
        details = {
            "grid_fingerprint": setup.fingerprint,
            "search": setup.search,
            "ladder_run_id": setup.ladder_run_id,
            "slo": asdict(setup.settings.slo),
            "levels": list(setup.settings.levels),
            "skipped_levels": list(setup.settings.skipped_levels),
            "resumed": setup.resumed,
            "ranked": [r.id for r in table],
            "rank_by": setup.rank_by,  # what ordered them (report RUN says so)
        }
        summary = outcome.summary(details)
        entry = ctx.record_result(summary.winner is not None, summary)
        if outcome.complete:
            self.store.mark_finished()
        ctx.run.close()
        return TuneFinished(setup, outcome, table, title, tables, plot, summary, entry)
