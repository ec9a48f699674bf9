"""What a sweep's load modes (rates, --auto) ask of the sweep that runs them: one seam,
so a mode is a strategy over the sweep, never a module that imports it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from calibrate.gpu.vram import VramMonitor, WindowPeak
from calibrate.load.items import ItemResult
from calibrate.load.request import Request
from calibrate.load.sender import Sender
from calibrate.stages.context import StageContext
from calibrate.stages.measure.slo import with_goodput
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.measure.tiers import Stats, summarise
from calibrate.stages.sweep.levels import Level
from calibrate.stages.sweep.spec import SweepOptions


class LevelRunner(Protocol):
    """The running sweep, as its load modes see it."""

    ctx: StageContext
    options: SweepOptions
    monitor: VramMonitor
    sender: Sender
    cap: ServerCap | None
    levels: list[Level]
    auto_step: int | None

    def note(self, text: str) -> None: ...

    def add(self, level: Level) -> Level: ...

    def run_level(self, concurrency: int) -> Level: ...

    def level_requests(self, concurrency: int, count: int) -> list[Request]: ...

    def numbered(self, requests: Sequence[Request]) -> list[Request]: ...

    def keep(
        self,
        items: list[ItemResult],
        concurrency: int,
        repeat: int,
        peak: WindowPeak,
        label: str,
        tags: Mapping[str, Any] | None = None,
    ) -> list[ItemResult]: ...


def run_stats(
    o: SweepOptions,
    concurrency: int,
    repeat: int,
    items: list[ItemResult],
    total_s: float,
    peak: WindowPeak,
    *,
    items_per_s: float,
    output_tokens_per_s: float,
    window: Sequence[ItemResult],
    window_s: float,
) -> Stats:
    """One run of a level: its throughput the window's, its goodput within the SLOs."""
    stats = summarise(
        batch_size=o.batch_size,
        concurrency=concurrency,
        round_no=repeat,
        items=items,
        total_s=total_s,
        peaks=[peak],
        baseline_text=None,
    )
    stats = replace(stats, items_per_s=items_per_s, output_tokens_per_s=output_tokens_per_s)
    return with_goodput(stats, o.slo, window, window_s)


def whole_stats(
    o: SweepOptions,
    concurrency: int,
    runs: Sequence[Stats],
    items: list[ItemResult],
    peaks: list[WindowPeak],
) -> Stats:
    """A level over all its runs so far (``level_stats`` takes its throughput from the runs)."""
    return summarise(
        batch_size=o.batch_size,
        concurrency=concurrency,
        round_no=None,
        items=items,
        total_s=sum(r.total_s for r in runs),
        peaks=peaks,
        baseline_text=None,
    )
