"""Sending the determinism copies (SPEC §13): K copies of the fixed prompt, B at a time.

Sent after a ladder tier's measured rounds or a sweep level's measured window, never inside
one: they count in no wall time, in-flight count or per-item time. Each copy is recorded as a
canary (records.jsonl ``"canary": true``), so no figure counts it. What the copies' answers say
is ``stages.determinism``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from calibrate.config import LadderMode
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
) -> DeterminismCheck:
    """``how.copies`` copies (rounded up to full waves) of the fixed prompt, ``batch`` at a
    time; their answers compared with each other. ``cap``: the server's own cap, where it was
    read — below ``batch``, the copies queued and no more than it shared a batch."""
    texts: list[str | None] = []
    index = 1
    for size in copies_per_wave(how.copies, batch):
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
    return check(texts, batch, (cap.slots, cap.source) if cap is not None else None)
