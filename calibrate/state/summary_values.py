"""The values the ledger's summaries are made of: a setting (B, C), a tune winner, the workload
that was sent — and the tolerant readers of their fields (a field of the wrong type reads as
absent, so an old or hand-edited ledger line can never crash a gate)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def positive_int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def text_of(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    return value if isinstance(value, str) else ""


def positive_float(data: dict[str, Any], key: str) -> float | None:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return None
    return float(value)


def flags_of(data: Any) -> tuple[tuple[str, str], ...]:
    """``{"parallel": "4"}`` → ``(("parallel", "4"),)``; anything malformed reads as none."""
    if not isinstance(data, dict):
        return ()
    return tuple(
        (k, str(v))
        for k, v in data.items()
        if isinstance(k, str) and isinstance(v, str | int | float) and not isinstance(v, bool)
    )


@dataclass(frozen=True)
class Setting:
    """Batch size B (the engine's cap) and concurrency C (requests in flight), SPEC §5.0."""

    batch_size: int
    concurrency: int

    def to_json(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "concurrency": self.concurrency}

    @classmethod
    def from_json(cls, data: Any) -> Setting | None:
        if not isinstance(data, dict):
            return None
        batch = positive_int(data, "batch_size")
        # lines from before the concurrency column existed ran one request at a time
        conc = positive_int(data, "concurrency") or (1 if "concurrency" not in data else None)
        return cls(batch, conc) if batch and conc else None


@dataclass(frozen=True)
class TunedSetting:
    """A tune winner: every engine flag it ran with, its cap B and its best concurrency C."""

    flags: tuple[tuple[str, str], ...]
    batch_size: int
    concurrency: int

    @property
    def setting(self) -> Setting:
        return Setting(self.batch_size, self.concurrency)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.flags)

    def to_json(self) -> dict[str, Any]:
        return {**self.setting.to_json(), "flags": dict(self.flags)}

    @classmethod
    def from_json(cls, data: Any) -> TunedSetting | None:
        setting = Setting.from_json(data)
        if setting is None or not isinstance(data, dict):
            return None
        return cls(flags_of(data.get("flags")), setting.batch_size, setting.concurrency)


def fraction_of(data: dict[str, Any], key: str) -> float | None:
    """A share in [0, 1] (0 is a finding: nothing came from the cache)."""
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        return None
    return float(value)


@dataclass(frozen=True)
class PrefixCacheSeen:
    """The engine's prefix cache as a ladder or sweep met it (SPEC §13): its name, on or off
    (None: not said), the share of prompt tokens found in it (over the run's load, else the
    probe's shared-prefix prompts) and how many times sooner a shared prefix got a first token
    than the same prompt with nothing shared (None: not probed)."""

    cache: str | None = None
    on: bool | None = None
    hit: float | None = None
    gain: float | None = None

    def describe(self) -> str:
        state = {True: "on", False: "off", None: "seen"}[self.on]
        text = f"prefix cache {state}" + (f" ({self.cache})" if self.cache else "")
        found = []
        if self.hit is not None:
            found.append(f"{self.hit:.0%} of prompt tokens from the cache")
        if self.gain is not None:  # below 1.2×: timing noise, no gain to speak of
            sooner = f"{self.gain:.1f}× sooner" if self.gain >= 1.2 else "no sooner"
            found.append(f"first token {sooner} with the shared prefix")
        return text + (": " + ", ".join(found) if found else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "cache": self.cache,
            "on": self.on,
            "hit": round(self.hit, 4) if self.hit is not None else None,
            "gain": round(self.gain, 3) if self.gain is not None else None,
        }

    @classmethod
    def from_json(cls, data: Any) -> PrefixCacheSeen | None:
        if not isinstance(data, dict):
            return None
        on = data.get("on")
        return cls(
            text_of(data, "cache") or None,
            on if isinstance(on, bool) else None,
            fraction_of(data, "hit"),
            positive_float(data, "gain"),
        )


