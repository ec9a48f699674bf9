"""The stop rules are pure functions: every verdict, next_tier and stopped_by (the knee: tests/stages/sweep/test_knee.py)."""

from __future__ import annotations

from dataclasses import replace

from calibrate.config import LadderConfig, SloConfig
from calibrate.load.items import percentile
from calibrate.stages.measure.stop_rules import (
    last_passing,
    mismatch_notes,
    next_tier,
    stopped_by,
    tier_verdict,
)
from calibrate.stages.measure.tier import Tier
from tests.stage_fakes import CLEAN

PREV = replace(CLEAN, batch_size=1, per_item_s=0.1)
LIMITS = {"vram_limit": 0.9, "latency_rise": 1.5}
DEFAULT_RISE = LadderConfig().latency_rise


def _tier(batch: int, verdict: str, **kw: object) -> Tier:
    stats = replace(CLEAN, batch_size=batch, **kw)  # type: ignore[arg-type]
    return Tier(stats, (stats,), verdict, "", 2)  # type: ignore[arg-type]


def test_errors_fail_first_and_name_kinds() -> None:
    stats = replace(CLEAN, batch_size=8, errors=2, error_kinds={"oom": 2}, pressure=0.99)
    verdict, reason = tier_verdict(stats, PREV, rounds_run=1, rounds_planned=2, **LIMITS)
    assert verdict == "fail"
    assert reason == "batch 8: 2 of 4 requests failed (oom×2) in round 1"


def test_vram_limit_reached_stops_before_latency() -> None:
    stats = replace(CLEAN, pressure=0.9, per_item_s=1.0)
    verdict, reason = tier_verdict(stats, PREV, **LIMITS)
    assert verdict == "stop: vram" and "90%" in reason and "nvml" in reason
    below = tier_verdict(replace(CLEAN, pressure=0.89, per_item_s=0.15), PREV, **LIMITS)
    assert below[0] == "pass"


def test_vram_not_measured_skips_the_vram_rule() -> None:
    assert tier_verdict(replace(CLEAN, pressure=None, per_item_s=0.12), PREV, **LIMITS)[0] == "pass"


def test_latency_rise_beyond_the_factor_stops() -> None:
    verdict, reason = tier_verdict(CLEAN, PREV, **LIMITS)  # 0.2 / 0.1 = 2.0 > 1.5
    assert verdict == "stop: latency"
    assert reason.startswith("batch 2: 0.2 s per item is 2.00× batch 1's 0.1 s (limit 1.5×)")
    at_limit = replace(CLEAN, per_item_s=0.15)  # exactly 1.5×: not more than
    assert tier_verdict(at_limit, PREV, **LIMITS)[0] == "pass"
    assert (
        tier_verdict(CLEAN, None, **LIMITS)[0] == "pass"
    )  # the first tier has nothing to rise from


def test_the_latency_rule_at_its_default_is_about_time_per_item() -> None:
    """1.25 is the default; a tier at exactly 1.25× passes, just above stops and says why."""
    assert DEFAULT_RISE == 1.25
    limits = {"vram_limit": 0.9, "latency_rise": DEFAULT_RISE}
    prev = replace(PREV, per_item_s=0.25, batch_size=4)
    at = replace(CLEAN, batch_size=8, per_item_s=0.25 * 1.25)
    assert tier_verdict(at, prev, **limits)[0] == "pass"
    over = replace(CLEAN, batch_size=8, per_item_s=0.41)
    verdict, reason = tier_verdict(over, prev, **limits)
    assert verdict == "stop: latency"
    assert "batch 8: 0.41 s per item is 1.64× batch 4's 0.25 s (limit 1.25×)" in reason
    # request latency tripled, but each item got cheaper: batching works, no stop
    batched = replace(CLEAN, batch_size=8, per_item_s=0.2, latency_mean_s=3.0, latency_p99_s=3.0)
    assert tier_verdict(batched, replace(prev, latency_mean_s=1.0), **limits)[0] == "pass"


def test_an_slo_breach_stops_and_is_not_kept() -> None:
    slo = SloConfig(ttft_p99_s=0.5, e2e_p99_s=2.0)
    limits = {"vram_limit": 0.9, "latency_rise": DEFAULT_RISE}
    slow_first_token = replace(CLEAN, batch_size=8, ttft_p99_s=0.6, pressure=0.95)
    verdict, reason = tier_verdict(slow_first_token, PREV, slo=slo, **limits)
    assert verdict == "stop: slo", "an SLO breach outranks the verdicts that keep their tier"
    assert "TTFT p99 0.6 s is over the SLO 0.5 s" in reason and "not kept" in reason
    at_bound = replace(CLEAN, ttft_p99_s=0.5, latency_p99_s=2.0, per_item_s=0.1)
    assert tier_verdict(at_bound, PREV, slo=slo, **limits)[0] == "pass"
    # not streamed: the tier cannot show the TTFT SLO met, so it is not (as for each request)
    not_measured = replace(CLEAN, ttft_p99_s=None, per_item_s=0.1)
    verdict, reason = tier_verdict(not_measured, PREV, slo=slo, **limits)
    assert verdict == "stop: slo" and "TTFT p99 not measured" in reason
    assert tier_verdict(replace(CLEAN, latency_p99_s=9.0), None, slo=SloConfig(), **limits)[0] == (
        "pass"
    ), "no SLO set: off"
    history = [_tier(1, "pass"), _tier(2, "pass"), _tier(4, "stop: slo")]
    assert stopped_by(history, (1, 2, 4, 8)) == "slo"
    assert last_passing(history).batch_size == 2  # type: ignore[union-attr]
    assert next_tier(history, (1, 2, 4, 8)) is None


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
    history = [
        _tier(1, "pass"),
        _tier(4, "pass", baseline_match=3, baseline_items=8),
        _tier(8, "fail", baseline_match=1, baseline_items=8),
    ]
    assert mismatch_notes(history) == [
        "outputs differ from the single-call baseline at batch 4: 3 of 8 outputs match the "
        "baseline, 5 differ: this server is not batch-invariant"
    ]


def test_percentile_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
