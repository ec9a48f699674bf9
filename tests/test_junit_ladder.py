"""``ladder --junit``: one testcase per tier and round, failures naming the tier and the kind."""

from __future__ import annotations

from pathlib import Path

from tests.mockserver import start_mock
from tests.tier_helpers import junit_cases, open_gate


def test_junit_from_a_ladder_that_finds_its_ceiling(cli, isolated: Path) -> None:
    """A passing ladder (exit 0) that ends at its OOM ceiling is green in CI: the ceiling is a
    skipped case and a property, never a failure."""
    with start_mock(ttft_s=0.002, per_token_s=0.004, slots=4, oom_at=6) as mock:
        open_gate(isolated, mock.base_url)
        result = cli("ladder", "--junit", "out/ladder.xml", "--json")
    assert result.code == 0, result.err
    suite, cases = junit_cases(isolated / "out/ladder.xml")
    names = [c.get("name") for c in cases]
    # two rounds a tier, more where the setting needed them to tell two tiers apart
    rounds = {t["batch_size"]: t["rounds"] for t in result.json["tiers_detail"]}
    ran = [f"batch {b} round {r}" for b in (1, 2, 4) for r in range(1, rounds[b] + 1)]
    assert names == [*ran, "batch 8 round 1", "batch 8 round 2"]
    assert suite.get("tests") == str(len(names)) and suite.get("failures") == "0"
    assert suite.get("errors") == "0" and suite.get("skipped") == "2"
    assert all(c.find("failure") is None for c in cases)
    ceiling = cases[-2].find("skipped")
    assert ceiling is not None
    assert "the ceiling, not a failure: batch 8 round 1: 2 of 8 requests failed (oom×2)" in (
        ceiling.get("message") or ""
    )
    assert cases[-1].find("skipped") is not None  # round 2 of batch 8: not run
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["run_id"] == result.json["run_id"] and props["run_dir"].endswith(props["run_id"])
    assert "batch 8 round 1" in props["ceiling"] and "oom" in props["ceiling"]
    assert props["setting_batch_size"] == str(result.json["last_passing"]["batch_size"])
    assert props["stopped_by"] == "failure"


def test_junit_from_a_ladder_stopped_by_the_servers_cap_has_no_failure(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.002, slots=2, expose_props=True) as mock:
        open_gate(isolated, mock.base_url)
        result = cli("ladder", "--junit", "ladder.xml", "--json")
    assert result.code == 0, result.err
    suite, cases = junit_cases(isolated / "ladder.xml")
    assert suite.get("failures") == "0" and all(c.find("failure") is None for c in cases)
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["stopped_by"] == "cap" and "the server's own cap is 2" in props["ceiling"]


def test_junit_from_a_ladder_failing_at_the_first_tier(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, oom_at=0) as mock:
        open_gate(isolated, mock.base_url)
        result = cli("ladder", "--junit", "ladder.xml")
    assert result.code == 1
    suite, cases = junit_cases(isolated / "ladder.xml")
    assert [c.get("name") for c in cases] == ["batch 1 round 1", "batch 1 round 2"]
    assert suite.get("failures") == "1"
    failure = cases[0].find("failure")
    assert failure is not None and failure.get("type") == "oom"
    assert "batch 1" in (failure.text or "") and "oom" in (failure.text or "")
