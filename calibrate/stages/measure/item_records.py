"""A stage's items as it records them: the SPEC §4.1 record of one item, and whether nothing
answered at all (no server: exit 4, not a failing tier or level)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from calibrate.io.records import RequestRecord, utc_now_iso
from calibrate.load.items import ItemResult
from calibrate.stages.context import StageContext


def item_record(
    ctx: StageContext, item: ItemResult, batch: int, concurrency: int, round_no: int | None
) -> dict[str, Any]:
    """The SPEC §4.1 record of one item, with the sampling parameters its body carried."""
    sent = item.body.get("max_tokens")
    params = ctx.params
    if isinstance(sent, int) and not isinstance(sent, bool) and sent != params.max_tokens:
        params = replace(params, max_tokens=sent)  # a forced answer length (SPEC §5.11)
    return RequestRecord(
        run_id=ctx.run.run_id,
        ts=utc_now_iso(),
        stage=ctx.run.stage,
        target=ctx.target,
        prompt=item.prompt,
        params=params,
        text=item.text,
        finish_reason=item.finish_reason,
        usage=item.usage,
        elapsed_s=item.elapsed_s,
        ttft_s=item.ttft_s,
        served_model=item.served_model,
        system_fingerprint=item.system_fingerprint,
        batch_size=batch,
        concurrency=concurrency,
        round=round_no,
        ok=item.ok,
        error=item.error,
        input_tokens_target=item.input_tokens_target,
        canary=item.role == "canary",
        times=item.times,
    ).to_json()


def all_refused(items: Sequence[ItemResult]) -> bool:
    """Nothing answered at all: no server, which is exit 4 rather than a failing tier."""
    return bool(items) and all(i.error is not None and i.error.kind == "connect" for i in items)
