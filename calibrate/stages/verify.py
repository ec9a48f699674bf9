"""Stage E′: after a restart, the fixed prompt against the baseline (SPEC §5.8).

The same comparison as repro with one run: "config consistent", or the diff.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calibrate.compare import Normaliser
from calibrate.setting import CalibratedSetting, resolve
from calibrate.stages.context import StageContext
from calibrate.stages.repro import ReproResult, against_baseline


@dataclass(frozen=True)
class VerifyResult:
    repro: ReproResult
    setting: CalibratedSetting | None  # what the server is supposed to run at

    @property
    def passed(self) -> bool:
        return self.repro.passed

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.repro.summary(), "consistent": self.passed}
        if self.setting is not None:
            out["setting"] = self.setting.to_json()
        return out


def run_verify(ctx: StageContext, normaliser: Normaliser) -> VerifyResult:
    """Run the fixed prompt once, compare it with the baseline, record the verdict."""
    repro = against_baseline(ctx, normaliser, runs=1)
    result = VerifyResult(repro, resolve(ctx.ledger, ctx.target))
    ctx.record_result(result.passed, result.summary())
    return result
