"""What the prefix-cache probe found (``prefix_probe``), in numbers and in one sentence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from calibrate.engines.base import PrefixCacheInfo

CacheState = Literal["on", "off", "unknown"]
AT_WORK = 1.2  # a shared prefix this much sooner to a first token: a cache is at work
NO_GAIN = 1.1  # … no more than this: none is


@dataclass(frozen=True)
class Share:
    """Probe prompts of one kind: the median time to one token, and the share of their prompt
    tokens the engine found in its cache (None: it does not say), and where it said so."""

    seconds: float
    hit: float | None
    source: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 6),
            "hit": round(self.hit, 4) if self.hit is not None else None,
            "source": self.source,
        }


@dataclass(frozen=True)
class PrefixFinding:
    """The engine's prefix cache as the workload meets it: its name, whether it is on, and the
    probe's prompts with the workload's shared prefix against the same with nothing shared."""

    cache: str | None
    enabled: bool | None
    switch: str = ""
    shared: Share | None = None
    unique: Share | None = None
    problem: str | None = None  # why nothing was measured

    @classmethod
    def unmeasured(cls, info: PrefixCacheInfo | None, problem: str) -> PrefixFinding:
        return cls(info.name if info else None, None, info.switch if info else "", problem=problem)

    @property
    def gain(self) -> float | None:
        """How many times sooner the shared prefix got its first token (None: not measured)."""
        if self.shared is None or self.unique is None or self.shared.seconds <= 0:
            return None
        return self.unique.seconds / self.shared.seconds

    @property
    def state(self) -> CacheState:
        """On or off as the engine says; else on when its counts show hits, unknown otherwise."""
        if self.enabled is not None:
            return "on" if self.enabled else "off"
        hit = self.shared.hit if self.shared else None
        return "on" if hit is not None and hit > 0 else "unknown"

    def sentence(self) -> str:
        """The finding for the user, one line."""
        name = self.cache or "the server's prefix cache"
        if self.problem:
            return f"prefix cache: {name} not measured ({self.problem})"
        timing = self._timing()
        if self.state == "off":
            switch = f"; to measure the job as it could run: {self.switch}" if self.switch else ""
            return (
                f"prefix cache: {name} is off on this server: the shared prefix is read again "
                f"for every prompt ({timing}){switch}"
            )
        if self.cache is None and (self.shared is None or self.shared.hit is None):
            gain = self.gain or 0.0
            verdict = (
                "a prefix cache at work"
                if gain >= AT_WORK
                else "no prefix cache at work"
                if gain <= NO_GAIN
                else "perhaps a prefix cache"
            )
            return f"prefix cache: the server publishes no hit count; {timing} ({verdict})"
        found = self._found()
        state = "is on" if self.state == "on" else "was read"
        return f"prefix cache: {name} {state}: {found}; {timing}"

    def _found(self) -> str:
        shared, unique = self.shared, self.unique
        if shared is None or shared.hit is None:
            return "it says nothing of its hits"
        where = f" ({shared.source})" if shared.source else ""
        text = f"{shared.hit:.0%} of the shared-prefix prompts' tokens came from it{where}"
        if unique is not None and unique.hit is not None:
            text += f", {unique.hit:.0%} of the same prompts with nothing shared"
        return text

    def _timing(self) -> str:
        shared, unique, gain = self.shared, self.unique, self.gain
        if shared is None or unique is None or gain is None:
            return "not timed"
        text = (
            f"one token in {shared.seconds:.3g} s with the shared prefix, {unique.seconds:.3g} s "
            "without"
        )
        return text + (f": {gain:.1f}× sooner" if gain >= AT_WORK else "")

    def to_json(self) -> dict[str, Any]:
        gain = self.gain
        return {
            "cache": self.cache,
            "state": self.state,
            "shared": self.shared.to_json() if self.shared else None,
            "unique": self.unique.to_json() if self.unique else None,
            "gain": round(gain, 3) if gain is not None else None,
            "problem": self.problem,
            "sentence": self.sentence(),
        }
