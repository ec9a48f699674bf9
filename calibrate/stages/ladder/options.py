"""What a ladder run is asked to do: its batch sizes (or input lengths), rounds, mode, and the
rules that stop it (SPEC §5.3)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from calibrate.confidence import DEFAULT_LEVEL
from calibrate.config import Config, LadderMode, SloConfig
from calibrate.stages.prepare.stream_probe import StreamCheck
from calibrate.workload import Axis


@dataclass(frozen=True)
class LadderOptions:
    batch_sizes: tuple[int, ...]
    rounds: int
    mode: LadderMode
    vram_limit: float
    latency_rise: float
    require_match: bool = False
    min_round_s: float = 0.0  # a round repeats waves of B until it lasted this long
    warmup_waves: int = 0  # waves of the first tier before it, not counted
    slo: SloConfig = field(default_factory=SloConfig)
    axis: Axis = "batch"
    context_lengths: tuple[int, ...] = ()  # the context axis's input lengths, one tier each
    streaming: bool = True  # SPEC §5.13: streamed by default (``--no-stream`` turns it off)
    stream_check: StreamCheck | None = None  # what the stream probe found (None: not probed)
    gain_min: float = 0.10  # the setting: the smallest B within this much of the fastest tier
    max_rounds: int = 0  # rounds a tier may run when its rounds disagree (0: ``rounds``)
    determinism_copies: int = 0  # [determinism] copies of the fixed prompt per tier (0: off)
    confidence: float = DEFAULT_LEVEL  # [confidence] level: the setting's intervals
    conservative: bool = False  # --conservative: the smaller batch when noise leaves doubt

    @property
    def round_bound(self) -> int:
        return max(self.rounds, self.max_rounds)

    @property
    def stream(self) -> bool:
        """Stream (SSE) by default, and always when an SLO needs TTFT: only a streamed answer
        shows its first token — unless the server refused streamed requests (the probe)."""
        asked = self.streaming or self.slo.needs_stream
        return asked and (self.stream_check is None or self.stream_check.stream)

    @property
    def stream_options(self) -> bool:
        return self.stream_check is None or self.stream_check.stream_options

    @classmethod
    def from_config(cls, cfg: Config, *, require_match: bool = False) -> LadderOptions:
        c = cfg.ladder
        return cls(
            batch_sizes=c.batch_sizes,
            rounds=c.rounds,
            mode=c.mode,
            vram_limit=c.vram_limit,
            latency_rise=c.latency_rise,
            require_match=require_match,
            min_round_s=c.min_round_s,
            warmup_waves=c.warmup_waves,
            slo=cfg.slo,
            gain_min=cfg.sweep.gain_min,
            max_rounds=c.max_rounds or 2 * c.rounds,
            determinism_copies=cfg.determinism.copies,
            confidence=cfg.confidence.level,
        )

    def on_context_axis(self, lengths: Sequence[int], batch: int) -> LadderOptions:
        """Step the input length at batch ``batch`` (SPEC §5.3 ``--axis context``). Per-item
        time grows with the input by nature, so the latency rule has nothing to say here."""
        return replace(
            self,
            axis="context",
            context_lengths=tuple(lengths),
            batch_sizes=(batch,) * len(lengths),
            latency_rise=math.inf,
        )
