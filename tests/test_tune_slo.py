"""tune ranks by goodput the way the sweep measures it: requests within every [slo] bound over
the level's steady window, so a level whose every request met the SLOs shows a goodput equal to
its throughput, and a candidate that queues past a bound loses what it queued.

tune used to count its own goodput from records.jsonl, over each level's whole wall time: the
[determinism] copies sent after a level's window (in none of its figures) counted as goodput
too, 8 requests more per level, and a level read more goodput than throughput."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tune_helpers import LEVELS, SERVER_BOUND, tune_config

# ~0.1 s answers: within e2e 0.3 s at up to one request per slot (and at two, ~0.2 s); four in
# flight on one slot wait ~0.3 s more and miss it
SLO = "[slo]\ne2e_p99_s = 0.3\n[determinism]\ncopies = 8\n"


def test_goodput_is_the_throughput_within_the_slos_over_the_same_window(
    cli, isolated: Path
) -> None:
    grid = 'grid = ["slots=1,2", "kv_tokens=50000", "memory_fraction=0.8"]\n'
    tune_config(isolated, grid, command=SERVER_BOUND, levels=LEVELS + SLO)
    result = cli("tune", "--json")
    assert result.code == 0, result.err
    assert "ranked by goodput (e2e p99 ≤ 0.3 s)" in result.err
    by_slots = {c["flags"]["slots"]: c for c in result.json["candidates"]}
    assert [c["flags"]["slots"] for c in result.json["candidates"]] == ["2", "1"]
    for slots, candidate in by_slots.items():
        for level in candidate["levels"]:
            good, items = level["goodput_per_s"], level["items_per_s"]
            assert good <= items * (1 + 1e-6), (slots, level)
            if level["concurrency"] <= int(slots):  # every request well within 0.3 s
                assert good == pytest.approx(items, rel=1e-3), (slots, level)
    # one slot, four in flight: most requests waited past the bound
    four = next(lv for lv in by_slots["1"]["levels"] if lv["concurrency"] == 4)
    assert four["goodput_per_s"] < 0.5 * four["items_per_s"]
    assert by_slots["1"]["best_concurrency"] <= 2 and by_slots["2"]["best_concurrency"] >= 2
