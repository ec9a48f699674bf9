"""The knee over the default levels 1…16 on the simulated 4-slot server (a virtual clock): the
ratio half of what tests/test_sweep.py's test_a_synthetic_workloads_levels_say_their_gain_and_
the_knee once judged over HTTP (and failed on a loaded machine), with no machine noise.
The knee against the best so far when one level is noisy is test_fast.py's
test_one_noisy_level_does_not_hide_a_later_gain; the cap holding the knee, test_verdicts.py's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from calibrate.config import Config, SweepConfig
from calibrate.gpu.vram import VramMonitor
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.sweep.run import Sweep
from calibrate.stages.sweep.spec import SweepOptions
from tests.stage_fakes import SimulatedLoop, close_runs, recorder, stage_ctx
from tests.tier_helpers import jsonl

__all__ = ["close_runs"]  # the autouse fixture, used by being imported


def test_one_to_sixteen_on_four_slots_knee_four_judged_against_the_best(tmp_path: Path) -> None:
    """SPEC §5.6: 1, 2, 4, 8, 16 in flight on 4 slots of 0.12 s a request (20 tokens at 5 ms
    and a 20 ms first token, the HTTP test's): 8.3, 16.7, 33.3 items/s, then 33.3 twice. 2 and
    4 each count a gain over the best before them, 8 and 16 none: the knee is the slot count,
    sure after the two runs a level, recommended; with the server's cap of 4 known, 8 and 16
    are noted as queueing in the server."""
    cfg = Config(sweep=replace(SweepConfig(), concurrency=(1, 2, 4, 8, 16), level_s=0.4))
    ctx = stage_ctx(tmp_path, cfg, "sweep")
    monitor = VramMonitor([])
    options = replace(SweepOptions.from_config(cfg, 4), repeats=2)
    loop = SimulatedLoop(lambda concurrency, repeat: 0.12, slots=4)
    cap = ServerCap(4, "llama.cpp /props total_slots")
    result = Sweep(ctx, options, monitor, recorder(ctx, monitor, tmp_path), loop, cap).run()
    speeds = [round(lv.stats.items_per_s, 3) for lv in result.levels]
    assert speeds == [8.333, 16.667, 33.333, 33.333, 33.333]
    assert [lv.counted for lv in result.levels] == [False, True, True, False, False]
    assert result.knee is not None and result.knee.concurrency == 4
    assert result.knee_text.startswith("knee at 4 (+100 % over 2") and result.knee_text.endswith(
        "— sure"
    )
    assert "8, 16 exceeds the server's own cap of 4" in result.knee_text
    assert result.passed and not result.inconclusive
    assert result.summary(options).recommended_concurrency == 4
    assert all(len(lv.runs) == 2 for lv in result.levels), "two runs settle every level"
    assert all(
        lv.items_per_s_min <= lv.stats.items_per_s <= lv.items_per_s_max for lv in result.levels
    )
    runs = jsonl(ctx.run.path / "rounds.jsonl")
    assert len(runs) == 10 and all(r["steady_completions"] > 0 for r in runs)
