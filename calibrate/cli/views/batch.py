"""How a batch shows itself: a live progress bar on a terminal, plain lines elsewhere; the plan,
the endpoint check and the summary; its JUnit report."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from calibrate.cli.export import say_export
from calibrate.cli.flags.resolve import junit_suite
from calibrate.cli.output import Output
from calibrate.cli.views.batch_progress import ProgressView
from calibrate.engines.redaction import shown_command
from calibrate.io.jobs.openai_batch import FORMAT_NAMES
from calibrate.io.junit import JUnitCase
from calibrate.io.store import RunDir
from calibrate.stages.batch.endpoints import EndpointCheck
from calibrate.stages.batch.plan import BatchPlan, BatchSpec
from calibrate.stages.batch.result import BatchOutcome, BatchResult, pace_text
from calibrate.stages.batch.summary import BatchVerdict
from calibrate.stages.export import ExportResult
from calibrate.stages.measure.format_check import ShapeCheck
from calibrate.state.drift import records_of


class BatchView:
    """The ``BatchEnv`` of ``calibrate batch``: what the batch says, shown on ``out``."""

    def __init__(self, out: Output, progress_s: float, grace_s: float, junit: Path | None) -> None:
        self.out = out
        self.progress_s = progress_s
        self.grace_s = grace_s
        self.junit = junit

    def warn(self, text: str) -> None:
        self.out.warn(text)

    def on_plan(self, plan: BatchPlan, source: str) -> None:
        """What the batch will do, before anything is sent; what the resume scan found."""
        spec, scan = plan.spec, plan.scan
        what = f"sample of {plan.to_run}" if spec.sample else f"{plan.to_run} to run"
        shard = f" (shard {spec.shard})" if spec.shard else ""
        if spec.format != "tasks":  # the usual {id, text} tasks go unsaid (--json says both)
            self.out.say(f"input format (detected): {FORMAT_NAMES[spec.format]}")
        self.out.say(
            f"batch{shard}: {plan.total} total, {plan.skipped} already done, {what} "
            f"(concurrency {spec.concurrency} from {source}, retries {spec.retry.retries})"
        )
        if scan is not None and scan.retry:
            self.out.say(f"retrying {scan.retry} item(s) that failed in an earlier run")
        if scan is not None and scan.torn_tail:
            self.out.warn(
                f"the last line of {spec.out_path} was torn (a crash mid-write); it was cut "
                "off and its item runs again"
            )
        if scan is not None and scan.unreadable:
            self.out.warn(f"{scan.unreadable} unreadable line(s) in {spec.out_path} skipped")
        if plan.foreign:
            self.out.warn(f"{spec.out_path} holds {plan.foreign} (kept, --allow-foreign)")
        for note in plan.notes:  # what produced the results kept (io/journal/made.py)
            self.out.warn(note)

    def on_check(self, check: EndpointCheck) -> None:
        """What the fixed prompt said on each endpoint before the run."""
        if not check.baseline:
            self.out.warn(
                "no baseline (baselines/single.jsonl): the endpoints were not compared with it; "
                "run calibrate single first to check they serve the same weights"
            )
        for endpoint, why in check.benched:
            self.out.warn(
                f"{endpoint.label}: benched, it did not answer the fixed prompt ({why}); "
                "the other endpoints take its share"
            )
        if check.benched and check.usable:  # the plan line counted the benched ones' slots
            slots = sum(e.concurrency for e in check.usable)
            unused = sum(e.concurrency for e, _ in check.benched)
            self.out.say(
                f"concurrency {slots} on the endpoint(s) that answered ({unused} benched "
                "slot(s) unused)"
            )
        for endpoint, comparison in check.differing:
            self.out.fail(
                f"{endpoint.label}: differs from the baseline in {', '.join(comparison.differing)}"
            )
            for line in comparison.diff[:40]:
                self.out.say(f"  {line}")
        if check.baseline:
            for endpoint in check.usable:
                self.out.ok(f"{endpoint.label}: fixed prompt matches the baseline")

    def on_export(self, final: ExportResult) -> None:
        say_export(self.out, final)

    def progress(self, to_run: int, endpoints: int) -> ProgressView:
        return ProgressView(self.out, to_run, self.progress_s, self.grace_s, endpoints)

    def write_junit(
        self,
        run: RunDir,
        target: str,
        result: BatchResult,
        checks: Sequence[ShapeCheck],
        verdict: BatchVerdict,
    ) -> None:
        """--junit: one case for the items (the run's own verdict: its exit code's), one per
        failure kind, one per sample check, and one per drift line the summary says (passing
        for "none", else skipped with the line: a healthy run that drifted stays green)."""
        if self.junit is None:
            return
        suite = junit_suite("batch", run, target)
        suite.check(
            "all items ok", verdict.passed, verdict.why, kind=verdict.kind, time_s=result.seconds
        )
        for kind, count in sorted(result.failed_by_kind.items()):
            ids = [repr(f["id"]) for f in result.failures if f["kind"] == kind]
            message = next((f["message"] for f in result.failures if f["kind"] == kind), "")
            suite.check(
                f"items failed: {kind}",
                False,
                f"{count} item(s) failed with {kind}: {message} (e.g. {', '.join(ids)})",
                kind=kind,
            )
        for check in checks:
            suite.check(f"sample: {check.name}", check.passed, check.detail, kind="format")
        for record in verdict.drift:  # the summary's drift lines: a warning, never a failure
            named = f": {record.endpoint}" if len(verdict.drift) > 1 and record.endpoint else ""
            none = record.compared and not record.drifted and not record.undecided
            suite.add(
                JUnitCase(
                    f"drift from the calibration{named}",
                    f"calibrate.{suite.name}",
                    skipped=None if none else record.line(),
                )
            )
        suite.write(self.junit)


def show(out: Output, outcome: BatchOutcome) -> int:
    """The summary and the --json payload; raise the outcome's error, else its exit code."""
    render_summary(out, outcome.result, outcome.spec, outcome.checks, outcome.resume)
    spec, report = outcome.spec, outcome.report or {}
    for record in records_of(report.get("drift")):  # each endpoint against its calibration
        if not record.said:  # nothing to compare with: why is in --json, the run and status
            continue
        named = f"{record.endpoint}: " if len(report["drift"]) > 1 and record.endpoint else ""
        (out.warn if record.drifted else out.say)(named + record.line())
    if spec.format == "openai_batch" and not spec.sample and "final" not in report:
        words = ["export", "--input", str(spec.input_path), "--out", str(outcome.result.out_path)]
        again = shown_command(["calibrate", *words, "--to", "results.jsonl"])
        out.say("the Batch API output lines (one per custom_id, in input order) come from:")
        out.say(f"  {again}")
    if outcome.report is not None:
        out.result(outcome.report)
    if outcome.error is not None:
        raise outcome.error
    return outcome.exit_code


