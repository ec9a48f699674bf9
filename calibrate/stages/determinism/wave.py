"""Sending the determinism copies (SPEC §13): K copies of the fixed prompt, B at a time.

Sent after a ladder tier's measured rounds or a sweep level's measured window, never inside
one: they count in no wall time, in-flight count or per-item time. Each copy is recorded as a
canary (records.jsonl ``"canary": true``), so no figure counts it. What the copies' answers say
is ``stages.determinism``'s. How many of them the server ran at once is its own word: the cap it
reports or was started with, else what its running gauge showed while the copies ran (vLLM
publishes no cap, but ``vllm:num_requests_running`` says how many it ran).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from calibrate.config import LadderMode
from calibrate.gpu.vram import VramMonitor
from calibrate.gpu.vram.peaks import WindowPeak
from calibrate.load.items import ItemResult
from calibrate.load.request import build_requests
from calibrate.load.sender import Sender
from calibrate.stages.context import StageContext
from calibrate.stages.determinism import (
    DeterminismCheck,
    check,
    copies_per_wave,
)
from calibrate.stages.measure.incidents import IncidentRecorder
from calibrate.stages.measure.stop_rules import ServerCap

# (item, in flight) → its records.jsonl line
RecordFn = Callable[[ItemResult, int], dict[str, Any]]


@dataclass(frozen=True)
class CopiesWave:
    """How the copies go out: the mode and streaming of the load they sit between."""

    copies: int
    mode: LadderMode = "wave"
    stream: bool = False
    stream_options: bool = True


def send_copies(
    ctx: StageContext,
    sender: Sender,
    incidents: IncidentRecorder | None,
    how: CopiesWave,
    batch: int,
    record: RecordFn,
    cap: ServerCap | None = None,
    monitor: VramMonitor | None = None,
) -> DeterminismCheck:
    """``how.copies`` copies (rounded up to full waves) of the fixed prompt, ``batch`` at a
    time; their answers compared with each other. ``cap``: the server's own cap, where it was
    read — below ``batch``, the copies queued and no more than it shared a batch; where none
    was, ``monitor``'s samples of the server's running gauge while each wave ran say it."""
    texts: list[str | None] = []
    index = 1
    watched = monitor if cap is None else None
    peaks: list[WindowPeak] = []
    for size in copies_per_wave(how.copies, batch):
        idle = watched.open_window() if watched is not None else None
        requests = build_requests(
            ctx.client,
            ctx.config.target.model,
            ctx.params,
            [[ctx.config.prompt.text] * size],
            how.mode,
            stream=how.stream,
            stream_options=how.stream_options,
            first_index=index,
            role="canary",
        )
        answered, _ = sender.send(requests, len(requests), ctx.params.max_tokens)
        if watched is not None:
            peaks.append(watched.close_window(idle))
        answered = incidents.classify(answered) if incidents else answered
        in_flight = len(requests)
        for item in answered:
            ctx.run.append("records.jsonl", {**record(item, in_flight), "determinism": True})
        if incidents:
            incidents.record(
                answered,
                batch_size=batch,
                concurrency=in_flight,
                round_no=0,
                label=f"copies-{batch}",
            )
        texts += [i.text if i.ok and i.text is not None else None for i in answered]
        index += size
    account = (cap.slots, cap.source) if cap is not None else ran_during(peaks, batch)
    return check(texts, batch, account)


def ran_during(peaks: Sequence[WindowPeak], batch: int) -> tuple[int, str] | None:
    """How many copies the server ran at once, as its running gauge showed it while the waves
    of ``batch`` ran, and where that was read; None where it cannot say. A count of ``batch`` or
    more: they ran together. Fewer while others waited: it ran that many, the rest queued.
    Fewer with none seen waiting: unknown — the samples may have fallen between the answers."""
    seen = [p.running for p in peaks if p.running is not None]
    if not seen:
        return None
    metric, most = seen[-1].metric, max(int(r.most) for r in seen)
    if most >= batch:
        return most, f"{metric} showed {most} running while the copies ran"
    waiting = [r.while_waiting for r in seen if r.while_waiting is not None]
    if waiting:
        ran = int(max(waiting))
        return ran, f"{metric} peaked at {ran} while other copies waited"
    return None
