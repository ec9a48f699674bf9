"""Stalls at a keep-alive timeout, named with the cause and the flag (SPEC §5.8)."""

from __future__ import annotations

import random

from calibrate.load.keepalive_stall import find_stall


def _body(n: int, median_s: float, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [median_s * rng.uniform(0.7, 1.4) for _ in range(n)]


def test_answers_at_five_seconds_beside_a_tenth_of_a_second_median_are_a_stall() -> None:
    """The issue's shape: 16 keep-alive clients against --parallel 4, most answers ≈0.1 s, a few
    waiting out the 5 s keep-alive timeout first (max 6.3 s)."""
    latencies = [*_body(370, 0.1), 5.08, 5.12, 5.2, 6.3, 5.1]
    stall = find_stall(latencies)
    assert stall is not None and stall.count == 5 and stall.requests == 375
    assert 5.0 < stall.typical_s < 5.3 and 0.09 < stall.median_s < 0.13
    text = stall.text(16, "llama.cpp", "--threads-http")
    assert text.startswith("concurrency 16: 5 of 375 requests took ≈5.1 s while the median was")
    assert "stalls of ≈5 s: llama.cpp's HTTP threads are held by kept-alive connections" in text
    assert text.endswith("start it with --threads-http 18")
    other = stall.text(8)
    assert "a keep-alive timeout" in other and "--threads-http 10" in other


def test_a_long_tail_load_and_one_slow_answer_are_not_stalls() -> None:
    assert find_stall([*_body(300, 0.1), 5.1]) is None, "one is not a pattern"
    tail = [*_body(300, 0.1), 2.6, 3.0, 3.5, 4.0, 4.2, 4.4, 5.0, 5.2]  # load: a spread-out tail
    assert find_stall(tail) is None
    assert find_stall([*_body(300, 2.0), 5.0, 5.1, 5.2]) is None, "the median is near the timeout"
    assert find_stall(_body(300, 0.1)) is None
    assert find_stall([]) is None
    far = [*_body(300, 0.1), 9.0, 9.5, 10.0]  # slow, but not at the timeout
    assert find_stall(far) is None


def test_a_stall_at_another_timeout() -> None:
    stall = find_stall([*_body(200, 0.2), 10.1, 10.3, 10.2], timeout_s=10.0)
    assert (
        stall is not None
        and stall.count == 3
        and "≈10 s" in stall.text(4, "llama.cpp", "--threads-http")
    )
