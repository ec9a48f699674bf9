"""``calibrate tune --search refine`` against the mock as a managed engine: the search measures
only what the results so far point to, stops when no neighbour is better, keeps to --restarts
(a rerun continues it), and the Pareto front with the point pin takes is in the text output,
--json and the HTML report."""

from __future__ import annotations

from pathlib import Path

from tests.tune_helpers import SERVER_BOUND, tune_config
from tests.tune_helpers import lines as jsonl

GRID = 'grid = ["slots=1,2,4", "kv_tokens=50000", "memory_fraction=0.8"]\n'


def test_refine_measures_what_the_results_point_to_and_reports_the_front(
    cli, isolated: Path
) -> None:
    tune_config(isolated, GRID, command=SERVER_BOUND, search=None)  # refine: the default
    result = cli("tune", "--json")
    assert result.code == 0, result.err
    out = result.json
    # the middle (two slots), then up (four: better), then nothing beyond four: converged;
    # one slot, below a worse neighbour, is never started
    run = isolated / "runs" / out["run_id"]
    assert [line["flags"]["slots"] for line in jsonl(run / "candidates.jsonl")] == ["2", "4"]
    assert out["restarts"] == 2 and out["complete"] is True
    assert out["search_stop"].startswith("converged: no neighbour of c03")
    assert "refine: 2 restart(s) of the grid's 3 candidates; converged" in result.err
    assert out["winner"]["flags"]["slots"] == "4"
    # the front: both measured points, the pinned one marked, and why pin takes it
    front = {p["id"]: p for p in out["pareto"]}
    assert set(front) == {"c02", "c03"} and front["c03"]["pinned"] is True
    assert front["c03"]["total_tokens_per_s"] > front["c02"]["total_tokens_per_s"] > 0
    assert front["c03"]["on_front"] is True
    reason = out["pinned_reason"]
    assert reason.startswith("pin takes c03 (slots=4, kv_tokens=50000, memory_fraction=0.8)")
    # no SLO is set: every answer counts, and the reason never says "within the SLOs"
    assert "the most requests/s, every answer counted: no SLOs set (--rank-by goodput)" in reason
    # the front's table where it has two points (c02 serves each user faster: so on a quiet
    # machine; beside four CPU burners c03 was faster on both counts, and one point's line
    # below says it all)
    if sum(p["on_front"] for p in front.values()) > 1:
        assert "Pareto front: tokens/s per user against tokens/s in all" in result.err
    assert reason in result.err
    report = cli("report", str(run), "--html", "--json")
    assert report.code == 0, report.err
    assert report.json["pinned_reason"] == reason and "Pareto front" in report.err
    page = (run / "report.html").read_text("utf-8")
    assert 'id="pareto-front"' in page and "ring: the point pin takes" in page
    assert 'class="chosen-point"' in page and "pin takes c03" in page


def test_a_restart_budget_stops_refine_and_the_same_command_with_more_continues(
    cli, isolated: Path
) -> None:
    tune_config(isolated, GRID)
    cut = cli("tune", "--search", "refine", "--restarts", "1", "--json")
    assert cut.code == 0, cut.err
    assert cut.json["complete"] is False and [c["id"] for c in cut.json["untested"]] == ["c03"]
    assert "--restarts spent after 1 restart(s): the search would measure c03 next" in cut.err
    more = cli("tune", "--search", "refine", "--restarts", "5", "--json")
    assert more.code == 0, more.err
    assert more.json["run_id"] == cut.json["run_id"] and more.json["complete"] is True
    assert f"resuming tune run {cut.json['run_id']}" in more.err
    run = isolated / "runs" / cut.json["run_id"]
    assert [line["id"] for line in jsonl(run / "candidates.jsonl")] == ["c02", "c03"]
    bad = cli("tune", "--search", "refine", "--patience", "0")
    assert bad.code == 2 and "--patience must be in [1, 256], got 0" in bad.err
