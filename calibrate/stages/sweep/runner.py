"""What a sweep's load modes (rates, --auto) ask of the sweep that runs them: one seam,
so a mode is a strategy over the sweep, never a module that imports it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from calibrate.gpu.vram import VramMonitor, WindowPeak
from calibrate.load.items import ItemResult
from calibrate.load.request import Request
from calibrate.load.waves import Sender
from calibrate.stages.context import StageContext
from calibrate.stages.measure.stop_rules import ServerCap
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
