"""What one sweep is asked to do: its flags (``SweepSpec``), then its levels or rates, windows,
repeats and mode once planned (``SweepOptions``, SPEC §5.6)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from calibrate.confidence import DEFAULT_LEVEL
from calibrate.config import Config, LadderMode, SloConfig
from calibrate.load.arrivals import Arrival
from calibrate.stages.measure.tier_run import TierSpec
from calibrate.stages.prepare.stream_probe import StreamCheck


@dataclass(frozen=True)
class SweepOptions:
    levels: tuple[int, ...]
    level_s: float
    repeats: int
    gain_min: float
    batch_size: int
    mode: LadderMode = "wave"
    stream: bool = False
    ladder_run_id: str = ""
    skipped_levels: tuple[int, ...] = ()  # above what the ladder proved, on an unmanaged server
    beyond_ladder: bool = False
    slo: SloConfig = field(default_factory=SloConfig)
    rates: tuple[float, ...] = ()  # open loop at these requests/s (inf: all at once); () = closed
    arrival: Arrival = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    job_gaps: tuple[float, ...] = ()  # arrival "job": a replayed journal's gaps between sends
    max_in_flight: int | None = None  # rate mode's in-flight cap (None: none, a managed server)
    auto_steps: int = 0  # --auto: rates between synchronous and maximum (levels = (1, maximum))
    stream_check: StreamCheck | None = None  # what the stream probe found (None: not probed)
    max_repeats: int = 6  # runs of a level left unsure against the best (SPEC §5.6)
    find_max_top: int = 0  # --find-max: search concurrency 1…this for the SLO boundary (0: off)
    # --find-max --rates: search offered rates LO…HI req/s (None: off; LO 0: the synchronous rate)
    find_max_rates: tuple[float, float] | None = None
    determinism_copies: int = 0  # [determinism] copies of the fixed prompt per level (0: off)
    confidence: float = DEFAULT_LEVEL  # [confidence] level: the knee's Welch interval
    conservative: bool = False  # --conservative: take the smaller level when noise leaves doubt

    def probed(self, check: StreamCheck) -> SweepOptions:
        """Sent as the stream probe found the server takes them."""
        return replace(self, stream=self.stream and check.stream, stream_check=check)

    @property
    def stream_options(self) -> bool:
        return self.stream_check is None or self.stream_check.stream_options

    @property
    def prompts_per_request(self) -> int:
        """B in prompt-list mode (one completions request carries the batch), else 1: what
        turns items/s into the requests/s a rate is offered in."""
        return self.batch_size if self.mode == "prompt-list" else 1

    @classmethod
    def from_config(cls, cfg: Config, batch_size: int, **kw: Any) -> SweepOptions:
        s = cfg.sweep
        kw.setdefault("max_repeats", max(s.max_repeats, s.repeats))
        kw.setdefault("determinism_copies", cfg.determinism.copies)
        kw.setdefault("confidence", cfg.confidence.level)
        return cls(
            s.concurrency, s.level_s, s.repeats, s.gain_min, batch_size, cfg.ladder.mode, **kw
        )


@dataclass(frozen=True)
class SweepSpec(TierSpec):
    """The sweep's flags, checked (a mistake in them is exit 2 before anything is sent)."""

    batch_size: int | None = None  # None: the ladder's verified batch size
    # --concurrency and --rates as given: read once the gates are passed, as they always were
    concurrency: str | None = None  # None: [sweep] concurrency
    rates: str | None = None  # open loop at these requests/s (None: closed loop)
    auto_steps: int = 0  # --auto: this many rates between synchronous and maximum (0: off)
    find_max: bool = False
    find_max_rates: tuple[float, float] | None = None  # --find-max --rates LO:HI (0, 0: auto)
    arrival: Arrival = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    beyond_ladder: bool = False
