"""Why throughput stopped growing where the server itself queued requests, in its words: the KV
cache full, requests deferred, its cap, prompt-list counting."""

from __future__ import annotations

from calibrate.io.tier_table.row import TierRow
from calibrate.stages.server_account.kv import KV_FULL, kv_is_full


def queue_note(
    queued: int | None,
    concurrency: int,
    *,
    batch: int | None = None,
    prompt_list: bool = False,
    running: int | None = None,
    metric: str | None = None,
    kv_usage: float | None = None,
    preemptions: int | None = None,
    deferred: int | None = None,
    ran_elsewhere: int | None = None,
    kv_margin: float | None = None,
) -> str | None:
    """Why throughput stopped growing when the server itself queued requests (SPEC §8, §6.1),
    named by its cause: the KV cache full, requests deferred, the cap (the running count at its
    peak, or below what was in flight), prompt-list counting. None when nothing waited."""
    if not queued or queued < 1:
        return None
    requests = "request" if queued == 1 else "requests"
    ran = f" while it ran {running} at once ({metric})" if running is not None and metric else ""
    if prompt_list and batch:
        head = (
            f"the server queued up to {queued} of the {batch} prompts of a prompt-list request "
            f"at batch {batch}: it counts each prompt of a list as a request"
        )
    else:
        head = f"the server queued up to {queued} {requests} at concurrency {concurrency}"
    margin = kv_margin or 0.0
    sure = kv_is_full(kv_usage, preemptions, running=running)
    if (
        not sure
        and kv_usage is not None
        and kv_is_full(kv_usage, None, running=running, margin=margin)
    ):
        beside = f" beside the {running} running" if running else ""
        return (
            f"{head}{ran} with its KV cache perhaps full ({kv_usage:.0%} read, and it may have "
            f"peaked {margin * 100:.0f} points higher between samples: perhaps no room for one "
            f"more request{beside}): no cap is claimed from it"
        )
    if sure:
        full = f"{kv_usage:.0%}" if kv_usage is not None else f"{preemptions} preempted"
        if kv_usage is not None and kv_usage < KV_FULL and not preemptions:  # no room left
            full += f": no room for one more request beside the {running} running"
        return (
            f"{head}{ran} with its KV cache full ({full}): the KV cache is the limit, not its cap"
        )
    if deferred is not None and deferred >= queued:
        return (
            f"{head}, deferred (vLLM's reason: a LoRA budget, a KV transfer or a blocked "
            "request), not for capacity"
        )
    limit = batch if prompt_list and batch else concurrency
    if running is not None and ran_elsewhere is not None and ran_elsewhere > running:
        return (
            f"{head}{ran}, and {ran_elsewhere} at once elsewhere in this run: requests waiting a "
            "moment on their way in, not a cap"
        )
    if running is not None and metric and running < limit:
        what = f"the {limit} prompts" if prompt_list else f"{limit} in flight"
        return f"{head}{ran}: its cap is {running}, below {what}"
    if prompt_list:
        return f"{head}: it runs fewer than {limit} at once"
    return f"{head}: its cap is below {concurrency} in flight"


def row_queue_note(row: TierRow, ran_elsewhere: int | None = None) -> str | None:
    """``queue_note`` of one tier or level as its row holds it (a ladder's with its mode);
    ``ran_elsewhere``: the most the server ran at once over the run's rows."""
    server = row.server
    return queue_note(
        server.server_queue_max,
        row.concurrency or 0,
        batch=row.batch_size,
        prompt_list=row.ladder.mode == "prompt-list",
        running=server.running_while_queued,
        metric=server.running_metric,
        kv_usage=row.memory.peak_kv_usage,
        preemptions=server.preemptions,
        deferred=server.deferred_max,
        ran_elsewhere=ran_elsewhere,
        kv_margin=row.memory.kv_peak_margin,
    )
