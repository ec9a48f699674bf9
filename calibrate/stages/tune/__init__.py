"""calibrate tune: engine-flag candidates, each started, calibrated and ranked.

``run(request, env)`` is the whole stage after its run folder is open: the load lock, the plan
(every mistake exit 2 before anything starts), the search, the files and the ledger line. What
it has to show goes out through ``env``'s callbacks; drawing and printing are the caller's.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

from calibrate.errors import Interrupted
from calibrate.stages.context import StageContext
from calibrate.stages.env import kept_on_write_error, load_lock
from calibrate.stages.tune.result import CandidateResult
from calibrate.stages.tune.session import DrawPlot, Session, TuneFinished
from calibrate.stages.tune.setup import TuneRequest, TuneSetup, prepare
from calibrate.state.gates import next_step

__all__ = ["TuneEnv", "TuneFinished", "TuneRequest", "TuneSetup", "run"]

Step = Callable[[], None]


def _quiet(*_: object) -> None:
    """Shows nothing."""


@contextlib.contextmanager
def _no_progress(_setup: TuneSetup, _measured_before: int) -> Iterator[Step]:
    yield lambda: None


@dataclass(frozen=True)
class TuneEnv:
    """The opened stage and where a tune's progress goes (every callback may be silent)."""

    ctx: StageContext
    draw_plot: DrawPlot  # plot.svg's text from the ranked rows and the title
    resume: str  # the command that continues this run, said when it is interrupted
    say: Callable[[str], None] = _quiet  # one line of progress
    on_start: Callable[[TuneSetup, int], None] = _quiet  # (setup, candidates measured before)
    # around the search: yields the step called as each candidate's result comes
    progress: Callable[[TuneSetup, int], AbstractContextManager[Step]] = _no_progress
    on_result: Callable[[CandidateResult], None] = _quiet


def run(request: TuneRequest, env: TuneEnv) -> TuneFinished:
    """Plan, search, rank and record one tune run (one server at a time, resumable).

    Ctrl-C stops the server calibrate started and records the run as interrupted (exit 130,
    saying how to resume); a write error is exit 1 saying what was kept.
    """
    with load_lock(env.ctx):  # one load-sending stage, one server at a time
        setup = prepare(env.ctx, request)
        step: list[Step] = [lambda: None]  # the progress's, once it is up

        def on_result(result: CandidateResult) -> None:
            env.on_result(result)
            if not result.again:  # the bar counts the plan's candidates; a lead measured
                step[0]()  # again says so in its own lines, never past the bar's end

        session = Session(setup, notify=env.say, on_result=on_result, draw_plot=env.draw_plot)
        env.on_start(setup, session.measured_before)
        ctx, size = setup.ctx, setup.plan.size
        try:
            with (
                kept_on_write_error(ctx),
                env.progress(setup, session.measured_before) as step[0],
            ):
                finished = session.run()
        except KeyboardInterrupt:
            with contextlib.suppress(KeyboardInterrupt):
                session.interrupted()
            raise Interrupted(
                f"tune interrupted: {session.measured} of {size} candidates measured, kept in "
                f"{ctx.run.path}; the server calibrate started for it is stopped",
                f"Resume it: {env.resume}",
            ) from None
        if not finished.passed:
            return finished
        return dataclasses.replace(
            finished, next_step=next_step(ctx.config, ctx.ledger, ctx.target)
        )
