"""What a rollback reports: each step's outcome, the run's verdict, its JUnit checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from calibrate.errors import ErrorKind
from calibrate.io.baseline import Comparison
from calibrate.io.junit import JUnitCase, JUnitSuite
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.prepare.server_cap import NO_CAP_REPORT
from calibrate.state.summaries import RollbackSummary
from calibrate.state.summary_values import Setting

StepName = Literal["stop", "vram", "active", "restart", "compare"]

NOT_CAPACITY = (
    "note: restarting and freeing VRAM is recovery, not more capacity: "
    "batch {batch} is still the ceiling the ladder measured"
)
STILL_DIFFERS = (
    "still differs at the verified setting: look at model loading or the environment, "
    "not concurrency"
)
NO_ANSWER = (
    "the fixed prompt got no answer {where} ({failure}): there is nothing to "
    "compare with the baseline, so nothing is known of the weights or the environment"
)
UNVERIFIED_DIFFERS = (
    "still differs after your restart, and {how}: the cause may be its batch size as much as "
    "model loading or the environment; restart it at batch {batch} "
    "(calibrate pin --out launch.sh && ./launch.sh), then run calibrate verify"
)


def restored_line(batch: int, *, read: bool, restarted: bool) -> str:
    """The compare step's headline: "batch B" where the server's own cap was read at B;
    "restarted at batch B" where calibrate restarted it so but could not read it back (a
    custom command); neither for a server the user restarted whose cap is unread."""
    if read:
        return f"restored: batch {batch}, concurrency 1, output matches the baseline"
    if restarted:
        return f"restored: restarted at batch {batch}, concurrency 1, output matches the baseline"
    return "the answer is restored: output matches the baseline at concurrency 1"


def unverified_differs(batch: int, cap: ServerCap | None, unknown: str) -> str:
    """A server the user restarted gives another answer, and it is not known to run at the
    verified batch ("": its cap was read at it, so the verified setting's words hold)."""
    if cap is None:
        how = f"the server's cap is not known ({unknown or NO_CAP_REPORT})"
    elif cap.slots != batch:
        how = f"the server runs at cap {cap.slots} ({cap.source}), not batch {batch}"
    else:
        return ""
    return UNVERIFIED_DIFFERS.format(how=how, batch=batch)


#: the JUnit check each step proves
STEP_TITLES: dict[StepName, str] = {
    "stop": "the old server is stopped",
    "vram": "its VRAM was released",
    "active": "the active setting is written",
    "restart": "the server is back at the verified setting",
    "compare": "the fixed prompt matches the baseline",
}


def compare_failed(
    comparison: Comparison, where: str = "at the verified setting"
) -> tuple[str, ErrorKind]:
    """Why the compare step failed, and its error kind: a request that got no answer is that
    failure (as ``verify`` says it), never "still differs" — there was no output to differ."""
    if not comparison.failure:
        return STILL_DIFFERS, "invalid_response"
    head = comparison.failure.replace(",", ":").split(":", 1)[0].strip()
    kind: ErrorKind = next((k for k in get_args(ErrorKind) if k == head), "invalid_response")
    return NO_ANSWER.format(where=where, failure=comparison.failure), kind


@dataclass(frozen=True)
class StepResult:
    n: int
    name: StepName
    ok: bool
    message: str
    elapsed_s: float
    detail: dict[str, Any] = field(default_factory=dict)
    exit_code: int = 0
    kind: ErrorKind | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "step": self.name,
            "ok": self.ok,
            "message": self.message,
            "elapsed_s": round(self.elapsed_s, 3),
            **self.detail,
        }


@dataclass(frozen=True)
class RollbackResult:
    batch_size: int
    source: str
    managed: bool
    steps: tuple[StepResult, ...]
    comparison: Comparison | None
    exit_code: int
    setting: Setting | None  # set once the "active" step ran
    next_command: str = ""  # ``gates.next_step`` once the rollback is recorded ("" if it failed)

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def failed(self) -> StepResult | None:
        return next((s for s in self.steps if not s.ok), None)

    def unchecked(self, step: StepResult) -> str:
        """Why a step that went through did not prove its check ("": it did): VRAM release not
        measured (no NVML) or not proven (PID and pre-start level unknown); a server the user
        restarted that answered, with no cap read that says it runs at the verified batch."""
        if not step.ok:
            return ""
        if step.name == "vram" and step.detail.get("pid_listed") is None:
            return f"not checked: {step.message}"
        if step.name == "restart" and not self.managed:
            compare = next((s for s in self.steps if s.name == "compare"), None)
            if compare is None or not compare.ok:
                return "not checked: a server answered; step 5 did not confirm its setting"
            if compare.detail.get("server_cap") is None:
                return (
                    "not checked: a server answered, but its cap could not be read: that it "
                    f"runs at batch {self.batch_size} is not known"
                )
        return ""

    def summary(self) -> RollbackSummary:
        failed = self.failed
        steps: list[dict[str, Any]] = []
        for s in self.steps:
            why = self.unchecked(s)
            steps.append({"step": s.name, "ok": s.ok, **({"unchecked": why} if why else {})})
        details = {
            "batch_size": self.batch_size,
            "source": self.source,
            "managed": self.managed,
            "steps": steps,
        }
        return RollbackSummary(self.setting, failed.name if failed else "", details)

    def add_checks(self, suite: JUnitSuite) -> None:
        """One check per step reached, a step that went through without proving its check as
        skipped (``unchecked``); the steps after a failure as skipped."""
        for step in self.steps:
            title = STEP_TITLES[step.name]
            if why := self.unchecked(step):
                case = JUnitCase(title, "calibrate.rollback", step.elapsed_s, skipped=why)
                suite.add(case)
                continue
            suite.check(title, step.ok, step.message, kind=step.kind or "", time_s=step.elapsed_s)
        reached = {s.name for s in self.steps}
        for name, title in STEP_TITLES.items():
            if name not in reached:
                skipped = "not reached: an earlier step failed"
                suite.add(JUnitCase(title, "calibrate.rollback", skipped=skipped))
