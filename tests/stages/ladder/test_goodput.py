"""Goodput over a ladder's tiers on the simulated server and a virtual clock: the exact counts
of tests/test_goodput.py's HTTP test, with no machine noise to move a request past an SLO."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from calibrate.config import Config, LadderConfig, SloConfig
from calibrate.gpu.vram import VramMonitor
from calibrate.load.sender import Sender
from calibrate.load.sim.clock import VirtualClock
from calibrate.load.sim.server import SimServer
from calibrate.mock import MockSettings
from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.ladder.run import Ladder
from tests.stage_fakes import close_runs, recorder, stage_ctx
from tests.tier_helpers import jsonl

__all__ = ["close_runs"]  # the autouse fixture, used by being imported


def test_queueing_makes_exactly_half_a_wave_miss_and_goodput_is_half_the_items(
    tmp_path: Path,
) -> None:
    """2 slots, ~0.2 s a request: at batch 4 two of each wave wait for a slot (TTFT ≈ 0.2 s,
    E2E ≈ 0.4 s), over ttft 0.08 s and e2e 0.3 s — exactly half of tier 4 is goodput, and it
    stops there (stop: slo); tiers 1 and 2 are all goodput. Goodput is over the window items/s
    uses (the tier's total_s), per round and per tier."""
    cfg = Config(
        ladder=replace(
            LadderConfig(),
            batch_sizes=(1, 2, 4),
            min_round_s=0.0,
            warmup_waves=0,
            latency_rise=100.0,
        ),
        slo=SloConfig(ttft_p99_s=0.08, e2e_p99_s=0.3),
    )
    ctx = stage_ctx(tmp_path, cfg, "ladder")
    monitor = VramMonitor([])
    clock = VirtualClock()
    settings = MockSettings(slots=2, ttft_s=0.01, per_token_s=0.004, any_model=True)
    sender = Sender(SimServer(settings, clock), clock)
    options = LadderOptions.from_config(cfg)
    result = Ladder(ctx, options, monitor, recorder(ctx, monitor, tmp_path), sender).run()
    assert [t.verdict for t in result.tiers] == ["pass", "pass", "stop: slo"]
    assert [(t.stats.slo_met, t.stats.items) for t in result.tiers] == [(2, 2), (4, 4), (4, 8)]
    one, two, four = (t.stats for t in result.tiers)
    assert one.goodput_per_s == one.items_per_s and two.goodput_per_s == two.items_per_s
    assert four.goodput_per_s == pytest.approx(four.items_per_s / 2, rel=1e-9)
    for tier in result.tiers:
        s = tier.stats
        assert s.goodput_per_s == pytest.approx((s.slo_met or 0) / s.total_s, rel=1e-9)
    rounds = jsonl(ctx.run.path / "rounds.jsonl")
    assert [r["slo_met"] for r in rounds] == [1, 1, 2, 2, 2, 2]
    assert result.setting is not None and result.setting.batch_size == 2
