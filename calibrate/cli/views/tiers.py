"""What ladder and sweep share on the command line: the samplers, tables, rendering (their
measuring flags are ``cli.flags.workload``).

The logic (samplers, incidents, --compare, the ledger verdict) is in ``stages.measure``
(``tier_run``, ``tier_finish``); here it is only said.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

from calibrate.cli.flags.resolve import junit_suite
from calibrate.cli.output import Output
from calibrate.cli.views.determinism import say_overall
from calibrate.cli.views.pace import Growth
from calibrate.config import SloConfig
from calibrate.errors import Interrupted
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.gpu.vram import VramMonitor
from calibrate.io.junit import JUnitSuite
from calibrate.io.tier_table import read_table
from calibrate.io.tier_table.columns import Kind
from calibrate.io.tier_table.row import TierRow
from calibrate.numbers import clock_text, seconds_text
from calibrate.report.plot import write_plot
from calibrate.report.progress import Plan, span_text
from calibrate.report.replay import prefix_cache_seen
from calibrate.report.tables.compare import compare_table
from calibrate.report.tables.tiers import tier_table
from calibrate.stages.context import StageContext
from calibrate.stages.env import kept_on_write_error
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.measure.tier_run import Measuring
from calibrate.stages.measure.tier_stage.compare_tiers import TierComparison
from calibrate.stages.measure.tier_stage.tier_finish import TierOutcome, TierRecord
from calibrate.stages.prepare.stream_probe import StreamCheck
from calibrate.stages.single import baseline_answer_s
from calibrate.state.ledger import baseline_path

Found = TypeVar("Found")
Opts = TypeVar("Opts")


class TierView(ABC, Generic[Found, Opts]):
    """What the ladder's and the sweep's views share: the lines as they come, the samplers,
    the stream probe, the finished table, the JUnit report (a stage's ``TierWatcher``)."""

    kind: Kind

    def __init__(self, out: Output, ctx: StageContext) -> None:
        self.out = out
        self.ctx = ctx

    def say(self, text: str) -> None:
        self.out.say(text)

    def warn(self, text: str) -> None:
        self.out.warn(text)

    def growth(self, cap: ServerCap | None) -> Growth:
        """Answer times to plan the progress from: the baseline's (``single`` wrote it), the
        server's own cap when known; the tiers or levels add theirs as they finish."""
        answer_s = baseline_answer_s(baseline_path(self.ctx.config))
        return Growth(answer_s, cap.slots if cap is not None else None)

    def say_plan(self, plan: Plan, growth: Growth) -> None:
        """In a log (no progress bar there) the plan's time, once, before the table."""
        if self.out.is_tty or plan.steps <= 0:
            return
        sized = (
            f"sized from the baseline's {seconds_text(growth.answer_s)} s answer"
            if growth.answer_s is not None
            else "no baseline answer to size it from"
        )
        low, high = plan.total_span()
        if span_text((low, high)) != clock_text(low):  # a range: say what its high end is
            sized += (
                "; the high end if answers slow with each step as the server's slots fill and "
                f"every {plan.label.removesuffix('s')} runs to its repeat bound"
            )
        self.say(
            f"{self.kind}: {plan.steps} {plan.label}, about {span_text((low, high))} planned "
            f"({sized})"
        )

    def watching(self, watch: Measuring) -> None:
        announce(self.out, watch.monitor)

    def stream_checked(self, check: StreamCheck, slo: SloConfig) -> None:
        warn_stream_check(self.out, check, slo)

    def tables(self, table: Path, source: str) -> None:
        show_tables(self.out, self.ctx, self.kind, table, source)

    def save_junit(self, suite: JUnitSuite, path: str | None) -> None:
        """``--junit``: a write that fails is the stage's write error (exit 1, what was kept)."""
        with kept_on_write_error(self.ctx):
            if path:
                suite.write(Path(path))

    def render(self, done: TierOutcome[Found, Opts], junit: str | None) -> int:
        """Everything said after the last tier or level; the exit code (Ctrl-C: ``Interrupted``)."""
        out, ctx, record = self.out, self.ctx, done.record
        show_record(out, record)
        warn_if_not_streamed(out, record.rows, done.streamed)
        suite = self.junit(done, junit_suite(self.kind, ctx.run, ctx.target))
        if done.interrupted:
            suite.check(f"the {self.kind} ran to the end", False, "interrupted", kind="interrupted")
            self.save_junit(suite, junit)
            raise self.interrupted(done)
        self.save_junit(suite, junit)
        self.verdict(done)
        say_prefix_cache(out, record.entry.summary)
        say_overall(out, done.determinism)
        if done.next_step:
            out.say(f"next: {done.next_step}")
        determinism = {"determinism": done.determinism.to_json()} if done.determinism else {}
        out.result(
            {
                "passed": record.entry.passed,
                "run_id": ctx.run.run_id,
                **record.entry.summary,
                **self.detail(done),
                **determinism,
            }
        )
        return 0 if done.passed else 1

    @abstractmethod
    def junit(self, done: TierOutcome[Found, Opts], suite: JUnitSuite) -> JUnitSuite:
        """One testcase per tier or level, and the run's other checks."""

    @abstractmethod
    def interrupted(self, done: TierOutcome[Found, Opts]) -> Interrupted:
        """What Ctrl-C is told: how far it got, what was kept, what to run."""

    @abstractmethod
    def verdict(self, done: TierOutcome[Found, Opts]) -> None:
        """The finding, or why there is none."""

    @abstractmethod
    def detail(self, done: TierOutcome[Found, Opts]) -> dict[str, Any]:
        """The ``--json`` result's per-tier or per-level detail."""


def say_prefix_cache(out: Output, summary: Mapping[str, Any]) -> None:
    """The engine's prefix cache over the run, when it was probed or found anything."""
    if (seen := prefix_cache_seen(summary)) is not None:
        out.say(f"workload: {seen.describe()}")


def announce(out: Output, monitor: VramMonitor) -> None:
    if monitor.measured:
        out.say(f"VRAM source: {monitor.describe()}")
    if monitor.energy is not None:
        out.say(f"energy: {monitor.energy.source}")
    for line in monitor.warnings():  # each source that failed, named with its URL
        out.warn(line)


def show_tables(out: Output, ctx: StageContext, kind: Kind, csv_path: Path, source: str) -> None:
    """The final table as ``report RUN`` will print it (read back from tiers.csv); plot.png."""
    table_rows = read_table(csv_path).rows
    title = f"{kind} {ctx.run.run_id}"
    out.show_table(lambda width: tier_table(table_rows, kind, title, width, wide=width is None))
    if not ctx.config.report.plot:
        out.say(f"tables: {csv_path} (no plot: [report] plot = false)")
    elif plot := write_plot(table_rows, kind, ctx.run.file("plot.png"), ctx.config.cache_dir):
        out.say(f"tables: {csv_path}, plot: {plot}")
    else:
        out.say(f"tables: {csv_path} (no plot: matplotlib missing)")
    if source == "none":
        out.say("VRAM not measured")


def check_comparison(suite: JUnitSuite, comparison: TierComparison | None) -> None:
    """``--compare``'s testcase: no regression against the committed table."""
    if comparison is not None:
        suite.check(
            f"no regression against {comparison.baseline_path}",
            comparison.passed,
            comparison.not_compared or "; ".join(comparison.problems),
            kind="not_compared" if comparison.not_compared else "regression",
        )


def show_comparison(out: Output, comparison: TierComparison | None) -> None:
    if comparison is None:
        return
    if comparison.not_compared:  # nothing to set side by side: no table, no "regression"
        out.fail(f"not compared with {comparison.baseline_path}: {comparison.not_compared}")
        return
    out.render(compare_table(comparison))
    for problem in comparison.problems:
        out.fail(f"regression: {problem}")
    if comparison.passed:
        out.ok(f"no regression against {comparison.baseline_path}")


def show_record(out: Output, record: TierRecord) -> None:
    """What finishing decided: the comparison, the baseline written, the notes, the client."""
    show_comparison(out, record.comparison)
    if record.baseline:
        dest, kept = record.baseline
        out.say(f"baseline written: {dest}" + (f" (previous kept as {kept})" if kept else ""))
    for note in record.notes:
        out.warn(note)
    if record.client_bound:
        out.warn(record.client_bound)


def warn_if_client_bound(out: Output, selfload: SelfLoadMonitor) -> None:
    """Say so (once) when calibrate's own CPU, not the server, limits what is measured."""
    if text := selfload.poll_warning():
        out.warn(text)


def warn_stream_check(out: Output, check: StreamCheck, slo: SloConfig) -> None:
    """Say once, before any load, when the server refused streamed requests (the probe)."""
    if note := check.note():
        out.warn(note)
    if check.fell_back and not check.stream and slo.needs_stream:
        out.warn(
            "TTFT and TPOT SLOs cannot be met unstreamed: every request counts as missing them; "
            "let streamed requests through to the server, or set only an E2E SLO"
        )


def warn_if_not_streamed(out: Output, rows: Sequence[TierRow], stream: bool) -> None:
    """Streaming was asked for but no answer came as a stream: the server answered JSON."""
    # rows with at least one request answered: all failed says nothing about streaming
    answered = [r for r in rows if (r.items or 0) > (r.errors or 0)]
    if stream and answered and all(r.ttft.p50_s is None for r in answered):
        out.warn(
            "the server answered the streamed requests without streaming (plain JSON): TTFT, "
            "TPOT and ITL were not measured; E2E latency and throughput were"
        )
    counted = {r.tokens_counted_by for r in answered} - {None, "usage"}
    if counted:
        out.say("output tokens counted from stream chunks (the server sent no usage in the stream)")
