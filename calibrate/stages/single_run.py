"""``calibrate single`` whole: the fixed prompt once, then ``--determinism N`` copies.

The copies (N one after another, then N at once) run after a passing answer and before the
ledger line; with ``--require-match`` answers that differ fail the stage (exit 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from calibrate.errors import UsageError
from calibrate.io.junit import JUnitSuite
from calibrate.load.sender import Sender
from calibrate.redact import one_line
from calibrate.stages.context import StageContext
from calibrate.stages.determinism import DeterminismCheck, across, managed_switch
from calibrate.stages.determinism.wave import CopiesWave, send_copies
from calibrate.stages.measure.item_records import item_record
from calibrate.stages.prepare.server_cap import running_cap
from calibrate.stages.single import SingleResult, run_single
from calibrate.state.gates import next_step
from calibrate.state.ledger import baseline_path

Say = Callable[[str], None]
Line = tuple[Literal["say", "warn", "ok", "fail"], str]


@dataclass(frozen=True)
class SingleSpec:
    """What ``single`` was asked: how to send, the baseline, the copies."""

    stream: bool = False
    save_baseline: bool = False
    accept_model: bool = False
    determinism: int | None = None  # copies to send (2–1024), None: none
    require_match: bool = False

    def check(self) -> None:
        """Exit 2 before anything is sent."""
        if self.determinism is not None and not 2 <= self.determinism <= 1024:
            raise UsageError(
                f"--determinism {self.determinism}: must be 2–1024 copies",
                "e.g. --determinism 8",
            )
        if self.require_match and self.determinism is None:
            raise UsageError("--require-match compares copies: give --determinism N with it")


@dataclass(frozen=True)
class SingleOutcome:
    """What ``single`` found: the answer, the copies, and the hint for a pass."""

    spec: SingleSpec
    result: SingleResult
    copies: dict[str, Any] | None  # what --determinism found
    run_id: str
    next_command: str

    @property
    def differ(self) -> bool:
        """--require-match and the copies' answers differ, or copies failed (not established)."""
        return (
            self.copies is not None
            and self.spec.require_match
            and self.copies["deterministic"] is not True
        )

    @property
    def why_differ(self) -> str:
        if self.copies is not None and self.copies["deterministic"] is None:
            at_once = self.copies.get("at_once") or {}
            ran, sent = at_once.get("ran_at_once"), at_once.get("in_flight")
            if ran is not None and sent is not None and ran < sent:
                return (
                    f"the server ran {ran} at once, not {sent}: that {sent} at once answer alike "
                    "is not established"
                )
            return "copies went unanswered: that they answer alike is not established"
        return "the copies' answers differ"

    @property
    def passed(self) -> bool:
        return self.result.passed and not self.differ

    def add_checks(self, suite: JUnitSuite) -> None:
        """The JUnit checks: the answer, and with --require-match the copies."""
        record = self.result.record
        suite.check(
            "fixed prompt answered completely",
            self.result.passed,
            "; ".join(self.result.problems),
            kind=record.error.kind if record.error else "",
            time_s=record.elapsed_s,
        )
        if self.copies is not None and self.spec.require_match:
            suite.check(
                "copies of the fixed prompt answer alike",
                self.copies["deterministic"] is True,
                self.why_differ,
                kind="nondeterministic",
            )

    def answer_lines(self) -> list[Line]:
        """The server's warnings, the answer and its numbers."""
        result, record = self.result, self.result.record
        usage = record.usage
        tokens = f"{usage.prompt_tokens}+{usage.completion_tokens} tokens" if usage else "no usage"
        ttft = f", ttft {record.ttft_s:.3f}s" if record.ttft_s is not None else ""
        finish = (
            f"finish_reason {record.finish_reason}" if record.finish_reason else "no finish_reason"
        )
        served = (
            f"served model '{one_line(record.served_model)}'"
            if record.served_model
            else "no model named"
        )
        out: list[Line] = [("warn", warning) for warning in result.warnings]
        if record.text is None and record.finish_reason is None and record.error is not None:
            return out  # no answer: the verdict says what went wrong, first
        if record.text is not None:
            out.append(("say", f"answer: {record.text.strip()}"))
        out.append(("say", f"{finish}, {tokens}, {record.elapsed_s:.3f}s{ttft}, {served}"))
        return out

    def verdict_lines(self, ctx: StageContext) -> list[Line]:
        """Passed or why not, and what to do next."""
        result = self.result
        out: list[Line] = []
        if self.differ:
            out.append(("fail", f"--require-match: {self.why_differ}"))
        if self.passed:
            saved = f"; baseline {result.baseline}: {baseline_path(ctx.config)}"
            out.append(
                ("ok", f"single passed (run {self.run_id})" + (saved if result.baseline else ""))
            )
            out.append(("say", f"next: {self.next_command}"))
        else:
            out += [("fail", f"single failed: {problem}") for problem in result.problems]
            out.append(("say", f"records: {ctx.run.file('records.jsonl')}"))
        return out

    def to_json(self) -> dict[str, Any]:
        result = self.result
        return {
            "passed": self.passed,  # the stage's verdict (the exit code's), copies included
            "run_id": self.run_id,
            "record": result.record.to_json(),
            "baseline": result.baseline,
            **result.summary(),
            **({"determinism": self.copies} if self.copies is not None else {}),
        }


