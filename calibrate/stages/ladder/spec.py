"""What one ladder is asked to do, who watches it, and what it comes back with."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from calibrate.config import SloConfig
from calibrate.stages.context import StageContext
from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.ladder.result import Axis, LadderResult
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.measure.tier_finish import Determinism, TierRecord
from calibrate.stages.measure.tier_run import MeasureSpec, Measuring, TierWatcher
from calibrate.stages.measure.tiers import Tier
from calibrate.stages.prepare.stream_probe import StreamCheck
from calibrate.stages.prepare.task_pick import TaskPool
from calibrate.workload import WorkloadSpec


@dataclass(frozen=True)
class LadderSpec:
    """The ladder's flags, checked (a mistake in them is exit 2 before anything is sent)."""

    measure: MeasureSpec = field(default_factory=MeasureSpec)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    pool: TaskPool | None = None  # --tasks, read and checked before the run starts
    require_match: bool = False
    streaming: bool = True  # False: --no-stream
    slo_flags: tuple[str, ...] = ()  # --slo NAME:S …, over [slo]
    axis: Axis = "batch"
    context_lengths: tuple[int, ...] | None = None  # None: 512, 1k, … up to max_model_len
    context_batch: int = 1  # the batch size the context axis steps the length at


class LadderWatcher(TierWatcher, Protocol):
    """Who watches a ladder: what it will send, then each tier as it finishes."""

    def stream_checked(self, check: StreamCheck, slo: SloConfig) -> None:
        """The stream probe's finding, before any load."""

    def planned(
        self, options: LadderOptions, workload: WorkloadSpec, cap: ServerCap | None
    ) -> None:
        """The tiers, rounds and workload, once everything before the load is done."""

    def live(
        self, run_id: str, options: LadderOptions, watch: Measuring
    ) -> AbstractContextManager[Callable[[Tier], None]]:
        """Open while the tiers run; what it yields is told each finished tier."""
        ...


@dataclass(frozen=True)
class LadderEnv:
    """Where a ladder runs (the opened stage) and who watches it."""

    ctx: StageContext
    watcher: LadderWatcher


@dataclass(frozen=True)
class LadderOutcome:
    """A finished (or interrupted) ladder, recorded: what there is to say about it."""

    result: LadderResult
    record: TierRecord
    streamed: bool  # streaming was asked for, and the server took streamed requests
    determinism: Determinism | None = None
    next_step: str | None = None  # what to run next (after a pass)
    interrupted: bool = False

    @property
    def passed(self) -> bool:
        return self.record.entry.passed
