"""A finished ladder tier (SPEC §5.3): its rounds, its aggregate, the verdict of the stop rules,
and which verdicts keep a tier or level as passed."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from calibrate.io.tier_table.cells import picked, row_json
from calibrate.io.tier_table.columns import PER_TOKEN
from calibrate.io.tier_table.columns import Column as C
from calibrate.io.tier_table.row import DeterminismCells, LadderCells, TierRow
from calibrate.stages.determinism import DeterminismCheck
from calibrate.stages.measure.tiers import Stats, Unseen

Verdict = Literal[
    "fail", "stop: slo", "stop: cap", "stop: preempt", "stop: vram", "stop: latency", "pass"
]
StopReason = Literal[
    "failure", "slo", "cap", "preempt", "vram", "latency", "completed", "interrupted"
]
# Verdicts whose tier is not kept: it failed, broke an SLO, measured the server's queue (cap) or
# had its KV cache full enough that the server preempted requests.
NOT_KEPT = (None, "", "fail", "stop: slo", "stop: cap", "stop: preempt")


def kept(verdict: object) -> bool:
    """Whether a tier or level with this verdict counts as passed: not failed, not over an SLO,
    not above the server's own cap, not preempting (the one rule for live tiers, ledger rows
    and tables read back)."""
    return verdict not in NOT_KEPT


@dataclass(frozen=True)
class Tier:
    """A finished ladder tier: its rounds, the aggregate, and the verdict of the stop rules."""

    stats: Stats
    rounds: tuple[Stats, ...]
    verdict: Verdict
    reason: str
    rounds_planned: int
    determinism: DeterminismCheck | None = None  # [determinism] copies, after the rounds
    client_bound: str = ""  # why calibrate itself was the bottleneck during it ("": it was not)
    # why the server's running count cannot show it ran B at once
    # (server_account.cap.running_unseen)
    unseen: Unseen | None = None

    @property
    def batch_size(self) -> int:
        return self.stats.batch_size

    @property
    def passed(self) -> bool:
        """Kept as passed: a clean tier, or one stopped by VRAM or latency. A tier over an SLO
        is not kept (it breaks the bound the user set), nor one above the server's cap or with
        preempted requests (the one before it is the last passing)."""
        return kept(self.verdict)

    def row(self, axis: str | None = None, mode: str | None = None) -> TierRow:
        """Its row in tiers.csv and tiers.jsonl (``axis`` and ``mode``: the table's, at the end)."""
        return replace(
            self.stats.row(),
            verdict=self.verdict,
            client_bound=self.client_bound or None,
            ladder=LadderCells(
                len(self.rounds), self.reason, self.unseen.why if self.unseen else None, axis, mode
            ),
            determinism=self.determinism.cells() if self.determinism else DeterminismCells(),
        )

    def to_json(self) -> dict[str, Any]:
        return row_json(self.row())

    def short(self) -> dict[str, Any]:
        """The ledger's short form of a tier (goodput and energy where measured)."""
        row = self.row()
        return {
            **picked(row, (C.BATCH_SIZE, C.VERDICT, C.PER_ITEM_S, C.ERRORS), 4),
            **picked(row, (C.GOODPUT_PER_S,), 4, measured=True),
            **picked(row, PER_TOKEN, 6, measured=True),  # pin writes them in its script
        }
