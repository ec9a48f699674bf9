"""Stage D: put the server back on the last passing tier, with proof (SPEC §5.7).

Five steps (``steps``) — stop, vram, active, restart, compare — on the target's server
(``target_server``: calibrate's managed one, or the user's, waited for), recorded step by step in
``steps.jsonl`` and the ledger; the verdict and the next step are the run's ``RollbackResult``.
Restarting and freeing VRAM is recovery, not more capacity.
"""

from __future__ import annotations

from collections.abc import Callable

from calibrate.io.baseline import Normaliser
from calibrate.server.readiness import VramProbe
from calibrate.stages.context import StageContext
from calibrate.stages.env import guarded, load_lock
from calibrate.stages.rollback.result import (
    NOT_CAPACITY,
    STEP_TITLES,
    RollbackResult,
    StepResult,
)
from calibrate.stages.rollback.steps import Rollback, rollback_tier

__all__ = [
    "NOT_CAPACITY",
    "STEP_TITLES",
    "Rollback",
    "RollbackResult",
    "StepResult",
    "rollback_tier",
    "run_rollback",
]


def run_rollback(
    ctx: StageContext,
    normaliser: Normaliser,
    *,
    wait_s: float,
    notify: Callable[[str], None],
    on_step: Callable[[StepResult], None],
    vram_probe: VramProbe,
) -> RollbackResult:
    """The five steps under the target's load lock, Ctrl-C recorded as interrupted."""
    with load_lock(ctx), guarded(ctx):
        rollback = Rollback(
            ctx, normaliser, wait_s=wait_s, notify=notify, on_step=on_step, vram_probe=vram_probe
        )
        return rollback.run()
