"""The behaviour model of the fake GPU server: admission, slots, VRAM, faults, generation.

No HTTP here. A request is *admitted* (counted in flight, its fate drawn), waits for a decode
slot, is *generated*, then *released*. "In flight" counts sequences received and not yet
answered, decoding or queued; a completions request carrying K prompts counts K.
"""

from __future__ import annotations

import math
import random
import threading
from collections import deque
from dataclasses import dataclass
from typing import Literal

from calibrate.mock import text
from calibrate.mock.malformed import SHAPES
from calibrate.mock.settings import MockSettings

Outcome = Literal["ok", "oom", "fail", "reset", "overload"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "oom", "fail", "reset", "overload")
FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Admission:
    """One admitted request: its fate and timing, fixed at arrival."""

    ticket: int
    weight: int
    in_flight: int
    outcome: Outcome
    ttft_s: float
    per_token_s: float
    truncate: bool
    perturb: bool
    malformed: str | None = None  # the wrong shape this reply takes (mock.malformed.SHAPES)
    echo_headers: bool = False


@dataclass(frozen=True)
class Generation:
    """The answer to one prompt."""

    text: str
    finish_reason: FinishReason
    completion_tokens: int


@dataclass(frozen=True)
class Snapshot:
    """Gauges and counters at one moment, for /metrics and tests."""

    in_flight: int
    running: int
    waiting: int
    vram_used_mib: int
    vram_peak_mib: int
    vram_total_mib: int
    kv_cache_usage: float
    requests_total: int
    outcomes: dict[str, int]


class MockModel:
    """Thread-safe state of one mock server; every random choice comes from ``settings.seed``."""

    def __init__(self, settings: MockSettings) -> None:
        self.settings = settings
        self._cond = threading.Condition()
        self._rng = random.Random(settings.seed)
        # The hostile draws have their own generator: adding them kept every fault sequence.
        self._hostile_rng = random.Random(f"hostile-{settings.seed}")
        self._next_ticket = 0
        self._in_flight = 0
        self._running = 0
        self._queue: deque[tuple[int, int]] = deque()
        self._held: dict[int, int] = {}
        self._peak_mib = settings.vram_base_mib
        self._outcomes: dict[str, int] = {}

    def admit(self, weight: int = 1) -> Admission:
        """Count a newly arrived request of ``weight`` sequences and decide what happens to it."""
        s = self.settings
        with self._cond:
            self._next_ticket += 1
            self._in_flight += weight
            n = self._in_flight
            self._peak_mib = max(self._peak_mib, self._vram_used_mib())
            # Always draw all five, in this order, so a run's fault sequence depends only on seed.
            overload, fail, reset, truncate, slow = (self._rng.random() for _ in range(5))
            echo, bad, shape = (self._hostile_rng.random() for _ in range(3))
            outcome: Outcome = "ok"
            if s.oom_at is not None and n > s.oom_at:
                outcome = "oom"
            elif overload < s.overload_rate:
                outcome = "overload"
            elif fail < s.fail_rate:
                outcome = "fail"
            elif reset < s.reset_rate:
                outcome = "reset"
            self._outcomes[outcome] = self._outcomes.get(outcome, 0) + 1
            per_token = s.per_token_s
            if s.slow_above is not None and n > s.slow_above:
                per_token *= s.slow_factor
            return Admission(
                ticket=self._next_ticket,
                weight=weight,
                in_flight=n,
                outcome=outcome,
                ttft_s=s.ttft_s + (s.slow_s if slow < s.slow_rate else 0.0),
                per_token_s=per_token * self.waves(weight),
                truncate=truncate < s.truncate_rate,
                perturb=s.nondeterministic_above is not None and n > s.nondeterministic_above,
                malformed=SHAPES[int(shape * len(SHAPES))] if bad < s.malformed_rate else None,
                echo_headers=echo < s.echo_headers_rate,
            )

    def waves(self, weight: int) -> int:
        """How many rounds of decoding ``weight`` sequences need with the configured slots."""
        slots = self.settings.slots
        return math.ceil(weight / slots) if slots else 1

    def acquire(self, adm: Admission, timeout_s: float | None = None) -> bool:
        """Wait, first come first served, until a decode slot is free; False on timeout."""
        slots = self.settings.slots
        need = min(adm.weight, slots) if slots else adm.weight
        with self._cond:
            entry = (adm.ticket, need)
            self._queue.append(entry)
            ready = self._cond.wait_for(
                lambda: self._queue[0] == entry and (not slots or self._running + need <= slots),
                timeout_s,
            )
            if not ready:
                self._queue.remove(entry)
                self._cond.notify_all()
                return False
            self._queue.popleft()
            self._running += need
            self._held[adm.ticket] = need
            self._cond.notify_all()
            return True

    def release(self, adm: Admission) -> None:
        """The request was answered (or failed): free its slot and its place in flight."""
        with self._cond:
            self._running -= self._held.pop(adm.ticket, 0)
            self._in_flight -= adm.weight
            self._cond.notify_all()

    def generate(self, prompt: str, max_tokens: int | None, adm: Admission) -> Generation:
        """The deterministic answer to ``prompt`` under this admission."""
        full = text.natural_text(prompt, self.settings.text_seed)
        if adm.perturb:
            full = text.perturb(full, prompt, adm.in_flight)
        natural = text.count_tokens(full)
        limit = natural if max_tokens is None else min(natural, max_tokens)
        if adm.truncate:
            limit = min(limit, max(1, natural // 2))
        out = text.cut(full, limit) if limit < natural else full
        finish: FinishReason = "length" if limit < natural else "stop"
        if self.settings.whitespace_variant:
            out += " \n"
        if self.settings.lone_surrogate:
            out += "\ud800"
        if self.settings.huge_mib:
            out += " " + "x" * max(0, int(self.settings.huge_mib * 1024 * 1024) - len(out) - 1)
        return Generation(text=out, finish_reason=finish, completion_tokens=limit)

    def snapshot(self) -> Snapshot:
        """The gauges /metrics exports."""
        s = self.settings
        with self._cond:
            kv_room = s.vram_total_mib - s.vram_base_mib
            kv = self._in_flight * s.vram_per_request_mib
            return Snapshot(
                in_flight=self._in_flight,
                running=self._running,
                waiting=sum(need for _, need in self._queue),
                vram_used_mib=self._vram_used_mib(),
                vram_peak_mib=self._peak_mib,
                vram_total_mib=s.vram_total_mib,
                kv_cache_usage=min(1.0, kv / kv_room) if kv_room > 0 else 1.0,
                requests_total=self._next_ticket,
                outcomes=dict(self._outcomes),
            )

    def _vram_used_mib(self) -> int:
        s = self.settings
        used = s.vram_base_mib + self._in_flight * s.vram_per_request_mib
        return min(used, s.vram_total_mib)
