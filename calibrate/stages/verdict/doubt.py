"""When the runs cannot tell settings apart: the doubts, their cause and what to do (SPEC §5.14).

A stage whose verdict still rests on a pair of settings that ``separation.judge_gain`` calls
unsure at the repeat budget ends **inconclusive** (exit 1, ``passed: false``, no gate opened).
Its line names the pair with the interval behind it, the cause read from the machine's own
noise (``gpu.noise``: a busy machine, the hypervisor's steal, a starved client; else the server
itself varied) and what to do. ``--conservative`` takes the conservative answer instead — the
smaller setting the runs cannot tell from the best — and the ledger records it as taken under
noise (``UnderNoise``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from calibrate.gpu.noise import MachineNoise
from calibrate.stages.verdict.separation import GainInterval

CONSERVATIVE_FLAG = "--conservative"


def pct(value: float) -> str:
    """``+34 %``, ``−9 %`` (never ``−0 %``); ``∞`` beyond a thousand times."""
    if abs(value) > 1000:
        return "+∞ %" if value > 0 else "−∞ %"
    percent = round(value * 100) or 0
    return f"{percent:+d} %".replace("-", "−")


@dataclass(frozen=True)
class Doubt:
    """Two settings the runs could not tell apart: ``cur`` against ``base``."""

    base: str  # "concurrency 2", "batch 1", "c01"
    cur: str
    interval: GainInterval
    gain_min: float

    def text(self) -> str:
        """``whether concurrency 4 adds 10 % over concurrency 2: +12 % by the medians, anywhere
        from −79 % to +154 % (5 and 3 runs)``."""
        iv = self.interval
        base_runs, cur_runs = iv.runs
        return (
            f"whether {self.cur} adds {self.gain_min * 100:.0f} % over {self.base}: "
            f"{pct(iv.median)} by the medians, anywhere from {pct(iv.low)} to {pct(iv.high)} "
            f"({cur_runs} and {base_runs} runs)"
        )

    def to_json(self) -> dict[str, Any]:
        iv = self.interval
        return {
            "base": self.base,
            "cur": self.cur,
            "gain": round(iv.median, 4),
            "gain_low": round(iv.low, 4) if abs(iv.low) < 1e9 else None,
            "gain_high": round(iv.high, 4) if abs(iv.high) < 1e9 else None,
            "runs": list(iv.runs),
            "gain_min": self.gain_min,
        }


@dataclass(frozen=True)
class SplitDoubt:
    """A level whose runs fell on both sides of a line (an SLO's bound, saturation)."""

    level: str  # "concurrency 9", "25 req/s"
    question: str  # "meets the SLOs", "keeps up"
    against: int  # runs on the other side
    runs: int

    def text(self) -> str:
        """``whether concurrency 9 meets the SLOs: 2 of 6 runs did not``."""
        return f"whether {self.level} {self.question}: {self.against} of {self.runs} runs did not"

    def to_json(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "question": self.question,
            "against": self.against,
            "runs": self.runs,
        }


@dataclass(frozen=True)
class ShortfallDoubt:
    """A rate level whose achieved rate the slope's interval could not tell from 5 % short."""

    level: str  # "10 req/s"
    interval: str  # the shortfall and its interval in words (``saturation.Shortfall.text``)

    def text(self) -> str:
        """``whether 10 req/s keeps up: achieved 9.35 req/s, 6 % below the offered 10 — anywhere
        from 3 % above to 16 % below over 8 answers (1 run, 95 %), across the 5 % line``."""
        return f"whether {self.level} keeps up: {self.interval}"

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, "question": "keeps up", "shortfall": self.interval}


def cause_of(noise: MachineNoise | None) -> str:
    """Why the runs disagree, in words: the machine's own noise, else the server itself."""
    if noise is None:
        return "the runs varied (this machine's own load could not be read)"
    causes = noise.causes()
    if causes:
        return "; ".join(causes)
    return (
        f"the server's own throughput varied while the machine was quiet (other processes "
        f"used {noise.others_cores:.1f} of its {noise.cores} cores): server jitter"
    )


def remedy(noise: MachineNoise | None, more_runs: str) -> str:
    """What to do about it, cause first."""
    steps: list[str] = []
    if noise is not None and noise.busy:
        steps.append("run it again when the other jobs have stopped (a quieter machine)")
    if noise is not None and noise.stolen:
        steps.append("run on a machine with dedicated cores")
    if noise is not None and noise.starved:
        steps.append("send from more processes (--workers N) or a faster client machine")
    steps.append(f"give it more time or more runs ({more_runs})")
    return "; or ".join(steps)


@dataclass(frozen=True)
class Inconclusive:
    """A verdict the runs could not back: the doubts, the noise behind them, the way out."""

    doubts: tuple[Doubt | SplitDoubt | ShortfallDoubt, ...]
    noise: MachineNoise | None  # over the whole stage
    during: str  # "the sweep", "the ladder", "tune"
    conservative: str  # the conservative answer in words ("concurrency 1"); "" when none
    more_runs: str  # where the repeat budget is set ("[sweep] max_repeats, [sweep] level_s")

    @property
    def cause(self) -> str:
        return cause_of(self.noise)

    @property
    def text(self) -> str:
        """``inconclusive: the runs cannot tell concurrency 4 against 2: … — other processes
        used 1.6 of this machine's 2 cores during the sweep``."""
        pairs = "; ".join(d.text() for d in self.doubts)
        return f"inconclusive: the runs cannot tell {pairs} — {self.cause} during {self.during}"

    @property
    def what_to_do(self) -> str:
        take = (
            f"; or take the conservative answer ({self.conservative}) with {CONSERVATIVE_FLAG}"
            if self.conservative
            else ""
        )
        return remedy(self.noise, self.more_runs) + take

    def to_json(self) -> dict[str, Any]:
        return {
            "doubts": [d.to_json() for d in self.doubts],
            "cause": self.cause,
            "noise": self.noise.to_json() if self.noise else None,
            "conservative": self.conservative or None,
        }


@dataclass(frozen=True)
class UnderNoise:
    """A conservative answer taken under noise (``--conservative``), as the ledger records it."""

    inconclusive: Inconclusive

    @property
    def text(self) -> str:
        return (
            f"{self.inconclusive.conservative}, the conservative answer, taken under noise "
            f"({CONSERVATIVE_FLAG}): {self.inconclusive.text.removeprefix('inconclusive: ')}"
        )

    def to_json(self) -> dict[str, Any]:
        return {"taken_under_noise": True, **self.inconclusive.to_json()}
