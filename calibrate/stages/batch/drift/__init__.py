"""A batch watches its drift from the calibration (SPEC §13 "Drift in production").

``watch_batch`` finds, for each endpoint the batch uses, what its setting was calibrated at
for the concurrency it runs (``state.calibrated``; each endpoint is its own target, as its
setting is) and starts a ``DriftWatch`` over its finished items; an endpoint with nothing to
compare with gets a record saying why. Windows (windows.py), the rule and its fairness
(rule.py), the causes and the warning (causes.py), the server's own account (server.py) and
what a watch's windows come to (record.py) are each their own module; the record the summary,
the ledger and ``status`` hold is ``state.drift`` (what is remembered between commands:
``status`` reads it without loading the batch stage).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.http.client import OpenAIClient
from calibrate.stages.batch.drift.server import ServerWatch
from calibrate.stages.batch.drift.watch import DriftWatch
from calibrate.stages.batch.plan import BatchPlan
from calibrate.stages.context import StageContext
from calibrate.stages.measure.tier_run import noise_meter
from calibrate.state.calibrated import calibration_for
from calibrate.state.drift import DriftRecord, records_json
from calibrate.state.ledger import target_fingerprint
from calibrate.state.setting import Endpoint, resolve

__all__ = ["BatchDrift", "DriftRecord", "DriftWatch", "records_json", "watch_batch"]


class BatchDrift:
    """The drift of a batch's endpoints: a watch for each one calibrated, else why not."""

    def __init__(self, each: Sequence[DriftWatch | DriftRecord] | None) -> None:
        self._compared = each is not None  # None: a --sample, not held to the calibration
        self._each = list(each or ())
        self._watches = [w for w in self._each if isinstance(w, DriftWatch)]

    def seen(self, line: dict[str, Any], tokens: int | None, endpoint: str) -> None:
        """One counted line (the journal's thread): to every watch (each keeps its own)."""
        for watch in self._watches:
            watch.seen(line, tokens, endpoint)

    def outage(self, endpoint: str, event: str) -> None:
        """An outage event of ``endpoint`` (``sending.outage``'s ``down``, ``up``, ``gave_up``,
        ``restart``): the windows that hold it are left out."""
        for watch in self._watches:
            if event == "restart":
                watch.restarted(endpoint)
            elif event in ("down", "up", "gave_up"):
                watch.quiet(endpoint, event == "down")

    def stop(self) -> tuple[DriftRecord, ...] | None:
        """Every watch stopped; one record per endpoint, in their order (None: a --sample)."""
        if not self._compared:
            return None
        return tuple(w.stop() if isinstance(w, DriftWatch) else w for w in self._each)


def watch_batch(
    ctx: StageContext,
    used: Sequence[tuple[Endpoint, OpenAIClient]],
    plan: BatchPlan,
    out_path: Path,
    warn: Callable[[str], None],
    selfload: SelfLoadMonitor,
) -> BatchDrift:
    """The watches of the endpoints ``used`` (each with its client), started; none for a
    --sample (it tries the prompt: it is not held to the calibration)."""
    if plan.spec.sample:
        return BatchDrift(None)
    to_run = plan.to_run
    slots = sum(min(e.concurrency, max(to_run, 1)) for e, _ in used)
    each: list[DriftWatch | DriftRecord] = []
    for endpoint, client in used:
        cfg = ctx.config
        target = target_fingerprint(
            replace(cfg, target=replace(cfg.target, base_url=endpoint.base_url))
        )
        setting = resolve(ctx.ledger, target)
        if setting is None:
            each.append(DriftRecord(False, "nothing is calibrated for it", endpoint=endpoint.label))
            continue
        found = calibration_for(
            ctx.ledger,
            target,
            cfg.runs_dir,
            setting.batch_size,
            endpoint.concurrency,
            tuned=bool(setting.tuned),
        )
        if isinstance(found, str):
            each.append(DriftRecord(False, found, endpoint=endpoint.label))
            continue
        watch = DriftWatch(
            found,
            label=endpoint.label,
            concurrency=min(endpoint.concurrency, max(to_run, 1)),
            slots=slots,
            cap=setting.batch_size,
            to_run=to_run,
            replay=str(out_path),
            warn=_said(warn, endpoint.label if len(used) > 1 else ""),
            write=_written(ctx, endpoint.label),
            server=ServerWatch(_metrics(client)),
            noise=noise_meter(None, ctx, selfload),
            shortest_s=plan.spec.drift_window_s,
        )
        each.append(watch.start())
    return BatchDrift(each)


def _said(warn: Callable[[str], None], label: str) -> Callable[[str], None]:
    """The warning, naming its endpoint when the batch has several."""
    return (lambda text: warn(f"{label}: {text}")) if label else warn


def _written(ctx: StageContext, label: str) -> Callable[[dict[str, Any]], None]:
    """Each window appended to the run's drift.jsonl, with its endpoint."""
    return lambda row: ctx.run.append("drift.jsonl", {"endpoint": label, **row})


def _metrics(client: OpenAIClient) -> Callable[[], str]:
    return lambda: client.get_text("/metrics")
