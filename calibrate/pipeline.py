"""The pipeline in one table: each stage, what it needs, and what to run after it (SPEC §4.3).

The gates (``ledger.check_gate``), ``status``'s "next" and every "next:" hint a command prints
read this table, so the three can never disagree. A hint is given only after a stage passed:
a stage that exited 1 or 130 says how to fix or resume it instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

StageName = Literal[
    "single", "repro", "ladder", "sweep", "tune", "pin", "verify", "rollback", "batch"
]
Need = Literal["nothing", "baseline", "repro", "ladder", "ladder_tier_or_pin"]

BATCH_COMMAND = "calibrate batch --input tasks.jsonl --out out.jsonl"
RESTART_THEN_VERIFY = "restart the server from scripts/launch.sh, then: calibrate verify"


@dataclass(frozen=True)
class Step:
    """One stage of the pipeline."""

    stage: StageName
    needs: Need
    run_first: str  # the command that satisfies ``needs``
    then: str  # what to run after this stage passed
    derives_setting: bool = False  # gated against the weights the setting was measured with


PIPELINE: tuple[Step, ...] = (
    Step("single", "nothing", "", "calibrate repro"),
    Step("repro", "baseline", "calibrate single", "calibrate ladder"),
    Step("ladder", "repro", "calibrate repro", "calibrate sweep"),
    Step("sweep", "ladder", "calibrate ladder", "calibrate pin"),
    Step("tune", "ladder", "calibrate ladder", "calibrate pin"),
    Step("pin", "ladder", "calibrate ladder", RESTART_THEN_VERIFY, derives_setting=True),
    Step("verify", "baseline", "calibrate single", BATCH_COMMAND, derives_setting=True),
    Step("rollback", "ladder_tier_or_pin", "calibrate ladder", BATCH_COMMAND),
    Step("batch", "nothing", "", ""),
)

#: the order ``status`` walks to find the next command (optional stages left out)
MAIN_LINE: tuple[StageName, ...] = ("single", "repro", "ladder", "sweep", "pin", "verify")
OPTIONAL: tuple[StageName, ...] = ("tune", "rollback", "batch")

_BY_NAME = {step.stage: step for step in PIPELINE}


def step(stage: str) -> Step | None:
    """The table row of ``stage`` (None for names outside the pipeline)."""
    for name, row in _BY_NAME.items():
        if name == stage:
            return row
    return None


def next_after(stage: str) -> str:
    """The "next:" hint after ``stage`` passed ("" when there is none)."""
    row = step(stage)
    return row.then if row is not None else ""
