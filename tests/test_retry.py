"""Retry policy: which kinds are retried, backoff with jitter, Retry-After, interruption."""

from __future__ import annotations

import random

import pytest

from calibrate.errors import ErrorInfo, RequestError
from calibrate.load.retry import RetryPolicy, with_retries


class FakeWait:
    """Records the waits instead of sleeping; can pretend Ctrl-C arrived at wait number N."""

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.waits: list[float] = []
        self.interrupt_at = interrupt_at

    def __call__(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return self.interrupt_at is not None and len(self.waits) >= self.interrupt_at


def failing(*infos: ErrorInfo, then: str = "done"):
    """A call that raises each error in turn, then returns ``then``."""
    pending = list(infos)
    calls = []

    def call() -> str:
        calls.append(1)
        if pending:
            raise RequestError(pending.pop(0))
        return then

    call.calls = calls  # type: ignore[attr-defined]
    return call


RESET = ErrorInfo("reset", "dropped")
OOM = ErrorInfo("oom", "HTTP 500: CUDA out of memory", 500)


def test_backoff_doubles_with_bounded_jitter() -> None:
    policy = RetryPolicy(retries=5, base_s=1.0, jitter=0.25)
    rng = random.Random(1)
    for attempt, base in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0)):
        delays = [policy.delay_s(attempt, None, rng) for _ in range(200)]
        assert min(delays) >= base and max(delays) <= base * 1.25
        assert max(delays) - min(delays) > base * 0.1  # really jittered, not constant


def test_retry_after_is_a_floor_and_backoff_is_capped() -> None:
    policy = RetryPolicy(base_s=0.01, cap_s=2.0, jitter=0.0)
    rng = random.Random(0)
    assert policy.delay_s(1, 3.0, rng) == 3.0
    assert policy.delay_s(20, None, rng) == 2.0
    assert policy.delay_s(20, 1.0, rng) == 2.0
    assert policy.delay_s(1, 10_000.0, rng) == 300.0


@pytest.mark.parametrize(
    ("kind", "status", "retried"),
    [
        ("connect", None, True),
        ("reset", None, True),
        ("timeout", None, True),
        ("overloaded", 429, True),
        ("http_5xx", 502, True),
        ("oom", 500, False),
        ("http_4xx", 400, False),
        ("invalid_response", 200, False),
        ("incomplete", None, False),
    ],
)
def test_only_transient_kinds_are_retried(kind: str, status: int | None, retried: bool) -> None:
    info = ErrorInfo(kind, "x", status)  # type: ignore[arg-type]
    wait = FakeWait()
    result = with_retries(failing(info), RetryPolicy(retries=3), wait=wait, rng=random.Random(0))
    assert (result.value == "done") is retried
    assert result.attempts == (2 if retried else 1)
    assert len(wait.waits) == (1 if retried else 0)


def test_gives_up_after_retries_and_reports_each_attempt() -> None:
    wait = FakeWait()
    call = failing(RESET, RESET, RESET, RESET, RESET)
    result = with_retries(call, RetryPolicy(retries=3, jitter=0.0), wait=wait, rng=random.Random(0))
    assert result.value is None and result.error == RESET
    assert result.attempts == 4 and len(call.calls) == 4  # type: ignore[attr-defined]
    assert wait.waits == [1.0, 2.0, 4.0]
    assert result.errors == ("reset",) * 4


def test_retry_after_from_the_server_is_honoured() -> None:
    busy = ErrorInfo("overloaded", "HTTP 429", 429, retry_after_s=7.0)
    wait = FakeWait()
    result = with_retries(failing(busy), RetryPolicy(base_s=0.5), wait=wait, rng=random.Random(0))
    assert result.value == "done" and result.attempts == 2 and result.errors == ("overloaded",)
    assert wait.waits == [7.0]


def test_interrupted_while_waiting_is_not_a_result() -> None:
    wait = FakeWait(interrupt_at=1)
    call = failing(RESET, RESET)
    result = with_retries(call, RetryPolicy(retries=3), wait=wait, rng=random.Random(0))
    assert result.interrupted and result.value is None
    assert len(call.calls) == 1  # type: ignore[attr-defined]


def test_retries_zero_means_one_attempt() -> None:
    result = with_retries(
        failing(RESET), RetryPolicy(retries=0), wait=FakeWait(), rng=random.Random()
    )
    assert result.attempts == 1 and result.error == RESET
