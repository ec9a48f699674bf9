"""A request's fate, fixed the moment the mock admits it: the fault it meets, the shape its
reply takes, and its timing (time to first token, time per token) — all drawn from
``settings.seed``, so a run's fault sequence depends on the seed alone."""

from __future__ import annotations

import random
from dataclasses import dataclass

from calibrate.mock.settings import SHAPES, MockSettings, Outcome


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
    malformed: str | None = None  # the wrong shape this reply takes (mock.settings.SHAPES)
    echo_headers: bool = False


class Fates:
    """The draws behind every admission, in arrival order; not thread-safe: MockModel holds its
    lock around ``draw``."""

    def __init__(self, settings: MockSettings) -> None:
        self.settings = settings
        self._rng = random.Random(settings.seed)
        # The hostile draws have their own generator: adding them kept every fault sequence.
        self._hostile_rng = random.Random(f"hostile-{settings.seed}")
        self._jitter_rng = random.Random(f"jitter-{settings.seed}")

    def draw(self, ticket: int, weight: int, in_flight: int, waves: int) -> Admission:
        """The fate of request ``ticket`` of ``weight`` sequences, arriving with ``in_flight``
        in flight (itself included), decoded in ``waves`` rounds of the slots."""
        s = self.settings
        # Always draw all five, in this order, so a run's fault sequence depends only on seed.
        overload, fail, reset, truncate, slow = (self._rng.random() for _ in range(5))
        echo, bad, shape = (self._hostile_rng.random() for _ in range(3))
        outcome: Outcome = "ok"
        if s.oom_at is not None and in_flight > s.oom_at:
            outcome = "oom"
        elif overload < s.overload_rate:
            outcome = "overload"
        elif fail < s.fail_rate:
            outcome = "fail"
        elif reset < s.reset_rate:
            outcome = "reset"
        drifted = s.slow_after is not None and ticket > s.slow_after
        slower = s.slow_after_factor if drifted else 1.0  # every request after N
        per_token = s.per_token_s * slower
        if s.slow_above is not None and in_flight > s.slow_above:
            per_token *= s.slow_factor
        ttft_jitter = per_token_jitter = 1.0
        if s.jitter:
            ttft_jitter, per_token_jitter = (
                self._jitter_rng.uniform(1 - s.jitter, 1 + s.jitter) for _ in range(2)
            )
        return Admission(
            ticket=ticket,
            weight=weight,
            in_flight=in_flight,
            outcome=outcome,
            ttft_s=s.ttft_s * ttft_jitter * slower + (slow < s.slow_rate) * s.slow_s,
            per_token_s=per_token * per_token_jitter * waves,
            truncate=truncate < s.truncate_rate,
            malformed=SHAPES[int(shape * len(SHAPES))] if bad < s.malformed_rate else None,
            echo_headers=echo < s.echo_headers_rate,
        )