def render_summary(
    out: Output, r: BatchResult, spec: BatchSpec, checks: Sequence[ShapeCheck], resume: str
) -> None:
    """The end of a batch: counts, rate, failures, format notes and what to do next."""
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(r.failed_by_kind.items()))
    failed = f"{r.failed} failed ({kinds})" if r.failed else "0 failed"
    retried = f"; {r.retried_items} needed retries" if r.retried_items else ""
    pace = f"{r.pace_text()}, {r.tokens_text()}{retried}"
    all_ok = not (spec.sample or r.interrupted or r.unfinished or r.failed or r.remaining)
    # nothing to run: the plan said so, 0.0 items/s says no more; all ok: the verdict says it
    if (r.to_run or r.interrupted) and not all_ok:
        out.say(
            f"batch: {r.ok} ok, {failed}, {r.skipped} skipped (already done) in {r.seconds:.1f} s "
            f"— {pace}"
        )
    for failure in r.failures[:3]:
        out.say(f"  failed {failure['id']!r}: {failure['kind']}: {failure['message']}")
    _say_endpoints(out, r)
    if spec.sample:
        for check in checks:
            mark = "ok  " if check.passed else "FAIL"
            (out.ok if check.passed else out.fail)(f"  {mark} {check.name}: {check.detail}")
        out.say(f"sample outputs: {r.out_path}")
        read = r.ok + r.failed
        if r.interrupted or r.unfinished or r.stopped_by is not None or read < r.to_run:
            why = "interrupted" if r.interrupted else r.stop_detail or "stopped before its end"
            out.fail(
                f"sample incomplete: {read} of {r.to_run} outputs ({why}); the shape of the rest "
                f"is unknown: run the sample again ({resume})"
            )
        elif all(c.passed for c in checks) and not r.failed:
            out.ok("sample passed: every output has the same shape; run the batch with --out")
        else:
            out.fail("sample failed: fix the prompt (--prompt) before running the whole batch")
        return
    if r.preamble[0]:
        out.warn(
            f"{r.preamble[0]} output(s) open with a preamble ({', '.join(r.preamble[1][:3])})"
            ": tell the model to answer directly, or try --sample first"
        )
    if r.too_long[0]:
        out.warn(
            f"{r.too_long[0]} output(s) longer than --max-chars {spec.max_chars} "
            f"({', '.join(r.too_long[1][:3])})"
        )
    if r.interrupted:
        done = r.skipped + r.ok
        abandoned = f" ({r.abandoned} abandoned in flight)" if r.abandoned else ""
        out.fail(f"interrupted: {done} of {r.total} done, {r.remaining} remaining{abandoned}")
        out.say(f"resume with: {resume}")
        return
    if r.unfinished and r.stopped_by != "unknown_model":  # its error says why and what to do
        why = (
            r.stop_detail
            or "a worker stopped before its items were done (a bug: rerun with --debug and report it)"
        )
        out.fail(f"{r.unfinished} of {r.to_run} item(s) were neither done nor failed: {why}")
        out.say(f"what finished is kept in {r.out_path}; rerun to do the rest: {resume}")
    if r.failed:
        out.fail(f"{r.failed} item(s) failed; they are in {r.out_path} with ok:false")
        out.say(f"rerun to retry only those: {resume}")
    elif r.unfinished:
        return
    elif r.remaining:
        why = " (--limit)" if spec.limit else ""
        out.ok(f"{r.ok} item(s) done; {r.remaining} remaining{why}")
        out.say(f"rerun to continue: {resume}")
    elif not r.total:  # a shard that holds none (an empty input is exit 2 before this)
        where = f"shard {spec.shard} of {spec.input_path}" if spec.shard else str(spec.input_path)
        out.ok(f"nothing to run: {where} holds no item; {r.out_path} has no results")
    else:  # the plan line said how many were already done
        ran = f" ({r.ok} run in {r.seconds:.1f} s — {pace})" if r.to_run else ""
        out.ok(f"all {r.total} items ok: {r.out_path}{ran}")


def _say_endpoints(out: Output, r: BatchResult) -> None:
    """Per endpoint (when several, or after an outage): done, failed, rate, outages."""
    outages = sum(e.outages for e in r.endpoints)
    if len(r.endpoints) < 2 and not outages:
        return
    for e in r.endpoints:
        down = f"; {e.outages} outage(s), {e.down_s:.0f} s down" if e.outages else ""
        up = " while up" if e.down_s >= 0.5 else ""  # its pace over the seconds it served
        restarts = f", restarted {e.restarts}×" if e.restarts else ""
        state = "" if e.state == "up" else f" [{e.state}]"
        out.say(
            f"  {e.url}{state}: {e.done} done, {e.failed} failed, "
            f"{pace_text(e.done, e.failed, e.serving_s)}{up} "
            f"(c={e.concurrency}){down}{restarts}"
        )
