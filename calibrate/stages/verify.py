"""Stage E′: after a restart, the fixed prompt against the baseline (SPEC §5.8).

The same comparison as repro with one run: "config consistent", or the diff. The restarted
server's ``/v1/models`` root is checked against the weights the setting was measured with
first (SPEC §3.1): other weights behind the same name are exit 3, naming both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from calibrate.errors import GateClosed
from calibrate.http.server_context import props_model_path
from calibrate.io.baseline import Normaliser
from calibrate.stages.context import StageContext
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.prepare.server_cap import running_cap, unknown_cap_line
from calibrate.stages.repro import ReproResult, against_baseline
from calibrate.stages.single import served_root, server_identity
from calibrate.state.gates import next_step
from calibrate.state.setting import CalibratedSetting, resolve
from calibrate.state.summaries import PlainSummary
from calibrate.state.weights_gate import setting_gate


@dataclass(frozen=True)
class VerifyResult:
    repro: ReproResult
    setting: CalibratedSetting | None  # what the server is supposed to run at
    next_command: str = ""  # ``gates.next_step`` once a pass is recorded
    cap: ServerCap | None = None  # the running server's cap, where it can be read
    cap_unknown: str = ""  # else why it is not known and how to make it known

    @property
    def cap_differs(self) -> bool:
        """The server runs at another cap than the verified batch size (SPEC §6.1)."""
        setting, cap = self.setting, self.cap
        return setting is not None and cap is not None and cap.slots != setting.batch_size

    @property
    def cap_line(self) -> str:
        """What verify could say of the server's cap: checked, differing, or not readable."""
        if self.setting is None:
            return ""
        batch = self.setting.batch_size
        if self.cap is None:
            return unknown_cap_line(self.cap_unknown, batch)
        if self.cap_differs:
            return (
                f"the server runs at cap {self.cap.slots} ({self.cap.source}), not the verified "
                f"batch {batch}: restart it from the pinned script (calibrate server start "
                "--script scripts/launch.sh)"
            )
        return f"the server's cap is {self.cap.slots} ({self.cap.source}), the verified batch"

    @property
    def passed(self) -> bool:
        return self.repro.passed and not self.cap_differs

    def verdict_line(self, run_id: str) -> str:
        """ "config consistent at batch 4, concurrency 4 (from pin): …" (the setting the server
        is supposed to run at, when there is one and its cap was read; "… is unchecked" when it
        could not be), or why verify failed."""
        comparison = self.repro.comparisons[0]
        if self.cap_differs and self.repro.passed:
            return f"verify failed: {self.cap_line}"
        if self.passed:
            note = (
                " (whitespace-only difference)" if comparison.verdict == "whitespace-only" else ""
            )
            at = ""
            if self.setting is not None and self.cap is not None:
                at = f" at {self.setting.describe()}"
            elif self.setting is not None:  # only the answer was checked: said in the headline
                at = f" (the answer; whether it runs at {self.setting.describe()} is unchecked)"
            return (
                f"config consistent{at}: the fixed prompt matches the baseline{note} (run {run_id})"
            )
        if comparison.failure:
            return f"verify failed: no answer to compare: {comparison.failure}"
        return "verify failed: the restarted server does not give the baseline answer"

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.repro.summary(), "consistent": self.passed}
        if self.setting is not None:
            out["setting"] = self.setting.to_json()
            out["server_cap"] = self.cap.to_json() if self.cap else None
        return out


def run_verify(
    ctx: StageContext,
    normaliser: Normaliser,
    *,
    force: bool = False,
    say: Callable[[str], None] = lambda line: None,
) -> VerifyResult:
    """Check the served weights, run the fixed prompt once, compare it with the baseline, and
    record the verdict (with the root the server serves now) and, after a pass, what to run
    next; the run folder is closed."""
    identity, _ = server_identity(ctx)  # no server there: exit 4
    root = served_root(identity, ctx.config.target.model) or props_model_path(ctx.client)
    if root:
        gate = setting_gate(ctx.config, ctx.ledger, ctx.target, served_root=root)
        if not gate.open and not force:
            raise GateClosed(
                f"verify is gated: {gate.reason}",
                f"Run first: {gate.run_first}   (or pass --force to run anyway; it is recorded)",
            )
        if not gate.open:
            ctx = replace(ctx, forced=True)
    repro = against_baseline(ctx, normaliser, runs=1, say=say)
    account = running_cap(ctx)
    setting = resolve(ctx.ledger, ctx.target)
    result = VerifyResult(repro, setting, cap=account.cap, cap_unknown=account.unknown)
    ctx.record_result(result.passed, PlainSummary(result.summary()), served_root=root)
    ctx.run.close()
    if not result.passed:
        return result
    return replace(result, next_command=next_step(ctx.config, ctx.ledger, ctx.target))
