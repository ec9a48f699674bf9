"""tune ranks by goodput the way the sweep measures it: requests within every [slo] bound over
the level's steady window, so a level whose every request met the SLOs shows a goodput equal to
its throughput, and a candidate that queues past a bound loses what it queued.

tune used to count its own goodput from records.jsonl, over each level's whole wall time: the
[determinism] copies sent after a level's window (in none of its figures) counted as goodput
too, 8 requests more per level, and a level read more goodput than throughput. The ratios
(goodput equal to throughput within the bound, the queued level's loss) are judged on the
simulated server, tests/stages/tune/test_sim_tune.py; here what holds however busy the machine."""

from __future__ import annotations

from pathlib import Path

from tests.tune_helpers import LEVELS, SERVER_BOUND, lines, tune_config

# ~25 ms answers, two slots: every level of 1, 2, 4 in flight answers well within e2e 0.3 s on
# an idle machine; 8 [determinism] copies follow each level's window
SLO = "[slo]\ne2e_p99_s = 0.3\n[determinism]\ncopies = 8\n"


def test_goodput_is_the_throughput_within_the_slos_over_the_same_window(
    cli, isolated: Path
) -> None:
    """Through the CLI: ranked by goodput, said so, and no level reads more goodput than
    throughput (the copies sent after a level's window counted as goodput once), however
    busy the machine. That a level within the bound reads its throughput as goodput, and one
    slot with four in flight loses what it queued, is test_sim_tune.py's
    test_goodput_is_the_throughput_within_the_slos_over_the_steady_window (a virtual clock)."""
    grid = 'grid = ["slots=2", "kv_tokens=50000", "memory_fraction=0.8"]\n'
    tune_config(isolated, grid, levels=LEVELS + SLO)
    result = cli("tune", "--json")
    assert result.code == 0, result.err
    assert "ranked by goodput (e2e p99 ≤ 0.3 s)" in result.err
    (candidate,) = result.json["candidates"]
    assert [lv["concurrency"] for lv in candidate["levels"]] == [1, 2, 4]
    for level in candidate["levels"]:
        assert level["goodput_per_s"] <= level["items_per_s"] * (1 + 1e-6), level
    run = isolated / "runs" / result.json["run_id"]
    (records,) = run.glob("candidates/*/records.jsonl")
    copies = [r for r in lines(records) if r.get("determinism")]
    assert len(copies) == 8 * 3, "the copies were sent, after each level's window"


def test_tune_takes_slo_flags_and_a_ttft_slo_streams_its_levels(cli, isolated: Path) -> None:
    """The issue: tune with [slo] ttft_p99_s and no --stream failed every candidate with 0
    errors ("no candidate that served a passing level") — TTFT is only seen on a streamed
    answer, and tune had no --slo. Now ``tune --slo ttft:…`` streams by itself: every level
    has TTFT, the answers meet the bound, and a winner is named."""
    grid = 'grid = ["slots=2", "kv_tokens=50000", "memory_fraction=0.8"]\n'
    tune_config(isolated, grid, command=SERVER_BOUND)
    result = cli("tune", "--slo", "ttft:5", "--json")
    assert result.code == 0, result.err
    assert "ranked by goodput (ttft p99 ≤ 5 s)" in result.err
    (candidate,) = result.json["candidates"]
    assert all(lv["goodput_per_s"] > 0 for lv in candidate["levels"]), candidate["levels"]
    assert result.json["winner"] is not None
    assert "served a passing level" not in result.err
    assert "the most requests/s within the SLOs (--rank-by goodput)" in result.json["pinned_reason"]


def test_slos_no_level_meets_are_said_so_not_called_a_failure(cli, isolated: Path) -> None:
    """An SLO nothing can meet (e2e p99 ≤ 1 µs) with every request answered: tune says no
    candidate met the SLOs at any level — not that none served a passing level — and exits 1."""
    grid = 'grid = ["slots=2", "kv_tokens=50000", "memory_fraction=0.8"]\n'
    tune_config(isolated, grid)
    result = cli("tune", "--slo", "e2e:0.000001", "--json")
    assert result.code == 1, result.err
    assert "no candidate with a level that met the SLOs (e2e p99 ≤ 1e-06 s)" in result.err
