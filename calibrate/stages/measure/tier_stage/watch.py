"""Who watches a ladder or sweep as it runs, and the run it watches (SPEC §5.3, §5.6): the
watcher protocols (told, never asked: the command line draws them), the samplers started and
told (``watched``), the workload and the stream probe before the load (``prepare_load``), and the
load inside the watcher's live view (``run_live``), the only time the self-check judges.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from calibrate.config import LadderMode, SloConfig
from calibrate.io.tasks import TaskPool
from calibrate.stages.context import StageContext
from calibrate.stages.env import kept_on_write_error
from calibrate.stages.measure.tier_run import MeasureSpec, Measuring, measuring
from calibrate.stages.prepare.stream_probe import StreamCheck, probe_stream
from calibrate.stages.prepare.workload_plan import WorkloadPlan, prepare_workload
from calibrate.workload import WorkloadSpec

Opts = TypeVar("Opts", contravariant=True)  # a stage's options (LadderOptions, SweepOptions)
Step = TypeVar("Step", contravariant=True)  # what finishes one at a time (a Tier, a Level)
Cap = TypeVar("Cap", contravariant=True)  # the server's own cap, as the stage reads it
Found = TypeVar("Found")
W = TypeVar("W")
NO_LOAD = "no load sent"  # the self-check's quiet while a stage sends none (``watched``)


class TierWatcher(Protocol):
    """Who watches a ladder or sweep as it runs: told, never asked (the command line draws it)."""

    def say(self, text: str) -> None: ...

    def warn(self, text: str) -> None: ...

    def watching(self, watch: Measuring) -> None:
        """The samplers started (what they measure, what they could not)."""

    def stream_checked(self, check: StreamCheck, slo: SloConfig) -> None:
        """The stream probe's finding, before any load."""

    def tables(self, table: Path, source: str) -> None:
        """The finished rows, written to ``table`` (tiers.csv): show them."""


class StageWatcher(TierWatcher, Protocol[Opts, Step, Cap]):
    """Who watches one ladder or sweep: what it will send, then each tier or level."""

    def planned(self, options: Opts, workload: WorkloadSpec, cap: Cap | None) -> None:
        """The tiers or levels and the workload, once everything before the load is done."""

    def live(
        self, run_id: str, options: Opts, watch: Measuring
    ) -> AbstractContextManager[Callable[[Step], None]]:
        """Open while the load runs; what it yields is told each finished tier or level."""
        ...


@dataclass(frozen=True)
class TierEnv(Generic[W]):
    """Where a ladder or sweep runs (the opened stage) and who watches it."""

    ctx: StageContext
    watcher: W


@contextmanager
def watched(spec: MeasureSpec, ctx: StageContext, watcher: TierWatcher) -> Iterator[Measuring]:
    """``measuring``, told to the watcher; a write that fails keeps what was written. The
    self-check judges only the load (``run_live``): the probes before it and the tables and
    plot after it send nothing, and a busy machine then says nothing about the levels."""
    with kept_on_write_error(ctx), measuring(spec, ctx) as watch:
        watch.selfload.quiet(NO_LOAD, True)
        watcher.watching(watch)
        yield watch


def prepare_load(
    ctx: StageContext,
    watcher: TierWatcher,
    workload: WorkloadSpec,
    mode: LadderMode,
    *,
    pool: TaskPool | None,
    stream: bool,
    slo: SloConfig,
    probe_tokens: int | None = None,
) -> tuple[WorkloadPlan, StreamCheck | None]:
    """The workload (its notes warned), then the stream probe's finding when streaming."""
    plan = prepare_workload(
        ctx.config,
        ctx.client,
        workload,
        mode,
        ctx.params,
        kind=ctx.server_kind,
        pool=pool,
        probe_tokens=probe_tokens,
    )
    for note in plan.notes:
        watcher.warn(note)
    for line in plan.lines:  # the prefix cache as the workload meets it
        watcher.say(line)
    if not stream:
        return plan, None
    check = probe_stream(ctx, mode)  # a server that refuses streaming is measured unstreamed
    watcher.stream_checked(check, slo)
    return plan, check


def run_live(
    ctx: StageContext,
    watcher: StageWatcher[Opts, Step, Any],
    watch: Measuring,
    options: Opts,
    run: Callable[[Callable[[Step], None]], Found],
    partial: Callable[[], Found],
) -> tuple[Found, bool]:
    """The load inside the watcher's live view: (what it found, whether Ctrl-C cut it short);
    the self-check judges the windows of this load only (``watched``)."""
    watch.selfload.quiet(NO_LOAD, False)
    try:
        with watcher.live(ctx.run.run_id, options, watch) as told:
            return run(told), False
    except KeyboardInterrupt:
        return partial(), True
    finally:
        watch.selfload.quiet(NO_LOAD, True)
