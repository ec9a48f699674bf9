"""The stop rules are pure functions: every verdict, next_tier, stopped_by and the knee."""

from __future__ import annotations

from dataclasses import replace

from calibrate.stages.stop_rules import (
    Point,
    gains,
    knee,
    last_passing,
    mismatch_notes,
    next_tier,
    stopped_by,
    tier_verdict,
)
from calibrate.stages.tiers import Stats, Tier, percentile

CLEAN = Stats(
    batch_size=2, concurrency=1, round=None, items=4, total_s=1.0, per_item_mean_s=0.2,
    per_item_p50_s=0.2, per_item_p90_s=0.2, per_item_p99_s=0.2, per_item_max_s=0.2,
    ttft_p50_s=None, items_per_s=4.0, output_tokens_per_s=100.0, peak_vram_mib=1000.0,
    vram_idle_mib=900.0, vram_total_mib=2000.0, pressure=0.5, pressure_source="nvml",
    peak_kv_usage=None, errors=0, error_kinds={}, first_done_s=0.2, last_done_s=0.2,
    baseline_match=4, baseline_items=4,
)  # fmt: skip
PREV = replace(CLEAN, batch_size=1, per_item_mean_s=0.1)
LIMITS = {"vram_limit": 0.9, "latency_rise": 1.5}


def _tier(batch: int, verdict: str, **kw: object) -> Tier:
    stats = replace(CLEAN, batch_size=batch, **kw)  # type: ignore[arg-type]
    return Tier(stats, (stats,), verdict, "", 2)  # type: ignore[arg-type]


def test_errors_fail_first_and_name_kinds() -> None:
    stats = replace(CLEAN, batch_size=8, errors=2, error_kinds={"oom": 2}, pressure=0.99)
    verdict, reason = tier_verdict(stats, PREV, rounds_run=1, rounds_planned=2, **LIMITS)
    assert verdict == "fail"
    assert reason == "batch 8: 2 of 4 requests failed (oom×2) in round 1"


def test_vram_limit_reached_stops_before_latency() -> None:
    stats = replace(CLEAN, pressure=0.9, per_item_mean_s=1.0)
    verdict, reason = tier_verdict(stats, PREV, **LIMITS)
    assert verdict == "stop: vram" and "90%" in reason and "nvml" in reason
    below = tier_verdict(replace(CLEAN, pressure=0.89, per_item_mean_s=0.15), PREV, **LIMITS)
    assert below[0] == "pass"


def test_vram_not_measured_skips_the_vram_rule() -> None:
    assert (
        tier_verdict(replace(CLEAN, pressure=None, per_item_mean_s=0.12), PREV, **LIMITS)[0]
        == "pass"
    )


def test_latency_rise_beyond_the_factor_stops() -> None:
    verdict, reason = tier_verdict(CLEAN, PREV, **LIMITS)  # 0.2 / 0.1 = 2.0 > 1.5
    assert verdict == "stop: latency" and "2.00×" in reason and "batch 1" in reason
    at_limit = replace(CLEAN, per_item_mean_s=0.15)  # exactly 1.5×: not more than
    assert tier_verdict(at_limit, PREV, **LIMITS)[0] == "pass"
    assert (
        tier_verdict(CLEAN, None, **LIMITS)[0] == "pass"
    )  # the first tier has nothing to rise from


def test_next_tier_and_stopped_by() -> None:
    sizes = (1, 2, 4, 8)
    assert next_tier([], sizes) == 1
    assert next_tier([_tier(1, "pass")], sizes) == 2
    assert next_tier([_tier(1, "pass"), _tier(2, "stop: vram")], sizes) is None
    assert next_tier([_tier(1, "fail")], sizes) is None
    done = [_tier(b, "pass") for b in sizes]
    assert next_tier(done, sizes) is None and stopped_by(done, sizes) == "completed"
    assert stopped_by([_tier(1, "pass"), _tier(2, "fail")], sizes) == "failure"
    assert stopped_by([_tier(1, "stop: vram")], sizes) == "vram"
    assert stopped_by([_tier(1, "pass"), _tier(2, "stop: latency")], sizes) == "latency"
    assert stopped_by([_tier(1, "pass")], sizes) == "interrupted"


def test_last_passing_counts_flagged_tiers() -> None:
    assert last_passing([_tier(1, "pass"), _tier(2, "stop: latency")]) is not None
    assert last_passing([_tier(1, "pass"), _tier(2, "fail")]).batch_size == 1  # type: ignore[union-attr]
    assert last_passing([_tier(1, "fail")]) is None


def test_mismatch_notes_only_for_passing_tiers_that_differ() -> None:
    history = [_tier(1, "pass"), _tier(4, "pass", baseline_match=3, baseline_items=8),
               _tier(8, "fail", baseline_match=1, baseline_items=8)]  # fmt: skip
    assert mismatch_notes(history) == [
        "outputs differ from the single-call baseline at batch 4 (3/8): "
        "this server is not batch-invariant"
    ]


def test_knee_is_the_end_of_the_rising_run() -> None:
    rising = [Point(1, 10, 0), Point(2, 19, 0), Point(4, 36, 0), Point(8, 37, 0), Point(16, 45, 0)]
    assert knee(rising, 0.10) == Point(4, 36, 0)
    assert gains(rising)[:3] == [None, 0.8999999999999999, 36 / 19 - 1]
    errors = [Point(1, 10, 0), Point(2, 19, 0), Point(4, 36, 3)]
    assert knee(errors, 0.10) == Point(2, 19, 0)
    assert knee([Point(1, 10, 1)], 0.10) is None
    assert knee([Point(1, 10, 0), Point(2, 10.9, 0)], 0.10) == Point(1, 10, 0)  # +9 % < 10 %
    assert knee([Point(1, 10, 0), Point(2, 11.0, 0)], 0.10) == Point(2, 11.0, 0)


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
