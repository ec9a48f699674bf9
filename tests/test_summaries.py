"""Summaries are typed on write as on read: a line written from a summary reads back as one,
and is written again byte for byte (the keys in the same order)."""

from __future__ import annotations

import json

from calibrate.state.summaries import (
    LadderSummary,
    PlainSummary,
    SweepSummary,
    TierChecks,
    ladder_summary,
    sweep_summary,
)
from calibrate.state.summary_values import Setting, Workload

SELFLOAD = {"windows": 3, "bottleneck": False}
COMPARE = {"baseline": "baselines/ladder.csv", "passed": True, "problems": []}


def test_a_tier_runs_checks_come_after_its_own_fields_and_survive_a_reread() -> None:
    ladder = LadderSummary(
        Setting(4, 4), "vram", 4, Workload(), {"tiers": []}, checks=TierChecks(SELFLOAD, COMPARE)
    )
    written = ladder.to_json()
    assert list(written)[-3:] == ["context_verified", "selfload", "compare"]
    again = ladder_summary(json.loads(json.dumps(written))).to_json()
    assert json.dumps(again) == json.dumps(written)
    sweep = SweepSummary(2, 4, "L1", "knee", {"levels": []}, checks=TierChecks(SELFLOAD))
    assert list(sweep.to_json())[-2:] == ["workload", "selfload"], "no --compare: no key"
    assert json.dumps(sweep_summary(sweep.to_json()).to_json()) == json.dumps(sweep.to_json())


def test_a_plain_summary_is_written_as_given() -> None:
    details = {"verdict": "identical", "runs": 2, "jq": "del(.ts)"}
    assert list(PlainSummary(details).to_json()) == list(details)
    assert PlainSummary().to_json() == {}
