"""What a batch produces: live counters (``BatchProgress``), the final result (``BatchResult``)
and outcome (``BatchOutcome``). Each item's own line is ``sending/output_line.py``; what the
summary says of the result, and whether it passed, ``summary.py``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibrate.errors import CalibrateError, ExitCode
from calibrate.gpu.selfload import SelfLoadReport
from calibrate.numbers import rate_text
from calibrate.stages.batch.journal import Tally
from calibrate.stages.batch.plan import BatchPlan, BatchSpec
from calibrate.stages.batch.sending.lanes import EndpointReport
from calibrate.stages.batch.sending.outage import OutageEvent
from calibrate.stages.measure.format_check import OutputShape, ShapeCheck


def pace_text(ok: int, failed: int, seconds: float) -> str:
    """A rate as the summary says it: items/s, and with failed items among them, the ok ones'
    own rate beside it (items that failed fast are no work done: 0 ok read "893 items/s")."""
    finished_per_s = (ok + failed) / seconds if seconds > 0 else 0.0
    if not failed:
        return f"{rate_text(finished_per_s, '.1f')} items/s"
    ok_per_s = ok / seconds if seconds > 0 else 0.0
    return f"{rate_text(finished_per_s, '.1f')} items/s finished, {rate_text(ok_per_s, '.1f')} ok/s"


@dataclass(frozen=True)
class BatchProgress:
    to_run: int
    finished: int
    ok: int
    failed: int
    in_flight: int
    elapsed_s: float
    stopping: bool
    down: tuple[tuple[str, float], ...] = ()  # endpoints in an outage: (label, seconds down)
    outage_limit_s: float = 0.0
    endpoints: int = 1  # endpoints the run sends to

    def __post_init__(self) -> None:
        # the counts are read without a lock: a slot still busy with an item the journal has
        # just counted (or one sent ahead to a worker) would show more in flight than are left
        left = max(self.to_run - self.finished, 0)
        object.__setattr__(self, "in_flight", min(self.in_flight, left))

    @property
    def items_per_s(self) -> float:
        return self.finished / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """The time left at the run's rate so far; None when nothing says it: no rate yet,
        stopping, or every endpoint in an outage (nothing is sent until one answers)."""
        rate = self.items_per_s
        if rate <= 0 or self.stopping or len(self.down) >= self.endpoints:
            return None
        return (self.to_run - self.finished) / rate


@dataclass(frozen=True)
class BatchResult:
    total: int
    skipped: int
    to_run: int
    ok: int
    failed_by_kind: dict[str, int]
    interrupted: bool
    abandoned: int  # in flight when the grace period ended
    stopped_by: str | None  # control.StopReason, or None (ran to the end)
    stop_detail: str  # what stopped it, for the user (or why items were not reached)
    seconds: float
    output_tokens: int  # over the ok answers that said theirs
    retried_items: int
    attempts: int
    failures: tuple[dict[str, Any], ...]  # examples: id, kind, message
    preamble: tuple[int, tuple[str, ...]]  # count, examples
    too_long: tuple[int, tuple[str, ...]]
    shapes: tuple[OutputShape, ...]  # sample mode only
    selfload: SelfLoadReport | None
    out_path: Path
    endpoints: tuple[EndpointReport, ...] = ()
    outage_events: tuple[OutageEvent, ...] = ()
    untold: int = 0  # ok answers without usage: their output tokens are unknown, not 0

    @classmethod
    def of(
        cls,
        plan: BatchPlan,
        tally: Tally,
        stopped_by: str | None,
        stop_detail: str,
        *,
        abandoned: int,
        seconds: float,
        selfload: SelfLoadReport | None,
        out_path: Path,
        endpoints: tuple[EndpointReport, ...],
        events: list[OutageEvent],
    ) -> BatchResult:
        """The result of a run (pool and worker processes alike) from its plan and tally."""
        return cls(
            total=plan.total,
            skipped=plan.skipped,
            to_run=plan.to_run,
            ok=tally.ok,
            failed_by_kind=dict(tally.kinds),
            interrupted=stopped_by == "interrupted",
            abandoned=abandoned,
            stopped_by=stopped_by,
            stop_detail=stop_detail,
            seconds=seconds,
            output_tokens=tally.output_tokens,
            retried_items=tally.retried,
            attempts=tally.attempts,
            failures=tuple(tally.failures),
            preamble=(tally.preamble_n, tuple(tally.preamble)),
            too_long=(tally.too_long_n, tuple(tally.too_long)),
            shapes=tuple(tally.shapes),
            selfload=selfload,
            out_path=out_path,
            endpoints=endpoints,
            outage_events=tuple(events),
            untold=tally.untold,
        )

    @property
    def failed(self) -> int:
        return sum(self.failed_by_kind.values())

    @property
    def finished(self) -> int:
        return self.ok + self.failed

    @property
    def unfinished(self) -> int:
        """Items this run should have finished that have neither an ok nor a failed line."""
        return max(self.to_run - self.finished, 0)

    @property
    def remaining(self) -> int:
        """Items a rerun would still do (failed ones and those not reached)."""
        return self.total - self.skipped - self.ok

    @property
    def items_per_s(self) -> float:
        """Items finished (ok or failed) per second: the pace the run went through its input."""
        return self.finished / self.seconds if self.seconds > 0 else 0.0

    @property
    def ok_per_s(self) -> float:
        """Items answered ok per second: the work done (failed items are not)."""
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    def pace_text(self) -> str:
        return pace_text(self.ok, self.failed, self.seconds)

    @property
    def output_tokens_per_s(self) -> float | None:
        """Over the answers that said their tokens; None when none of the ok ones did (the
        server sent no usage: the figure is unknown, never 0)."""
        if self.ok and self.untold >= self.ok:
            return None
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0

    def tokens_text(self) -> str:
        """The output tokens/s as the summary says it, with what it leaves out."""
        rate = self.output_tokens_per_s
        if rate is None:
            return "output tokens not reported (the server sent no usage)"
        if not self.untold:
            return f"{rate_text(rate, '.0f')} output tokens/s"
        told = self.ok - self.untold
        return f"{rate_text(rate, '.0f')} output tokens/s from the {told} answers with usage"


@dataclass(frozen=True)
class BatchOutcome:
    """How a batch ended, for the command to show and exit with.

    ``checks``: the sample's shape checks (none without --sample). ``report``: the --json
    payload, None when the verdict could not be recorded. ``error``: raised once the summary is
    shown; without one the command exits with ``exit_code``.
    """

    result: BatchResult
    spec: BatchSpec
    checks: tuple[ShapeCheck, ...]
    resume: str  # the command that resumes this batch (no secret in it)
    report: dict[str, Any] | None
    error: CalibrateError | None
    exit_code: ExitCode
