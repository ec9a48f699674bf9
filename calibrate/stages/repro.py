"""Stage B: the fixed prompt again, compared with the baseline (SPEC §5.2)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from calibrate.http.models import ServerIdentity
from calibrate.io.baseline import Comparison, Normaliser, compare, read_baseline
from calibrate.io.jsonl import load_jsonl_objects
from calibrate.io.junit import JUnitSuite
from calibrate.stages.context import StageContext
from calibrate.stages.single import fixed_prompt_call, known_cause, waiting_line
from calibrate.state.gates import next_step
from calibrate.state.ledger import baseline_path
from calibrate.state.summaries import PlainSummary


@dataclass(frozen=True)
class ReproResult:
    comparisons: tuple[Comparison, ...]
    next_command: str = ""  # ``gates.next_step`` once a live pass is recorded
    # a failed request whose own cause is known (``single.known_cause``): what to change
    cause: str = ""

    @property
    def passed(self) -> bool:
        return bool(self.comparisons) and all(c.passed for c in self.comparisons)

    @property
    def verdict(self) -> str:
        verdicts = {c.verdict for c in self.comparisons}
        for worst in ("differs", "whitespace-only"):
            if worst in verdicts:
                return worst
        return "identical"

    def summary(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "runs": len(self.comparisons),
            "identical": sum(c.verdict == "identical" for c in self.comparisons),
            "differing": sorted({f for c in self.comparisons for f in c.differing}),
        }

    def add_checks(self, suite: JUnitSuite) -> None:
        """One JUnit check per run."""
        for n, comparison in enumerate(self.comparisons, 1):
            suite.check(
                f"run {n} matches the baseline",
                comparison.passed,
                check_reason(comparison),
                kind=comparison.verdict,
            )

    def verdict_line(self) -> str:
        """ "repro passed: …" or "repro failed: …" (failed requests named as such)."""
        summary = self.summary()
        if self.passed:
            note = " (whitespace only)" if self.verdict == "whitespace-only" else ""
            return f"repro passed: {summary['identical']}/{summary['runs']} identical{note}"
        unanswered = [c.failure for c in self.comparisons if c.failure]
        if unanswered:
            return (
                f"repro failed: {len(unanswered)} of {len(self.comparisons)} runs got no answer "
                f"to compare: {unanswered[0]}"
            )
        return (
            f"repro failed: output differs from the baseline in {', '.join(summary['differing'])}"
        )

    def to_json(self, run_id: str | None) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "run_id": run_id,
            **self.summary(),
            **({"cause": self.cause} if self.cause else {}),
            "comparisons": [c.to_json() for c in self.comparisons],
        }


def check_reason(comparison: Comparison) -> str:
    """A comparison's JUnit failure text: its verdict, the fields and the likely causes."""
    return f"{comparison.verdict}: {', '.join(comparison.differing)}; {' '.join(comparison.causes)}"


def against_baseline(
    ctx: StageContext,
    normaliser: Normaliser,
    *,
    runs: int = 1,
    stream: bool = False,
    say: Callable[[str], None] = lambda line: None,
) -> ReproResult:
    """Run the fixed prompt ``runs`` times; compare each with the baseline. ``say`` is told
    once, before the first wait for an answer (``waiting_line``)."""
    baseline = read_baseline(baseline_path(ctx.config))
    say(waiting_line(ctx, ctx.run.stage, runs))
    comparisons: list[Comparison] = []
    causes: list[str] = []
    cfg = ctx.config
    for n in range(1, runs + 1):
        record = fixed_prompt_call(ctx, stream=stream)
        ctx.run.append("records.jsonl", record.to_json())
        comparisons.append(
            compare(baseline, record.to_json(), normaliser, labels=("baseline", f"run {n}"))
        )
        if record.error is not None and record.error.kind != "incomplete":
            known = known_cause(
                record.error,
                ServerIdentity(),
                cfg.target.model,
                streamed=stream,
                timeout_s=cfg.target.timeout_s,
            )
            causes += [known] if known else []
    return ReproResult(tuple(comparisons), cause=causes[0] if causes else "")


def load_records(path: Path) -> list[dict[str, Any]]:
    """Every record of a JSONL file; a line that is not a JSON object is an input error."""
    return [obj for _, obj in load_jsonl_objects(path, "record file")]


def between_files(left: Path, right: Path, normaliser: Normaliser) -> ReproResult:
    """Offline: compare two record files line by line, no server involved.

    A one-record file against a longer one (``repro baselines/single.jsonl runs/<id>/records.jsonl``)
    compares that record — the baseline — with every record of the run.
    """
    a, b = load_records(left), load_records(right)
    if len(a) == 1 and len(b) > 1:
        a = a * len(b)
    comparisons = [
        compare(x, y, normaliser, labels=(f"{left}:{i}", f"{right}:{i}"))
        for i, (x, y) in enumerate(zip(a, b, strict=False), 1)
    ]
    if len(a) != len(b):
        comparisons.append(
            Comparison("differs", ("record count",), (f"{len(a)} records vs {len(b)}",), ())
        )
    return ReproResult(tuple(comparisons))


def run_repro(
    ctx: StageContext,
    normaliser: Normaliser,
    *,
    runs: int,
    stream: bool,
    say: Callable[[str], None] = lambda line: None,
) -> ReproResult:
    """Stage B live: ``runs`` fresh calls against the baseline; the verdict goes to the ledger,
    then (after a pass) what to run next."""
    result = against_baseline(ctx, normaliser, runs=runs, stream=stream, say=say)
    ctx.record_result(result.passed, PlainSummary({**result.summary(), "jq": normaliser.program}))
    ctx.run.close()
    if not result.passed:
        return result
    return replace(result, next_command=next_step(ctx.config, ctx.ledger, ctx.target))