@dataclass(frozen=True)
class Workload:
    """What a ladder or sweep sent (SPEC §5.11): the fixed prompt, a tasks file, synthetic
    prompts, or a finished batch replayed — and the engine's prefix cache as it met them.

    ``longest_input_tokens`` is the longest ``usage.prompt_tokens`` a passing tier sent, and
    ``tokens_per_char`` what the server counted per character of those inputs (``batch``'s
    length check estimates its items with it).
    """

    source: str = "fixed"
    longest_input_tokens: int | None = None
    output_tokens: int | None = None
    input_tokens: str | None = None  # the target: "2000" or "512:4096"
    tasks: str | None = None
    pick: str | None = None
    shared_prefix: float | None = None
    tokens_per_char: float | None = None
    output_controlled: bool | None = None  # None: answers were not forced
    prefix_tokens: int | None = None  # --prefix-tokens: the first P tokens of every prompt
    replay: str | None = None  # the journal replayed
    replay_items: int | None = None
    prefix_cache: PrefixCacheSeen | None = None

    def describe(self) -> str:
        if self.source == "fixed":
            text = "the fixed prompt"
            if self.longest_input_tokens:
                text += f" ({self.longest_input_tokens} input tokens)"
            seen = self.prefix_cache
            return text + (f", {seen.describe()}" if seen and self._said_cache() else "")
        parts = [self.source]
        if self.tasks:
            parts[0] = f"tasks {self.tasks}" + (f" (pick {self.pick})" if self.pick else "")
        if self.replay:
            items = f", {self.replay_items} items" if self.replay_items else ""
            parts[0] = f"replay of {self.replay} (its own token counts{items})"
        if self.input_tokens:
            parts.append(f"target {self.input_tokens} input tokens")
        if self.prefix_tokens:
            parts.append(f"the first {self.prefix_tokens} tokens shared")
        elif self.shared_prefix:
            parts.append(f"{self.shared_prefix:.0%} shared prefix")
        if self.longest_input_tokens:
            parts.append(f"longest input {self.longest_input_tokens} tokens")
        if self.output_tokens:
            forced = "" if self.output_controlled is not False else " (not controlled)"
            parts.append(f"{self.output_tokens} output tokens{forced}")
        if self._said_cache() and self.prefix_cache is not None:
            parts.append(self.prefix_cache.describe())
        return ", ".join(parts)

    def _said_cache(self) -> bool:
        """A cache is named when it was probed or found anything (never a silent 'off' for a
        workload that shares nothing)."""
        seen = self.prefix_cache
        return seen is not None and (seen.gain is not None or bool(seen.hit))

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "longest_input_tokens": self.longest_input_tokens,
            "output_tokens": self.output_tokens,
            "input_tokens": self.input_tokens,
            "tasks": self.tasks,
            "pick": self.pick,
            "shared_prefix": self.shared_prefix,
            "tokens_per_char": round(self.tokens_per_char, 5) if self.tokens_per_char else None,
            "output_controlled": self.output_controlled,
            "prefix_tokens": self.prefix_tokens,
            "replay": self.replay,
            "replay_items": self.replay_items,
            "prefix_cache": self.prefix_cache.to_json() if self.prefix_cache else None,
        }

    @classmethod
    def from_json(cls, data: Any) -> Workload:
        if not isinstance(data, dict):
            return cls()
        controlled = data.get("output_controlled")
        return cls(
            text_of(data, "source") or "fixed",
            positive_int(data, "longest_input_tokens"),
            positive_int(data, "output_tokens"),
            text_of(data, "input_tokens") or None,
            text_of(data, "tasks") or None,
            text_of(data, "pick") or None,
            positive_float(data, "shared_prefix"),
            positive_float(data, "tokens_per_char"),
            controlled if isinstance(controlled, bool) else None,
            positive_int(data, "prefix_tokens"),
            text_of(data, "replay") or None,
            positive_int(data, "replay_items"),
            PrefixCacheSeen.from_json(data.get("prefix_cache")),
        )
