"""One request decoding step by step against the shared KV ledger: when each step is reached.

Used when the mock tracks tokens: the step time then depends on what the whole batch holds at
that moment (``MockModel.step_s``), so it cannot be fixed at arrival. Steps advance in ticks of
at least ``MIN_TICK_S`` (several tokens per tick when tokens are fast) on a virtual clock that
never drifts: a late wake-up is caught up on the next tick, as the fixed-timing path does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from calibrate.mock.model import Admission

MIN_TICK_S = 0.002


class Stepper(Protocol):
    def step_s(self, adm: Admission) -> float: ...

    def grow(self, adm: Admission, step: int) -> bool: ...


class DecodeRun:
    """The decode of one admitted request whose first token is due at ``first_token_at``."""

    def __init__(
        self,
        model: Stepper,
        adm: Admission,
        first_token_at: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._model = model
        self._adm = adm
        self._at = first_token_at
        self._clock = clock
        self._sleep = sleep
        self.step = 0

    def wait_step(self, step: int) -> bool:
        """Block until decode ``step`` is done; False when the KV ran out on the way (OOM)."""
        while self.step < step:
            left = step - self.step
            per_step = self._model.step_s(self._adm)
            ticks = left if per_step <= 0 else max(1, min(left, int(MIN_TICK_S / per_step)))
            self._at += ticks * per_step
            self._sleep_until(self._at)
            self.step += ticks
            if not self._model.grow(self._adm, self.step):
                return False
        self._sleep_until(self._at)
        return True

    def _sleep_until(self, deadline: float) -> None:
        delay = deadline - self._clock()
        if delay > 0:
            self._sleep(delay)
