"""How a tune shows itself: what it is about to do, a line per finished candidate (a progress
bar under them on a terminal), then the ranked table (the essential columns, fitting 100;
--wide: every one), the winner with its margin and the next step."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from calibrate.cli.output import Output
from calibrate.gpu.energy import RANK_FIELDS
from calibrate.io.tier_table.tune import Point, TuneRow
from calibrate.io.tier_table.windows import across, note
from calibrate.report.progress import Plan, progress_bar
from calibrate.report.tables.cells import figure
from calibrate.report.tables.tune import front_rows, front_table, ranked_table
from calibrate.report.tune_report import plot_svg
from calibrate.server.exit_status import ended_words
from calibrate.stages.context import StageContext
from calibrate.stages.measure.slo import describe
from calibrate.stages.tune import TuneEnv, TuneFinished, TuneSetup
from calibrate.stages.tune.outcome import TuneOutcome
from calibrate.stages.tune.result import CandidateResult
from calibrate.stages.tune.search import schedule


def finished_line(result: CandidateResult) -> str:
    """``c03 (slots=4): 12.31 req/s at concurrency 4, p50 0.021 s, 0 errors``."""
    again = " again" if result.again else ""  # one of the first two, measured again
    head = f"{result.candidate.id} ({result.candidate.describe()}){again}"
    if not result.started:
        code = (
            f" ({ended_words(result.start_exit_code)})"
            if result.start_exit_code is not None
            else ""
        )
        return f"{head}: did not start{code}: {result.start_error}"
    if not result.served:
        return f"{head}: started but did not serve: {result.start_error}"
    best = result.best
    crash = f"; the server crashed ({ended_words(result.exit_code)})" if result.crashed else ""
    if best is None:
        return f"{head}: no level passed{crash}"
    errors = result.measurement.errors if result.measurement else 0
    return (
        f"{head}: {best.goodput_per_s:.2f} req/s goodput at concurrency {best.concurrency}, "
        f"p50 {figure(best.p50_s, '.3f')} s, {errors} errors{crash}"
    )


def show_ranked(out: Output, rows: Sequence[TuneRow], title: str | None) -> None:
    """One table, on a terminal and in a log alike (``report RUN`` shows the same)."""
    out.show_table(lambda width: ranked_table(rows, title, width), live=False)
    if said := note([(r.id, r.window) for r in rows]):
        out.say(said)


@contextmanager
def candidate_progress(
    out: Output, setup: TuneSetup, measured_before: int
) -> Iterator[Callable[[], None]]:
    """A progress bar over the candidates left on a terminal (none in a log); yields ``step``,
    called as each candidate's result comes."""
    steps = sum(size for size, _ in schedule(setup.plan.size, setup.search))
    steps = min(steps, setup.restarts or steps) - measured_before
    if not out.is_tty or steps <= 0:
        yield lambda: None
        return
    sweep = setup.ctx.config.sweep
    step_s = len(setup.settings.levels) * sweep.level_s * sweep.repeats * setup.window
    bar = progress_bar(out.console, Plan(steps, step_s, "candidates"))
    task = bar.add_task("tune", total=steps)
    with bar:
        yield lambda: bar.advance(task)


RANK_UNITS = {"joules_per_token": "J/output token", "usd_per_1m": "$ per 1M output tokens"}


def winner_text(outcome: TuneOutcome, gain_min: float = 0.0) -> str | None:
    win = outcome.winner
    if win is None or win.best is None:
        return None
    text = (
        f"winner: {win.candidate.id} ({win.candidate.describe()}): "
        f"{win.best.goodput_per_s:.2f} req/s at concurrency {win.best.concurrency}"
    )
    second, lead = outcome.runner_up, outcome.lead
    column = RANK_FIELDS.get(outcome.rank_by)
    if column is not None and second is not None and second.best is not None:
        mine, theirs = getattr(win.best, column), getattr(second.best, column)
        if mine is not None and theirs is not None:  # the figure it was ranked by, as it is
            unit = RANK_UNITS[outcome.rank_by]
            text += (
                f"; {mine:.3g} {unit} against {theirs:.3g} for the runner-up {second.candidate.id}"
                f" ({second.candidate.describe()}) — one figure each, no interval: ranked by "
                f"{outcome.rank_by}, not tested"
            )
            return text + across(win.window, second.window)
    if second is not None and lead is not None:
        margin = lead.fraction
        second_named = f"{second.candidate.id} ({second.candidate.describe()})"
        text += f", {margin:+.0%} over the runner-up {second_named}"
        text += lead.caveat()  # "not significant at 95 %" when the intervals overlap
        if unlike := across(win.window, second.window):  # a halving's rows of two windows
            text += unlike  # and no "about equal" or "served more" over them either
        elif margin < 0:  # the runner-up measured more: what took this one is pin's reason, below
            surely = "surely " if lead.significant else ""
            text += f" — the runner-up {surely}served more"
        elif margin < gain_min and lead.significant is not False:
            text += (
                f" — within [sweep] gain_min ({gain_min:.0%}): about equal, measure longer to tell"
            )
    elif second is None:
        text += " (no runner-up measured)"
    return text