def run(ctx: StageContext, spec: SingleSpec, say: Say, warn: Say) -> SingleOutcome:
    """Stage A with its copies; the verdict (copies included) goes to the ledger."""
    found: dict[str, Any] = {}

    def after() -> tuple[bool, dict[str, Any]]:
        found["determinism"] = copies(ctx, spec, say, warn)
        same = found["determinism"]["deterministic"] is True
        return same or not spec.require_match, {"determinism": found["determinism"]}

    result = run_single(
        ctx,
        stream=spec.stream,
        save_baseline=spec.save_baseline,
        accept_model=spec.accept_model,
        after=after if spec.determinism else None,
        say=say,
    )
    outcome = SingleOutcome(spec, result, found.get("determinism"), ctx.run.run_id, "")
    if not outcome.passed:
        return outcome
    return replace(outcome, next_command=next_step(ctx.config, ctx.ledger, ctx.target))


def copies(ctx: StageContext, spec: SingleSpec, say: Say, warn: Say) -> dict[str, Any]:
    """N copies one after another, then N at once: what each set of answers says."""
    n = int(spec.determinism or 0)
    how = CopiesWave(n, stream=spec.stream)
    sender = Sender.over(ctx.client)
    found: dict[str, Any] = {}
    checks: list[DeterminismCheck] = []
    cap = running_cap(ctx).cap  # a server that runs fewer at once queues the rest: no batch
    for key, where, batch in (
        ("one_by_one", "one after another", 1),
        ("at_once", f"{n} at once", n),
    ):
        check = send_copies(
            ctx,
            sender,
            None,
            how,
            batch,
            lambda item, in_flight: item_record(ctx, item, 1, in_flight, None),
            cap,
        )
        (say if check.deterministic and not check.queued else warn)(check.describe(where))
        found[key] = {**check.to_json(), "in_flight": batch, "ran_at_once": check.ran_at_once}
        checks.append(check)
    one, many = checks
    apart = across(one, many)  # each set alike, not as the other: the answer changes with load
    if apart is not None:
        warn(
            f"one after another and {n} at once answer differently: first difference at token "
            f"{apart.token}: {apart.common!r} vs {apart.variant!r}"
        )
    if apart is not None or any(c.deterministic is False for c in checks):
        deterministic: bool | None = False
    else:
        # copies that queued behind a smaller cap shared no batch of N: not established
        deterministic = None if any(c.deterministic is None or c.queued for c in checks) else True
    switch = managed_switch(ctx.config)
    if deterministic is False and switch is not None:
        say(switch.advice())
    return {
        **found,
        "across": asdict(apart) if apart is not None else None,
        "deterministic": deterministic,
        "switch": switch.to_json() if switch is not None else None,
        "server_cap": cap.to_json() if cap is not None else None,
    }
