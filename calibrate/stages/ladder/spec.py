"""What one ladder is asked to do, who watches it, and what it comes back with."""

from __future__ import annotations

from dataclasses import dataclass

from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.ladder.result import LadderResult
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.measure.tier import Tier
from calibrate.stages.measure.tier_run import TierSpec
from calibrate.stages.measure.tier_stage.tier_finish import TierOutcome
from calibrate.stages.measure.tier_stage.watch import StageWatcher, TierEnv
from calibrate.workload import Axis


@dataclass(frozen=True)
class LadderSpec(TierSpec):
    """The ladder's flags, checked (a mistake in them is exit 2 before anything is sent)."""

    require_match: bool = False
    axis: Axis = "batch"
    context_lengths: tuple[int, ...] | None = None  # None: 512, 1k, … up to max_model_len
    context_batch: int = 1  # the batch size the context axis steps the length at


LadderWatcher = StageWatcher[LadderOptions, Tier, ServerCap]  # the plan, then each tier
LadderEnv = TierEnv[LadderWatcher]  # where a ladder runs (the opened stage), who watches it
LadderOutcome = TierOutcome[LadderResult, LadderOptions]  # a finished ladder, recorded
