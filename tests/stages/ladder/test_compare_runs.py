"""Two ladders compared (``report A B``, SPEC §5.10) where the runs come from the simulated
server on a virtual clock: the same server twice differs by nothing significant, a server twice
as slow per token does — the A/A claim that over real HTTP needed the machine to itself."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from calibrate.config import Config, LadderConfig
from calibrate.gpu.vram import VramMonitor
from calibrate.io.tier_table import write_tiers_csv
from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.ladder.run import Ladder
from tests.report_helpers import Page
from tests.stage_fakes import close_runs, recorder, simulated_sender, stage_ctx

__all__ = ["close_runs"]  # the autouse fixture, used by being imported

# 5 rounds of ≥ 0.2 s per tier after a warm-up wave, answers of 8 tokens (as the HTTP test had)
ROUNDS = {"min_round_s": 0.2, "warmup_waves": 1, "latency_rise": 100.0, "rounds": 5}


def _ladder(root: Path, seed: int, ttft_s: float, per_token_s: float) -> str:
    """A ladder of batch 1 and 2 against a simulated server whose every time jitters by ±10 %
    (drawn from ``seed``); the run folder's path."""
    cfg = Config(ladder=replace(LadderConfig(), batch_sizes=(1, 2), **ROUNDS))  # type: ignore[arg-type]
    ctx = stage_ctx(root, cfg, "ladder")
    monitor = VramMonitor([])
    sender = simulated_sender(
        ttft_s=ttft_s, per_token_s=per_token_s, answer_tokens=8, jitter=0.1, seed=seed
    )
    options = LadderOptions.from_config(cfg)
    result = Ladder(ctx, options, monitor, recorder(ctx, monitor, root), sender).run()
    assert [t.verdict for t in result.tiers] == ["pass", "pass"]
    rows = [t.row(result.axis, options.mode) for t in result.tiers]
    write_tiers_csv(ctx.run.file("tiers.csv"), rows, "ladder", result.vram_source)  # its finish
    return str(ctx.run.path)


def test_two_ladders_of_one_server_differ_by_nothing_significant_a_slower_server_does(
    cli: Any, isolated: Path
) -> None:
    """The same server twice (its jitter drawn from another seed each time), then one twice as
    slow: at 99 % the first two differ by nothing; at 95 % the slower one is significantly
    slower at every batch size, in the JSON and on the HTML page."""
    a = _ladder(isolated, 1, 0.02, 0.01)
    b = _ladder(isolated, 2, 0.02, 0.01)
    c = _ladder(isolated, 3, 0.04, 0.02)

    (isolated / "calibrate.toml").write_text("[confidence]\nlevel = 0.99\n", "utf-8")
    same = cli("report", a, b, "--json")
    assert same.code == 0, same.err
    assert same.json["level"] == 0.99 and "items_per_s" in same.json["metrics"]
    assert [row["key"] for row in same.json["rows"]] == [1, 2]
    for row in same.json["rows"]:
        for metric in ("items_per_s", "output_tokens_per_s"):
            delta = row["deltas"][metric]
            assert delta["significant"] is False, (row["key"], metric, delta)
            assert delta["rounds_a"]["n"] == delta["rounds_b"]["n"] == 5
            assert delta["better"] is None

    (isolated / "calibrate.toml").unlink()  # the default level, 95 %
    worse = cli("report", a, c, "--json", "--html")
    assert worse.code == 0, worse.err
    assert [row["key"] for row in worse.json["rows"]] == [1, 2]
    for row in worse.json["rows"]:
        delta = row["deltas"]["items_per_s"]
        assert delta["significant"] is True and delta["better"] is False, (row["key"], delta)
        assert delta["change"] < -0.3 and delta["ci_high"] < 0 and delta["change_high"] < 0
    page = Page(Path(worse.json["html"]).read_text("utf-8"))
    header = page.rows["comparison"][0]
    cells = [r[header.index("items_per_s Δ")] for r in page.body_rows("comparison")]
    assert all(c.endswith("%, significant at 95 %") and c.startswith("-") for c in cells), cells