def show_start(out: Output, setup: TuneSetup, measured_before: int) -> None:
    """The run about to go: new (its grid) or resumed (how far it got), what ranks the
    candidates; the levels left out."""
    run_id, plan = setup.ctx.run.run_id, setup.plan
    ranked = f"ranked by {setup.rank_by} ({describe(setup.settings.slo)})"
    if setup.resumed:
        out.say(
            f"resuming tune run {run_id}: {measured_before} of {plan.size} "
            f"candidates already measured; {ranked}"
        )
    else:
        axes = "; ".join(f"{a.key} ∈ {{{', '.join(a.values)}}}" for a in plan.axes)
        search = f"{setup.search} search"
        if setup.search == "refine":
            search += f" (patience {setup.patience})"
        if setup.restarts:
            search += f", at most {setup.restarts} restarts"
        out.say(
            f"tune run {run_id}: {plan.size} candidates ({axes}), {search}, "
            f"{setup.kind} restarted per candidate; {ranked}"
        )
    if note := setup.settings.skipped_note():
        out.say(note)


# What a candidate says while it is measured: its restart, its server's command, each level.
_AS_IT_GOES = re.compile(
    r"candidate \S+ \(.*\): restart and measure$|starting: |  \S+ concurrency \d+: "
)


def progress_say(out: Output) -> Callable[[str], None]:
    """The stage's progress lines: all of them on a terminal or with --wide; in a log one line
    per candidate, its finished line (the levels are in its folder, candidates/*/tiers.jsonl,
    and each server's command in runs/server.log)."""
    if out.is_tty or out.wide:
        return out.say

    def say(text: str) -> None:
        if not _AS_IT_GOES.match(text):
            out.say(text)

    return say


def tune_env(out: Output, ctx: StageContext, resume: str) -> TuneEnv:
    """The stage's callbacks, shown on ``out``; plot.svg drawn by the tune report."""
    return TuneEnv(
        ctx,
        draw_plot=plot_svg,
        resume=resume,
        say=progress_say(out),
        on_start=lambda setup, before: show_start(out, setup, before),
        progress=lambda setup, before: candidate_progress(out, setup, before),
        on_result=lambda result: out.say(finished_line(result)),
    )


def show_finished(out: Output, finished: TuneFinished) -> None:
    """The ranked table, where the files are, what the memory step and budget left, the winner,
    and (when it passed) the next step."""
    setup = finished.setup
    outcome, key = finished.outcome, setup.plan.memory_key or "memory fraction"
    if finished.table:
        # in a log without its title, as a ladder's table: the first line said what ranks
        # the candidates, the tables line names the run
        show_ranked(out, finished.table, finished.title if out.is_tty else None)
        plot = f", plot: {finished.plot}" if finished.plot else ""
        out.say(f"tables: {finished.tables}{plot}")
    for probe in outcome.probes:
        if not probe.ok:
            out.say(f"memory step: {key}={probe.fraction} did not start: {probe.error}")
    if outcome.memory_failed:
        fractions = ", ".join(setup.plan.memory_fractions)
        out.fail(
            f"no {key} in {fractions} let the engine start and serve one request "
            "(see runs/server.log); add lower values to [tune] memory_fractions"
        )
    if outcome.untested and setup.search == "refine":
        out.warn(
            f"{outcome.spent_by} spent after {outcome.restarts} restart(s): the search would "
            f"measure {outcome.untested[0].id} next; run the same command again (with a larger "
            f"{outcome.spent_by}) to continue"
        )
    elif outcome.untested:
        ids = ", ".join(c.id for c in outcome.untested)
        out.warn(
            f"{outcome.spent_by} spent: {len(outcome.untested)} candidate(s) left untested: "
            f"{ids}; run the same command again to continue"
        )
    elif setup.search == "refine" and outcome.stopped:
        out.say(
            f"refine: {outcome.restarts} restart(s) of the grid's {setup.plan.size} candidates; "
            f"{outcome.stopped}"
        )
    text = winner_text(outcome, setup.ctx.config.sweep.gain_min)
    doubt = outcome.doubt
    if outcome.inconclusive and doubt is not None:
        out.fail(f"tune {outcome.inconclusive}")
        out.say(f"what to do: {doubt.what_to_do}")
    elif text:
        if doubt is not None:
            out.warn(
                f"{doubt.conservative}, the conservative answer, taken under noise (--conservative)"
            )
        out.ok(text)
    elif outcome.ranked and all(
        r.served and r.measurement is not None and not r.measurement.errors for r in outcome.ranked
    ):
        slo = describe(setup.settings.slo)
        out.fail(
            f"tune found no candidate with a level that met the SLOs ({slo}): every level ran "
            "without errors, but none of its requests within them (see the table)"
        )
    else:
        out.fail(
            "tune found no candidate that served a passing level (see the table and "
            "each candidate's incidents)"
        )
    show_front(out, finished)
    if finished.next_step is not None:
        out.say(f"next: {finished.next_step}   (pin writes every flag of the winner)")


def show_front(out: Output, finished: TuneFinished) -> None:
    """The Pareto front (goodput per user against total goodput) and the point pin takes."""
    found = finished.summary.details.get("pareto") or []
    points = [p for data in found if (p := Point.from_json(data)) is not None]
    if len(front_rows(points)) > 1:  # one point: the line below says it all (report draws it)
        title = "Pareto front: tokens/s per user against tokens/s in all"
        out.show_table(lambda width: front_table(points, title, width), live=False)
    reason = finished.summary.details.get("pinned_reason")
    if reason and finished.outcome.winner is not None:
        out.say(str(reason))
