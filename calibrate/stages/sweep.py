"""Stage C′: at the verified batch size, step concurrency and find the knee (SPEC §5.6)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from calibrate.config import Config, LadderMode
from calibrate.errors import RequestError
from calibrate.stages.context import StageContext
from calibrate.stages.incidents import IncidentRecorder
from calibrate.stages.ladder import all_refused, item_record
from calibrate.stages.single import unreachable
from calibrate.stages.stop_rules import Point, continue_sweep, gains, knee
from calibrate.stages.tiers import Stats, summarise
from calibrate.stages.waves import Request, Sender
from calibrate.stages.workload_plan import WorkloadPlan
from calibrate.summaries import SweepSummary, Workload
from calibrate.vram import VramMonitor
from calibrate.workload import WorkloadSpec

LevelVerdict = Literal["pass", "fail"]


@dataclass(frozen=True)
class SweepOptions:
    levels: tuple[int, ...]
    items: int
    gain_min: float
    batch_size: int
    mode: LadderMode = "wave"
    stream: bool = False
    ladder_run_id: str = ""
    skipped_levels: tuple[int, ...] = ()  # above what the ladder proved, on an unmanaged server
    beyond_ladder: bool = False

    @classmethod
    def from_config(cls, cfg: Config, batch_size: int, **kw: Any) -> SweepOptions:
        s = cfg.sweep
        return cls(s.concurrency, s.items, s.gain_min, batch_size, cfg.ladder.mode, **kw)


def safe_levels(
    levels: tuple[int, ...], max_in_flight: int, *, managed: bool, beyond_ladder: bool
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(levels to run, levels skipped): SPEC §5.0's rule that the sweep never sends more at once
    than the ladder proved. A managed server runs at cap B, so extra requests queue in the
    server and every level is safe; an unmanaged one gets at most ``max_in_flight`` at once."""
    if managed or beyond_ladder or max_in_flight < 1:
        return levels, ()
    keep = tuple(c for c in levels if c <= max_in_flight)
    skipped = tuple(c for c in levels if c > max_in_flight)
    return keep or (max_in_flight,), skipped


@dataclass(frozen=True)
class ServerCap:
    """The server's own limit on parallel sequences, when it says (llama.cpp /props)."""

    slots: int
    source: str


@dataclass(frozen=True)
class Level:
    stats: Stats
    gain: float | None
    verdict: LevelVerdict
    capped: bool

    @property
    def concurrency(self) -> int:
        return self.stats.concurrency

    def to_json(self) -> dict[str, Any]:
        gain = round(self.gain, 4) if self.gain is not None else None
        return {**self.stats.to_json(), "gain": gain, "verdict": self.verdict,
                "capped_by_server": self.capped}  # fmt: skip


@dataclass(frozen=True)
class SweepResult:
    levels: tuple[Level, ...]
    batch_size: int
    gain_min: float
    cap: ServerCap | None
    vram_source: str
    incidents: int
    workload: Workload = field(default_factory=Workload)
    workload_details: dict[str, Any] = field(default_factory=dict)

    @property
    def knee(self) -> Level | None:
        points = [
            Point(lv.concurrency, lv.stats.items_per_s, lv.stats.errors) for lv in self.levels
        ]
        found = knee(points, self.gain_min)
        return next(
            (lv for lv in self.levels if found and lv.concurrency == found.concurrency), None
        )

    @property
    def passed(self) -> bool:
        return self.knee is not None

    @property
    def stopped_by(self) -> str:
        return "failure" if any(lv.verdict == "fail" for lv in self.levels) else "completed"

    @property
    def reason(self) -> str:
        """Why the sweep stopped, in words (the failing level's errors)."""
        failed = next((lv for lv in self.levels if lv.verdict == "fail"), None)
        if failed is None:
            return "every level ran" if self.levels else "no level ran"
        s = failed.stats
        first = " (the first level)" if failed is self.levels[0] else ""
        return f"concurrency {failed.concurrency}{first}: {s.errors} of {s.items} requests failed ({s.kinds_text})"

    def notes(self) -> list[str]:
        out: list[str] = []
        if self.cap is not None:
            over = [lv.concurrency for lv in self.levels if lv.capped]
            if over:
                out.append(
                    f"concurrency {', '.join(map(str, over))} exceeds the server's own cap of "
                    f"{self.cap.slots} ({self.cap.source}): the extra requests queue in the server"
                )
        return out

    def summary(self, options: SweepOptions) -> SweepSummary:
        top = self.knee
        details = {
            "knee": {"concurrency": top.concurrency, "items_per_s": round(top.stats.items_per_s, 3)}
            if top
            else None,
            "reason": self.reason,
            "server_cap": {"slots": self.cap.slots, "source": self.cap.source}
            if self.cap
            else None,
            "vram_source": self.vram_source,
            "levels": [
                {
                    "concurrency": lv.concurrency,
                    "items_per_s": round(lv.stats.items_per_s, 3),
                    "errors": lv.stats.errors,
                    "verdict": lv.verdict,
                }
                for lv in self.levels
            ],
            "levels_skipped": list(options.skipped_levels),
            "beyond_ladder": options.beyond_ladder,
            "incidents": self.incidents,
            "workload_detail": self.workload_details,
        }
        return SweepSummary(
            top.concurrency if top else None,
            self.batch_size,
            options.ladder_run_id,
            self.stopped_by,
            details,
            self.workload,
        )


