"""A stage's items as it records them: the SPEC §4.1 record of one item, the line of one round
(``rounds.jsonl``), and whether nothing answered at all (no server: exit 4, not a failing tier
or level)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from calibrate.errors import ErrorInfo
from calibrate.http.models import SamplingParams
from calibrate.http.request_times import RequestTimes
from calibrate.io.records import RequestRecord, utc_now_iso
from calibrate.load.items import ItemResult
from calibrate.stages.context import StageContext
from calibrate.stages.measure.tiers import Stats


def unanswered_record(
    ctx: StageContext,
    prompt: str,
    params: SamplingParams,
    *,
    elapsed_s: float,
    error: ErrorInfo | None,
    times: RequestTimes | None,
) -> RequestRecord:
    """The SPEC §4.1 record of one of this stage's requests with no answer in it: ``error``
    says why (or none yet: the caller fills the answer in). Every stage's record starts here."""
    return RequestRecord(
        run_id=ctx.run.run_id,
        ts=utc_now_iso(),
        stage=ctx.run.stage,
        target=ctx.target,
        prompt=prompt,
        params=params,
        text=None,
        finish_reason=None,
        usage=None,
        elapsed_s=elapsed_s,
        ttft_s=None,
        served_model=None,
        system_fingerprint=None,
        ok=False,
        error=error,
        times=times,
    )


def item_record(
    ctx: StageContext, item: ItemResult, batch: int, concurrency: int, round_no: int | None
) -> dict[str, Any]:
    """The SPEC §4.1 record of one item, with the sampling parameters its body carried."""
    sent = item.body.get("max_tokens")
    params = ctx.params
    if isinstance(sent, int) and not isinstance(sent, bool) and sent != params.max_tokens:
        params = replace(params, max_tokens=sent)  # a forced answer length (SPEC §5.11)
    record = unanswered_record(
        ctx, item.prompt, params, elapsed_s=item.elapsed_s, error=item.error, times=item.times
    )
    return replace(
        record,
        text=item.text,
        finish_reason=item.finish_reason,
        usage=item.usage,
        ttft_s=item.ttft_s,
        served_model=item.served_model,
        system_fingerprint=item.system_fingerprint,
        batch_size=batch,
        concurrency=concurrency,
        round=round_no,
        ok=item.ok,
        input_tokens_target=item.input_tokens_target,
        canary=item.role == "canary",
    ).to_json()


def all_refused(items: Sequence[ItemResult]) -> bool:
    """Nothing answered at all: no server, which is exit 4 rather than a failing tier."""
    return bool(items) and all(i.error is not None and i.error.kind == "connect" for i in items)


def record_round(ctx: StageContext, stats: Stats, vram_source: str, **measured: Any) -> None:
    """One line of ``rounds.jsonl``: a ladder round's or a sweep run's stats, what else its mode
    measured (the steady window, the achieved rate) and where its memory figures came from."""
    ctx.run.append("rounds.jsonl", {**stats.to_json(), **measured, "vram_source": vram_source})
