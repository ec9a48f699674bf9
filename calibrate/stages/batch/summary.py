"""What a batch's summary says and whether it passed: the notes beside its counts
(``BatchNotes``), the summary for --json, summary.json and the ledger (``summary_json``), and
the one rule of its verdict (``verdict_of``) for its exit code, its ledger line and --junit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calibrate.stages.batch.endpoints import EndpointCheck
from calibrate.stages.batch.result import BatchResult
from calibrate.stages.export import ExportResult
from calibrate.stages.measure.format_check import ShapeCheck
from calibrate.state.drift import DriftRecord, records_json

MAX_EVENTS = 100  # outage events in the summary (all of them are in outages.jsonl)


@dataclass(frozen=True)
class BatchNotes:
    """What a batch's summary says beside its counts, found on the way: its shard, the worker
    processes (only when --workers was given), the endpoints' fixed-prompt check (several
    endpoints), what became of --final, and its drift from the calibration (not --sample)."""

    shard: str | None = None
    workers: int | None = None
    endpoint_check: EndpointCheck | None = None
    final: ExportResult | None = None
    final_error: str | None = None  # --final could not be written: why
    input_changed: str | None = None  # --input changed while the run read it: how
    drift: tuple[DriftRecord, ...] | None = None  # each endpoint against its calibration

    def to_json(self) -> dict[str, Any]:
        said = {  # each only when there is something to say (a plain run's summary is as it was)
            "workers": self.workers,
            "endpoint_check": self.endpoint_check.to_json() if self.endpoint_check else None,
            "input_changed": self.input_changed,
            "final_error": self.final_error,
            "final": self.final.to_json() if self.final else None,
            "drift": records_json(self.drift) if self.drift is not None else None,
        }
        return {"shard": self.shard, **{k: v for k, v in said.items() if v is not None}}


def summary_json(
    result: BatchResult,
    concurrency: int,
    concurrency_source: str,
    notes: BatchNotes,
    checks: Sequence[ShapeCheck] | None = None,
) -> dict[str, Any]:
    """The summary for ``--json``, summary.json and the ledger (``checks``: --sample's)."""
    sample = {"checks": [c.to_json() for c in checks]} if checks is not None else {}
    return {
        "out": str(result.out_path),
        "total": result.total,
        "skipped": result.skipped,
        "to_run": result.to_run,
        "done": result.ok,
        "failed": result.failed,
        "failed_by_kind": dict(sorted(result.failed_by_kind.items())),
        "remaining": result.remaining,
        "interrupted": result.interrupted,
        "abandoned": result.abandoned,
        "unfinished": result.unfinished,
        "stopped_by": result.stopped_by,
        "seconds": round(result.seconds, 3),
        "items_per_s": round(result.items_per_s, 3),
        "ok_per_s": round(result.ok_per_s, 3),
        "output_tokens": result.output_tokens,
        "output_tokens_per_s": _rounded(result.output_tokens_per_s),
        **({"answers_without_usage": result.untold} if result.untold else {}),
        "attempts": result.attempts,
        "retried_items": result.retried_items,
        "failures": list(result.failures),
        "preamble": {"count": result.preamble[0], "examples": list(result.preamble[1])},
        "too_long": {"count": result.too_long[0], "examples": list(result.too_long[1])},
        "concurrency": concurrency,
        "concurrency_source": concurrency_source,
        "selfload": result.selfload.to_json() if result.selfload else None,
        "endpoints": [e.to_json() for e in result.endpoints],
        "outages": [e.to_json() for e in result.outage_events[:MAX_EVENTS]],
        **notes.to_json(),
        **sample,
    }


@dataclass(frozen=True)
class BatchVerdict:
    """Whether a batch passed — one rule for its exit code, its ledger line and --junit — and,
    when not, why in words and the kind of its first reason (a JUnit failure's type); ``drift``:
    the endpoints' drift records its summary says (--junit says them too), none or not."""

    passed: bool
    why: str = ""
    kind: str = ""
    drift: tuple[DriftRecord, ...] = ()


def verdict_of(result: BatchResult, notes: BatchNotes, checks_passed: bool = True) -> BatchVerdict:
    """A pass needs an ok line for every item this run was to do, nothing that stopped it, an
    input that did not change under it, --final written and (--sample) every shape check."""
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(result.failed_by_kind.items()))
    reasons = (
        ("interrupted", result.interrupted, "interrupted before the end"),
        (
            ",".join(sorted(result.failed_by_kind)),
            result.failed > 0,
            f"{result.failed} of {result.finished} items failed ({kinds})",
        ),
        (
            result.stopped_by or "stopped",
            result.stopped_by is not None and not result.interrupted,  # said just above
            f"stopped: {result.stop_detail or result.stopped_by}",
        ),
        ("unfinished", result.unfinished > 0, "items left without a line"),
        ("input_changed", notes.input_changed is not None, notes.input_changed or ""),
        ("final", notes.final_error is not None, notes.final_error or ""),
        ("format", not checks_passed, "a sample output failed its shape check"),
    )
    said = [(kind, text) for kind, wrong, text in reasons if wrong]
    drift = tuple(r for r in notes.drift or () if r.said)  # a warning: it fails nothing
    if not said:
        return BatchVerdict(True, drift=drift)
    left = f"; {result.remaining} remaining" if result.remaining else ""
    return BatchVerdict(False, "; ".join(text for _, text in said) + left, said[0][0], drift)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