def read_server_cap(fetch: Callable[[str], str]) -> ServerCap | None:
    """llama.cpp's ``GET /props`` total_slots, else the length of ``GET /slots``."""
    for path in ("/props", "/slots"):
        try:
            data = json.loads(fetch(path))
        except (RequestError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("total_slots"), int):
            return ServerCap(data["total_slots"], "llama.cpp /props total_slots")
        if isinstance(data, list) and data:
            return ServerCap(len(data), "llama.cpp /slots")
    return None


@dataclass
class Sweep:
    ctx: StageContext
    options: SweepOptions
    monitor: VramMonitor
    incidents: IncidentRecorder
    sender: Sender
    cap: ServerCap | None = None
    on_level: Callable[[Level], None] = lambda level: None
    levels: list[Level] = field(default_factory=list)
    plan: WorkloadPlan = field(default_factory=lambda: WorkloadPlan(WorkloadSpec(), ""))
    issued: int = 0  # workload prompts built so far: the next one's number (its own prompt)

    def run(self) -> SweepResult:
        points: list[Point] = []
        for concurrency in self.options.levels:
            if not continue_sweep(points):
                break
            stats = self.run_level(concurrency)
            points.append(Point(concurrency, stats.items_per_s, stats.errors))
            level = Level(stats, gains(points)[-1], "fail" if stats.errors else "pass",
                          self.cap is not None and concurrency > self.cap.slots)  # fmt: skip
            self.levels.append(level)
            self.ctx.run.append("tiers.jsonl", level.to_json())
            self.on_level(level)
        return self.result()

    def result(self) -> SweepResult:
        o = self.options
        passing = [lv.stats for lv in self.levels if lv.verdict == "pass"]
        return SweepResult(
            tuple(self.levels),
            o.batch_size,
            o.gain_min,
            self.cap,
            self.monitor.source,
            len(self.incidents.written),
            self.plan.recorded(passing),
            self.plan.details(),
        )

    def level_requests(self, concurrency: int, count: int) -> list[Request]:
        """``count`` requests of the workload for one level (each a prompt list of B prompts in
        prompt-list mode); every prompt its own unless the workload shares them."""
        ctx, o = self.ctx, self.options
        per_request = o.batch_size if o.mode == "prompt-list" else 1
        prompts, targets = self.plan.prompts(count * per_request, self.issued)
        self.issued += count * per_request
        waves = [prompts[i : i + per_request] for i in range(0, len(prompts), per_request)]
        if o.mode != "prompt-list":
            waves = [prompts]
        model = ctx.config.target.model
        return self.plan.requests(
            ctx.client, model, ctx.params, waves, targets, o.mode, stream=o.stream
        )

    def run_level(self, concurrency: int) -> Stats:
        ctx, o = self.ctx, self.options
        requests = self.level_requests(concurrency, o.items)
        idle = self.monitor.open_window()
        items, seconds = self.sender.send(requests, concurrency, ctx.params.max_tokens)
        peak = self.monitor.close_window(idle)
        if not self.levels and all_refused(items):
            raise unreachable(items[0].error, ctx.config.target.base_url)
        for item in items:
            ctx.run.append("records.jsonl", item_record(ctx, item, o.batch_size, concurrency, None))
        self.incidents.record(items, batch_size=o.batch_size, concurrency=concurrency,
                              round_no=1, label=f"c{concurrency}", peak=peak)  # fmt: skip
        return summarise(batch_size=o.batch_size, concurrency=concurrency, round_no=None,
                         items=items, total_s=seconds, peaks=[peak], baseline_text=None)  # fmt: skip
