"""Was the server's KV cache full (or may it have been) when its requests waited? A full cache,
not a cap, then explains the queue."""

from __future__ import annotations

KV_FULL = 0.9  # KV-cache usage from which requests waiting are the cache's, not the cap's
ADMISSION_FULL = 0.95  # one more request would bring the cache this close to full: no room


def kv_is_full(
    kv_usage: float | None,
    preemptions: int | None,
    kv_full: float = KV_FULL,
    *,
    running: int | None = None,
    margin: float = 0.0,
) -> bool:
    """The KV cache was full, or may have been: its usage reached ``kv_full``, the engine
    preempted, or it held no room for one more request the size of the ``running`` ones
    (``no_room_for_one_more``) — each read at the usage's peak plus ``margin``, how much higher
    it may have peaked between samples (``Stats.kv_peak_margin``): a cap is never claimed on a
    reading the samples could have missed the full cache by (seen beside CPU burners: the mock's
    83 % read 73 %, and a KV queue was called "its cap is 4")."""
    if preemptions:
        return True
    if kv_usage is None:
        return False
    usage = kv_usage + max(0.0, margin)
    return usage >= kv_full or no_room_for_one_more(usage, running)


def no_room_for_one_more(kv_usage: float | None, running: int | None) -> bool:
    """A cache is full for admission before its usage reads full: the engine admits a request
    only when the blocks of its prompt are free. Seen on real vLLM (``--num-gpu-blocks-override
    6``, blocks of 128 tokens, 180-token prompts): two requests ran on 2 blocks each while the
    rest waited, ``vllm:kv_cache_usage_perc`` read 80 %, and the waiting was called "its cap is
    2" of a server capped at 8. ``k`` requests using ``u`` leave room for one more only when
    ``u × (k + 1) / k`` stays under ``ADMISSION_FULL``: the usage is sampled while the running
    answers still grow (and the cache is handed out in blocks), so a cache that one more request
    would fill to the brim held no room for it — and a cap is never claimed on that doubt (seen
    on the mock: 4 running read 80 % of a cache of 4.8 requests, and one run in a few said "its
    cap is 4" of a server with 8 slots)."""
    if kv_usage is None or not running or running < 1:
        return False
    return kv_usage * (running + 1) / running >= ADMISSION_FULL
