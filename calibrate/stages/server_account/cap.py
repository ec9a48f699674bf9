"""The server's cap as its own account shows it (SPEC §6.1): the running count at its peak while
others waited, the ceiling a KV doubt leaves, a count too sparse to show B, and the cap a ladder
met or a sweep may not exceed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from calibrate.gpu.vram.peaks import SAMPLES_PER_ANSWER
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.measure.tiers import Stats, Unseen
from calibrate.stages.server_account.kv import KV_FULL, kv_is_full


def observed_cap(
    stats: Stats, kv_full: float = KV_FULL, *, ran_elsewhere: int | None = None
) -> ServerCap | None:
    """The server's cap as its own running gauge showed it, when it is below the tier's batch:
    requests waited while the running count stood at its peak k < B, the KV cache was not full,
    and not every waiting request was deferred for another reason. None otherwise (no gauge, no
    queue, a queue the KV cache or a deferral explains, or k ≥ B) — and when the same server ran
    more than k at once in another tier or level of the run (``ran_elsewhere``): its cap is not
    k, the requests waited a moment on their way in (seen on real vLLM in prompt-list mode: one
    running while three of a list's eight prompts were still being admitted, "its cap is 1" of a
    server that had run 4 at once a tier before)."""
    k, queued = stats.server_running_max, stats.server_queue_max
    if k is None or not queued or k < 1 or k >= stats.batch_size:
        return None
    if ran_elsewhere is not None and ran_elsewhere > k:
        return None
    if stats.running_while_queued != k:  # waiting seen only while it still ramped up
        return None
    margin = stats.kv_peak_margin or 0.0
    if kv_is_full(stats.peak_kv_usage, stats.preemptions, kv_full, running=k, margin=margin):
        return None
    if stats.deferred_max is not None and stats.deferred_max >= queued:
        return None
    metric = stats.running_metric or "its running gauge"
    waited = "1 request" if queued == 1 else f"up to {queued} requests"
    return ServerCap(k, f"{metric} peaked at {k} while {waited} waited")


def running_unseen(
    stats: Stats,
    sample_interval_s: float,
    known: ServerCap | None,
    shortest_s: float | None = None,
) -> Unseen | None:
    """Why the server's running gauge cannot show that a tier ran its B at once (None: it can):
    its answers last less than ``SAMPLES_PER_ANSWER`` samples of ``/metrics`` and the count
    it showed stayed below B. A queue at the cap then falls between samples (seen on real vLLM
    ``--max-num-seqs 4``: 10–20 ms answers, no request seen waiting, batch 8 kept and chosen in
    prompt-list mode), so the count is unknown, not absent: no cap is claimed from it, and the
    tier is not the setting (``ladder.setting``) — never a setting above what was seen running.
    The samples are as far apart as they really came (``stats.metrics_gap_s``), never closer than
    asked: on a busy machine a 50 ms interval became 150 ms, and 220 ms answers at batch 8 of a
    server capped at 4 were called seen whole (seen on vLLM's CPU build). A server that reports
    its cap (``known``) needs no gauge; one request runs on any server.

    Read often enough, a count that stayed below B says more: where even the tier's shortest
    answer (``shortest_s``) lasted ``SAMPLES_PER_ANSWER`` samples, every moment B ran at once
    was read, so a count that never showed B, with nothing waiting, means the server never ran B
    at once — its requests reached it apart (seen beside CPU burners: a starved client's 8
    requests never more than 4 at a time at a 4-slot mock, none waiting, batch 8 ``pass``). A
    queue seen instead is the server's own account (``observed_cap``, the KV cache), and where
    only the KV usage's doubt kept it from naming a cap, B did not run either
    (``cap_or_cache``). A request seen waiting only while fewer than the peak ran (on its way
    to a free slot: no cap, ``observed_cap``) is no account at all: read through every answer,
    that count too says B never ran (seen beside CPU burners: batch 8 ``pass`` at 4 running)."""
    seen, p50, batch = stats.server_running_max, stats.latency_p50_s, stats.batch_size
    if known is not None or seen is None or p50 is None or batch < 2 or seen >= batch:
        return None
    gap_s = max(sample_interval_s, stats.metrics_gap_s or 0.0)
    apart = f"{gap_s * 1000:.0f} ms apart"
    if gap_s > sample_interval_s * 1.5:  # the machine or the server slowed the samples
        apart += f" (asked: {sample_interval_s * 1000:.0f} ms)"
    dense = round(SAMPLES_PER_ANSWER * gap_s, 9)
    seating = stats.running_while_queued  # the most it ran while one waited
    in_passing = bool(stats.server_queue_max) and seating is not None and seating < seen
    if p50 >= dense and stats.server_queue_max:
        doubt = cap_or_cache(stats)
        if doubt or not in_passing:
            return Unseen(doubt) if doubt else None
    if p50 >= dense:
        if shortest_s is None or shortest_s < dense:
            return None
        why = (
            "its requests reached it apart, not together (a busy client machine, a proxy that "
            "sends one at a time): run the ladder again"
            if stats.server_queue_max == 0
            else f"a request waited only while it ran {seating} (seating the others): a cap of "
            f"{seen}, or requests that reached it apart"
            if in_passing
            else f"it exports no queue gauge: a cap of {seen}, or requests that reached it apart"
        )
        return Unseen(
            f"its running count, read at least {SAMPLES_PER_ANSWER} times in even its shortest "
            f"answer ({shortest_s * 1000:.0f} ms; samples {apart}), showed at most {seen} of "
            f"{batch}{' and none waited' if stats.server_queue_max == 0 else ''}: the server "
            f"never ran {batch} at once ({why})",
            read_through=True,
        )
    short = (
        f"its answers (p50 {p50 * 1000:.0f} ms) last less than {SAMPLES_PER_ANSWER} /metrics "
        f"samples {apart}"
    )
    if stats.server_queue_max:  # caught waiting: it ran fewer than B, whatever the samples missed
        return Unseen(
            f"{short}, and the server's running count showed at most {seen} of {batch} while "
            f"up to {stats.server_queue_max} waited: it did not run {batch} at once"
        )
    return Unseen(
        f"{short} and the server's running count showed at most {seen} of {batch}: whether it "
        f"ran {batch} at once is unknown (sample more often with [ladder] sample_interval_s, or "
        "send longer answers with --output-tokens)"
    )


def doubtful_cap(stats: Stats, *, ran_elsewhere: int | None = None) -> ServerCap | None:
    """The cap as the running count showed it, where only the KV usage's doubt kept
    ``observed_cap`` from claiming it (None otherwise): k ran while others waited, and k may
    have been its cap or all its cache held. Not a cap to stop a tier on or to pin, but a
    ceiling all the same — the server did not run more than k at once there."""
    if not stats.kv_peak_margin or observed_cap(stats, ran_elsewhere=ran_elsewhere) is not None:
        return None
    read = observed_cap(replace(stats, kv_peak_margin=0.0), ran_elsewhere=ran_elsewhere)
    if read is None:  # no cap even as read: the cache was full, a deferral, a ramp
        return None
    usage = f"{stats.peak_kv_usage:.0%}" if stats.peak_kv_usage is not None else "unread"
    return ServerCap(
        read.slots,
        f"{read.source}, and its KV cache read {usage} (it may have peaked "
        f"{stats.kv_peak_margin * 100:.0f} points higher between samples): whether "
        f"{read.slots} was its cap or all its cache held is unknown",
    )


def cap_or_cache(stats: Stats) -> str:
    """Why a tier whose requests waited while its running count held below B did not run B,
    where only the KV usage's doubt kept its cap from being claimed (``doubtful_cap``; "":
    the cap was claimed, or the cache was surely full, or it ramped). Such a tier is not the
    setting: a full cache (which a setting may run into) cannot be told from a cap (which it
    may not exceed)."""
    doubt = doubtful_cap(stats)
    if doubt is None:
        return ""
    return f"{doubt.source} — it did not run {stats.batch_size} at once"


def unaccounted(cap: ServerCap | None, running_seen: bool, engine: str = "") -> str | None:
    """Said once: the server publishes neither its cap nor a running count, so a tier above its
    cap cannot be told from a slow one (None when it publishes either)."""
    if cap is not None or running_seen:
        return None
    who = f"this {engine} server" if engine else "the server"
    return (
        f"{who} publishes neither its cap nor a running count (no /props, no server info, no "
        "running gauge on /metrics): a tier above its cap cannot be told from one the server ran "
        "whole; calibrate relies on the time per item and the queue gauge alone"
    )


def server_limit(known: ServerCap | None, batch: int, levels: Sequence[Stats]) -> ServerCap | None:
    """The cap a sweep's recommendation may not exceed: the server's reported cap when it is
    below the batch size the sweep ran at, else the smallest cap its running gauge showed below
    it at any level (``observed_cap``), or showed where its KV usage leaves cap and cache
    apart unknown (``doubtful_cap``: a ceiling either way); None when the server ran the whole
    batch. A managed server capped at B whose running count stays at B while more wait is at its
    cap by design (SPEC §5.0: C may exceed B), not below it."""
    if known is not None and known.slots < batch:
        return known
    most = most_running(levels)
    seen = [
        c
        for stats in levels
        if (c := observed_cap(stats, ran_elsewhere=most) or doubtful_cap(stats, ran_elsewhere=most))
        is not None
    ]
    return min(seen, key=lambda cap: cap.slots, default=None)


def most_running(runs: Sequence[Stats]) -> int | None:
    """The most requests the server's running gauge showed at once over ``runs`` (None: no
    gauge): a cap below it was never the server's."""
    seen = [s.server_running_max for s in runs if s.server_running_max is not None]
    return max(seen, default=None)


