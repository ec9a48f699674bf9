"""A finished sweep: its levels (median and range over the repeats), the knee, how sure it is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from calibrate.stages.stop_rules import Point, knee, knee_text
from calibrate.stages.tiers import Stats
from calibrate.summaries import SweepSummary, Workload

if TYPE_CHECKING:
    from calibrate.stages.sweep import SweepOptions

LevelVerdict = Literal["pass", "fail"]


@dataclass(frozen=True)
class ServerCap:
    """The server's own limit on parallel sequences, when it says (llama.cpp /props)."""

    slots: int
    source: str


@dataclass(frozen=True)
class Level:
    """One concurrency level: ``stats`` over all its runs, with ``items_per_s`` and
    ``output_tokens_per_s`` the medians of the runs' steady windows; ``runs`` one per repeat."""

    stats: Stats
    runs: tuple[Stats, ...]
    gain: float | None
    counted: bool  # the gain counts: median ≥ gain_min and the ranges do not overlap
    verdict: LevelVerdict
    capped: bool

    @property
    def concurrency(self) -> int:
        return self.stats.concurrency

    @property
    def items_per_s_min(self) -> float:
        return min((r.items_per_s for r in self.runs), default=self.stats.items_per_s)

    @property
    def items_per_s_max(self) -> float:
        return max((r.items_per_s for r in self.runs), default=self.stats.items_per_s)

    @property
    def point(self) -> Point:
        """As the knee rule sees it; a level run once has no range."""
        ranged = len(self.runs) > 1
        return Point(
            self.concurrency,
            self.stats.items_per_s,
            self.stats.errors,
            self.items_per_s_min if ranged else None,
            self.items_per_s_max if ranged else None,
        )

    def to_json(self) -> dict[str, Any]:
        gain = round(self.gain, 4) if self.gain is not None else None
        return {
            **self.stats.to_json(),
            "repeats": len(self.runs),
            "items_per_s_min": round(self.items_per_s_min, 6),
            "items_per_s_max": round(self.items_per_s_max, 6),
            "gain": gain,
            "gain_counted": self.counted,
            "verdict": self.verdict,
            "capped_by_server": self.capped,
        }


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
    def points(self) -> list[Point]:
        return [lv.point for lv in self.levels]

    @property
    def knee(self) -> Level | None:
        found = knee(self.points, self.gain_min)
        return next(
            (lv for lv in self.levels if found and lv.concurrency == found.concurrency), None
        )

    @property
    def knee_text(self) -> str:
        """Where the knee is and how sure: the gains around it with their ranges."""
        return knee_text(self.points, self.gain_min)

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
        return (
            f"concurrency {failed.concurrency}{first}: {s.errors} of {s.items} requests failed "
            f"({s.kinds_text})"
        )

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
            "knee": {
                "concurrency": top.concurrency,
                "items_per_s": round(top.stats.items_per_s, 3),
                "items_per_s_min": round(top.items_per_s_min, 3),
                "items_per_s_max": round(top.items_per_s_max, 3),
                "how_sure": self.knee_text,
            }
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
                    "items_per_s_min": round(lv.items_per_s_min, 3),
                    "items_per_s_max": round(lv.items_per_s_max, 3),
                    "repeats": len(lv.runs),
                    "gain_counted": lv.counted,
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
