"""Retrying transient request failures: exponential backoff with jitter, honouring Retry-After.

Only the kinds SPEC §5.5 calls transient are retried (connect, reset, timeout, overloaded, 5xx
that is not OOM); everything else is an answer about the item or the server and is returned at
once. Waiting goes through a ``Wait`` seam so tests need not sleep and Ctrl-C ends a backoff.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from calibrate.errors import ErrorInfo, RequestError

T = TypeVar("T")

# wait(seconds) -> True when interrupted (threading.Event.wait has exactly this shape)
Wait = Callable[[float], bool]

MAX_RETRY_AFTER_S = 300.0  # a server asking for more than this is treated as asking for this


@dataclass(frozen=True)
class RetryPolicy:
    """Up to ``retries`` further attempts, waiting base·2ⁿ (1, 2, 4 s…) plus up to ``jitter``·that."""

    retries: int = 3
    base_s: float = 1.0
    cap_s: float = 60.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if self.retries < 0 or self.base_s < 0 or self.cap_s < 0 or self.jitter < 0:
            raise ValueError("retries, base_s, cap_s and jitter must be ≥ 0")

    def should_retry(self, info: ErrorInfo, attempts: int) -> bool:
        """Whether to try again after ``attempts`` attempts that ended with ``info``."""
        return info.transient and attempts <= self.retries

    def delay_s(self, attempt: int, retry_after_s: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based).

        Jitter spreads the retries of many workers that failed together, so they do not hit a
        recovering server at the same instant; a server's Retry-After is a floor, never cut.
        """
        backoff = min(self.cap_s, self.base_s * 2.0 ** (attempt - 1))
        backoff += rng.uniform(0.0, backoff * self.jitter)
        if retry_after_s is not None:
            return max(backoff, min(retry_after_s, MAX_RETRY_AFTER_S))
        return backoff


@dataclass(frozen=True)
class Attempted(Generic[T]):
    """The outcome of a call with retries: a value or the last error, and how many attempts."""

    value: T | None
    error: ErrorInfo | None
    attempts: int
    interrupted: bool = False  # stopped while waiting to retry: the item is not finished
    errors: tuple[str, ...] = ()  # kinds of the failed attempts, in order


def with_retries(
    call: Callable[[], T], policy: RetryPolicy, *, wait: Wait, rng: random.Random
) -> Attempted[T]:
    """Call until it succeeds, fails with a fatal kind, runs out of retries or is interrupted."""
    attempts = 0
    kinds: list[str] = []
    while True:
        attempts += 1
        try:
            return Attempted(call(), None, attempts, errors=tuple(kinds))
        except RequestError as exc:
            info = exc.info
        kinds.append(info.kind)
        if not policy.should_retry(info, attempts):
            return Attempted(None, info, attempts, errors=tuple(kinds))
        if wait(policy.delay_s(attempts, info.retry_after_s, rng)):
            return Attempted(None, info, attempts, interrupted=True, errors=tuple(kinds))
