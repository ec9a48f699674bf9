"""The sweep's knee under server jitter, on the simulated server and a virtual clock: the ratio
half of tests/test_windows_http.py's jitter test, with no machine noise to make it flaky."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from calibrate.config import Config, SweepConfig
from calibrate.gpu.vram import VramMonitor
from calibrate.load.sender import Sender
from calibrate.load.sim.clock import VirtualClock
from calibrate.load.sim.server import SimServer
from calibrate.mock import MockSettings
from calibrate.stages.sweep.run import Sweep
from calibrate.stages.sweep.spec import SweepOptions
from tests.stage_fakes import close_runs, recorder, stage_ctx

__all__ = ["close_runs"]  # the autouse fixture, used by being imported


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_with_jitter_and_three_runs_a_level_the_knee_is_4_or_inconclusive(
    tmp_path: Path, seed: int
) -> None:
    """A 4-slot server with ±20 % timing jitter (the HTTP test's, ~150 ms a request), levels 2,
    4, 8 at three runs a level beyond a ladder that proved 8: 8 in flight add only queueing, so
    the knee is 4, or the sweep is inconclusive naming the pair — never a confident other knee
    (SPEC §5.14); every level's median lies within its runs' range."""
    cfg = Config(sweep=replace(SweepConfig(), concurrency=(2, 4, 8), level_s=0.1, repeats=3))
    ctx = stage_ctx(tmp_path, cfg, "sweep")
    monitor = VramMonitor([])
    clock = VirtualClock()
    settings = MockSettings(
        slots=4, ttft_s=0.004, per_token_s=0.003, jitter=0.2, seed=seed, any_model=True
    )
    sender = Sender(SimServer(settings, clock), clock)
    options = SweepOptions.from_config(cfg, 8)
    result = Sweep(ctx, options, monitor, recorder(ctx, monitor, tmp_path), sender).run()
    if result.inconclusive:
        assert result.inconclusive.startswith("inconclusive: the runs cannot tell")
        assert result.knee is None
    else:
        assert result.knee is not None and result.knee.concurrency == 4, result.reason
    assert all(len(lv.runs) >= 3 for lv in result.levels)
    assert all(
        lv.items_per_s_min <= lv.stats.items_per_s <= lv.items_per_s_max for lv in result.levels
    )
