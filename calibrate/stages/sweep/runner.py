"""What a sweep's load modes (rates, --auto) ask of the sweep that runs them: one seam,
so a mode is a strategy over the sweep, never a module that imports it."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from calibrate.gpu.noise import NoiseMeter
from calibrate.gpu.vram import VramMonitor
from calibrate.gpu.vram.peaks import WindowPeak
from calibrate.load.items import ItemResult
from calibrate.load.request import Request
from calibrate.load.sender import Sender
from calibrate.load.window import MIN_REQUESTS_PER_SLOT
from calibrate.stages.context import StageContext
from calibrate.stages.measure.slo import with_goodput
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.measure.tiers import Stats, summarise
from calibrate.stages.prepare.workload_plan import WorkloadPlan
from calibrate.stages.sweep.levels import Level
from calibrate.stages.sweep.spec import SweepOptions


class LevelSupply:
    """The workload's requests for a level's runs, as the ``Sweep`` (a dataclass with these
    fields) hands them out."""

    ctx: StageContext
    options: SweepOptions
    plan: WorkloadPlan
    issued: int

    def level_requests(self, concurrency: int, count: int) -> list[Request]:
        """``count`` requests of the workload for a run at ``concurrency`` (each a prompt list of
        B in prompt-list mode). A run asks again when it needs more, so each call returns fresh
        requests: every prompt its own unless the workload shares them."""
        ctx, o = self.ctx, self.options
        per_request = o.prompts_per_request
        prompts, targets = self.plan.prompts(count * per_request, self.issued)
        self.issued += count * per_request
        waves = [prompts[i : i + per_request] for i in range(0, len(prompts), per_request)]
        if o.mode != "prompt-list":
            waves = [prompts]
        model = ctx.config.target.model
        return self.plan.requests(
            ctx.client,
            model,
            ctx.params,
            waves,
            targets,
            o.mode,
            stream=o.stream,
            stream_options=o.stream_options,
        )

    def numbered(self, requests: Sequence[Request]) -> list[Request]:
        """Requests numbered from 1 across one run (item indices stay unique)."""
        out: list[Request] = []
        first = 1
        for request in requests:
            out.append(replace(request, first_index=first))
            first += len(request.prompts)
        return out

    def supply(self, concurrency: int) -> Callable[[], Request]:
        """The next request of a run, numbered from 1 across the run (item indices stay unique)."""
        pending: deque[Request] = deque()
        numbered = 0

        def next_request() -> Request:
            nonlocal numbered
            if not pending:
                pending.extend(
                    self.level_requests(concurrency, MIN_REQUESTS_PER_SLOT * concurrency)
                )
            request = replace(pending.popleft(), first_index=numbered + 1)
            numbered += len(request.prompts)
            return request

        return next_request


class LevelRunner(Protocol):
    """The running sweep, as its load modes see it."""

    ctx: StageContext
    options: SweepOptions
    monitor: VramMonitor
    sender: Sender
    cap: ServerCap | None
    levels: list[Level]
    auto_step: int | None
    noise: NoiseMeter | None  # the machine's own noise per run (SPEC §5.14)

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