def stopping_cap(known: ServerCap | None, tiers: Sequence[Stats]) -> Any:
    """The cap a ladder met, as its ledger line holds it (``pin`` reads it): the reported one
    when a tier was above it, else the smallest its running gauge showed; None when neither."""
    if known is not None and any(t.batch_size > known.slots for t in tiers):
        return known.to_json()
    most = most_running(tiers)
    seen = [c for stats in tiers if (c := observed_cap(stats, ran_elsewhere=most)) is not None]
    return min(seen, key=lambda cap: cap.slots).to_json() if seen else None


def limit_json(known: ServerCap | None, batch: int, levels: Sequence[Stats]) -> Any:
    """``server_limit`` as the ledger holds it: ``{"slots": 4, "source": …}`` or None."""
    limit = server_limit(known, batch, levels)
    return limit.to_json() if limit else None


def cap_notes(
    known: ServerCap | None, batch: int, levels: Sequence[tuple[int, bool, Stats]]
) -> list[str]:
    """A sweep's word on the server's cap: levels above a cap it runs below the batch size are
    not recommended (its own account, SPEC §6.1); else levels above its reported cap queue; a
    server that publishes neither a cap nor a running count is said to."""
    running = any(stats.server_running_max is not None for _, _, stats in levels)
    told = unaccounted(known, running) if levels else None
    if told is not None:
        return [told]
    limit = server_limit(known, batch, [stats for _, _, stats in levels])
    if limit is not None:
        above = ", ".join(str(c) for c, _, _ in levels if c > limit.slots)
        return (
            [
                f"concurrency {above}: the server runs at most {limit.slots} at once "
                f"({limit.source}), below the batch size {batch} the sweep ran at: left out of "
                "the knee (the batch is above what this server runs: run calibrate ladder "
                "against it again)"
            ]
            if above
            else []
        )
    over = [c for c, capped, _ in levels if capped]
    if known is None or not over:
        return []
    return [
        f"concurrency {', '.join(map(str, over))} exceeds the server's own cap of "
        f"{known.slots} ({known.source}): the extra requests queue in the server"
    ]
