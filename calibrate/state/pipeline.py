"""The pipeline in one table: each stage, what it needs, and what to run after it (SPEC §4.3).

The gates (``gates.check_gate``), ``status``'s "next" and every "next:" hint a command prints
read this table, so the three can never disagree: a stage's hint is ``gates.next_step`` read from the
ledger right after the stage recorded its result, the very answer ``status`` gives next. A hint
is given only after a stage passed: a stage that exited 1 or 130 says how to fix or resume it
instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from calibrate.state.ledger import Ledger, LedgerEntry, is_context_ladder

StageName = Literal[
    "single", "repro", "ladder", "sweep", "tune", "pin", "verify", "rollback", "batch"
]
Need = Literal["nothing", "baseline", "repro", "ladder", "ladder_tier_or_pin"]

BATCH_COMMAND = "calibrate batch --input tasks.jsonl --out out.jsonl"
RESTART_THEN_VERIFY = "restart the server from scripts/launch.sh, then: calibrate verify"
ROLLBACK_AFTER_DEATH = "calibrate rollback"


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
#: what ``calibrate run`` runs, in order: the main line up to the launch script
RUN_LINE: tuple[StageName, ...] = ("single", "repro", "ladder", "sweep", "pin")
#: in ``RUN_LINE`` each of these measures, or pins, what the one before it found: an older one
#: than the stage before it is out of date
_BUILDS_ON = {"sweep": "ladder", "pin": "sweep"}
OPTIONAL: tuple[StageName, ...] = ("tune", "rollback", "batch")

_BY_NAME = {step.stage: step for step in PIPELINE}


def builds_on(stage: str) -> str | None:
    """The stage of ``RUN_LINE`` whose result ``stage`` measures or pins (None: none)."""
    return _BUILDS_ON.get(stage)


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


def restart_then_verify(script: str) -> str:
    """After a pin: start the server from the script it wrote, then verify."""
    if not script:
        return RESTART_THEN_VERIFY
    return f"calibrate server start --script {script} (or run it yourself), then: calibrate verify"


@dataclass(frozen=True)
class Standing:
    """The latest ledger line of each stage for one target, and where it stands in the ledger."""

    latest: dict[str, LedgerEntry]
    order: dict[str, int]  # stage → position of its latest line (higher is newer)
    context: LedgerEntry | None  # the latest ``ladder --axis context`` (never the main line's)

    def newer(self, stage: str, than: str) -> bool:
        return self.order.get(stage, -1) > self.order.get(than, -1)


def standing(ledger: Ledger, target: str) -> Standing:
    """Each stage's latest line for ``target``; a context ladder is kept apart."""
    latest: dict[str, LedgerEntry] = {}
    order: dict[str, int] = {}
    context: LedgerEntry | None = None
    for position, entry in ledger.view().of_target(target):
        if is_context_ladder(entry):
            context = entry  # verifies input lengths, not the ladder the main line needs
            continue
        latest[entry.stage] = entry
        order[entry.stage] = position
    return Standing(latest, order, context)
