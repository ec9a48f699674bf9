"""What one ladder is asked to do, who watches it, and what it comes back with."""

from __future__ import annotations

from dataclasses import dataclass, field

from calibrate.stages.ladder.result import Axis, LadderResult
from calibrate.stages.ladder.run import LadderOptions
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.measure.tier_finish import TierOutcome
from calibrate.stages.measure.tier_run import MeasureSpec, StageWatcher, TierEnv
from calibrate.stages.measure.tiers import Tier
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


LadderWatcher = StageWatcher[LadderOptions, Tier, ServerCap]  # the plan, then each tier
LadderEnv = TierEnv[LadderWatcher]  # where a ladder runs (the opened stage), who watches it
LadderOutcome = TierOutcome[LadderResult, LadderOptions]  # a finished ladder, recorded
