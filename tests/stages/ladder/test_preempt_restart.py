"""The ladder's preemption count across a server restart mid-tier: the counter of a new
process starts again from 0, so a fall is a restart, never a rise of 0 (it hid what the new
process preempted) nor a negative one; and a restart alone invents none."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from calibrate.config import Config, LadderConfig
from calibrate.gpu.engine_metrics import Gauge, counted_rise
from calibrate.gpu.vram import VramMonitor
from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.ladder.run import Ladder
from tests.stage_fakes import ScriptedSender, close_runs, recorder, stage_ctx

__all__ = ["close_runs"]  # the autouse fixture, used by being imported

METRIC = "vllm:num_preemptions_total"


def _ladder(tmp_path: Path, after_restart: float) -> Ladder:
    """Batch 1 then 2 on a server whose counter reads 10 until, during batch 2's first round,
    it restarts and its new process's counter reads ``after_restart``."""
    settings = {"min_round_s": 0.0, "warmup_waves": 0, "batch_sizes": (1, 2)}
    cfg = Config(ladder=replace(LadderConfig(), **settings))  # type: ignore[arg-type]
    ctx = stage_ctx(tmp_path, cfg, "ladder")
    monitor = VramMonitor([])
    ladder = Ladder(
        ctx,
        LadderOptions.from_config(cfg),
        monitor,
        recorder(ctx, monitor, tmp_path),
        ScriptedSender(lambda batch, n: (0.1 * batch, 0.1 * batch, None)),
    )
    reads_in_tier_2: list[float] = []

    def counter() -> Gauge:
        if not ladder.history:
            return Gauge(METRIC, 10.0)
        value = 10.0 if not reads_in_tier_2 else after_restart
        reads_in_tier_2.append(value)
        return Gauge(METRIC, value)

    ladder.preemptions = counter
    return ladder


def test_preemptions_after_a_restart_mid_tier_are_counted(tmp_path: Path) -> None:
    result = _ladder(tmp_path, after_restart=3.0).run()
    assert [t.verdict for t in result.tiers] == ["pass", "stop: preempt"]
    assert result.tiers[1].stats.preemptions == 3
    assert f"({METRIC} +3)" in result.tiers[1].reason


def test_a_restart_mid_tier_alone_invents_no_preemption(tmp_path: Path) -> None:
    result = _ladder(tmp_path, after_restart=0.0).run()
    assert [t.verdict for t in result.tiers] == ["pass", "pass"]
    assert [t.stats.preemptions for t in result.tiers] == [0, 0]


def test_a_counter_rise_over_readings_spans_restarts_and_failed_scrapes() -> None:
    def g(value: float) -> Gauge:
        return Gauge(METRIC, value)

    assert counted_rise([g(10), g(12), g(2), None, g(5)]) == g(2 + 2 + 3)
    assert counted_rise([g(10), g(10)]) == g(0)
    assert counted_rise([None, g(4)]) is None
