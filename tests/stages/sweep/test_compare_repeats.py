"""Two sweeps compared (``report A B``, SPEC §5.10) over their repeats, the runs from the
simulated server on a virtual clock: a server 3× slower is significantly slower at every level
— the claim that over real HTTP a stalled round on a busy machine could hide."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from calibrate.config import Config, SweepConfig
from calibrate.gpu.vram import VramMonitor
from calibrate.io.tier_table import write_tiers_csv
from calibrate.stages.sweep.run import Sweep
from calibrate.stages.sweep.spec import SweepOptions
from tests.stage_fakes import close_runs, recorder, simulated_sender, stage_ctx

__all__ = ["close_runs"]  # the autouse fixture, used by being imported

REPEATS = 4


def _sweep(root: Path, seed: int, ttft_s: float, per_token_s: float) -> str:
    """Concurrency 1 and 2, four repeats of ≥ 0.3 s (and 4×C requests) each, answers of 8
    tokens, every time jittered by ±10 % from ``seed``; the run folder's path."""
    settings = {"concurrency": (1, 2), "level_s": 0.3, "repeats": REPEATS, "max_repeats": REPEATS}
    cfg = Config(sweep=replace(SweepConfig(), **settings))  # type: ignore[arg-type]
    ctx = stage_ctx(root, cfg, "sweep")
    monitor = VramMonitor([])
    sender = simulated_sender(
        ttft_s=ttft_s, per_token_s=per_token_s, answer_tokens=8, jitter=0.1, seed=seed
    )
    options = SweepOptions.from_config(cfg, 4, stream=True)
    result = Sweep(ctx, options, monitor, recorder(ctx, monitor, root), sender).run()
    assert result.passed and [len(lv.runs) for lv in result.levels] == [REPEATS, REPEATS]
    rows = [lv.row() for lv in result.levels]
    write_tiers_csv(ctx.run.file("tiers.csv"), rows, "sweep", result.vram_source)  # its finish
    return str(ctx.run.path)


def test_a_sweep_against_a_slower_server_is_significantly_slower_over_its_repeats(
    cli: Any, isolated: Path
) -> None:
    """A request to the slow server takes 3× as long (0.15 s against 0.05 s): over four
    repeats a level, the drop is significant at both levels, and `report` of one run gives
    each level's interval over its four runs."""
    fast = _sweep(isolated, 1, 0.01, 0.005)
    slower = _sweep(isolated, 2, 0.03, 0.015)
    one = cli("report", fast, "--json", "--no-plot")
    assert one.code == 0, one.err
    levels = {t["key"]: t["metrics"] for t in one.json["confidence"]["tiers"]}
    assert set(levels) == {1, 2} and all(m["items_per_s"]["n"] == REPEATS for m in levels.values())
    result = cli("report", fast, slower, "--json")
    assert result.code == 0, result.err
    assert result.json["key"] == "concurrency"
    assert [row["key"] for row in result.json["rows"]] == [1, 2]
    for row in result.json["rows"]:
        delta = row["deltas"]["items_per_s"]
        assert delta["rounds_a"]["n"] == delta["rounds_b"]["n"] == REPEATS
        assert delta["significant"] is True and delta["better"] is False, (row["key"], delta)
        assert delta["change"] < -0.5, "a third of the throughput"
