"""The Pareto front of a tune (tokens/s per user against tokens/s in all) and why pin takes its
point: on the front by goodput, off it when --rank-by energy picks a frugal point, named beaten."""

from __future__ import annotations

from calibrate.stages.tune.grid import Candidate
from calibrate.stages.tune.pareto import points, reason
from calibrate.stages.tune.result import BestLevel, CandidateResult, Measurement


def _result(
    index: int, concurrency: int, tokens_per_s: float, joules: float | None = None
) -> CandidateResult:
    items = tokens_per_s / 100
    best = BestLevel(concurrency, items, items, tokens_per_s, 0.1, 0.2, None, joules)
    measured = Measurement(best, (), 0, 0, None, None, None, "none", "")
    candidate = Candidate(index, (("slots", str(concurrency)),), concurrency)
    return CandidateResult(candidate, 0, 1.0, True, served=True, measurement=measured)


# slots 1: 400 tok/s for its one user; 4: 1200 in all, 300 each; 8: 1600, 200 each;
# slots 6: 900 in all, 150 each — beaten on both by slots 4 and 8 (but the fewest joules)
RANKED = [
    _result(4, 8, 1600, 0.5),
    _result(3, 4, 1200, 0.4),
    _result(2, 6, 900, 0.2),
    _result(1, 1, 400, 0.9),
]


def test_the_front_keeps_the_points_no_other_beats_on_both_axes() -> None:
    found = points(RANKED, "c04")
    assert [(p.id, p.on_front) for p in found] == [
        ("c04", True),
        ("c03", True),
        ("c01", True),
        ("c02", False),
    ]
    c03 = next(p for p in found if p.id == "c03")
    assert c03.per_user_tokens_per_s == 300 and c03.total_tokens_per_s == 1200
    assert c03.joules_per_output_token == 0.4 and not c03.pinned
    assert found[0].pinned and found[0].to_json()["on_front"] is True


def test_a_candidate_that_failed_its_slos_counts_only_its_good_requests() -> None:
    best = BestLevel(4, 2.0, 8.0, 800.0, 0.1, 0.2, None)  # a quarter of its requests met them
    measured = Measurement(best, (), 0, 0, None, None, None, "none", "")
    result = CandidateResult(Candidate(1, (), 4), 0, 1.0, True, served=True, measurement=measured)
    (point,) = points([result], None)
    assert point.total_tokens_per_s == 200 and point.per_user_tokens_per_s == 200


def test_the_reason_names_the_ranking_and_whether_the_point_is_on_the_front() -> None:
    found = points(RANKED, "c04")
    pinned = next(p for p in found if p.pinned)
    by_goodput = reason(pinned, "goodput", found, slos=True)
    # without SLOs goodput is every answer: the reason says so, never "within the SLOs"
    unset = reason(pinned, "goodput", found)
    assert "every answer counted: no SLOs set (--rank-by goodput)" in unset
    assert "within the SLOs" not in unset
    assert by_goodput.startswith(
        "pin takes c04 (slots=8) at concurrency 8: the most requests/s within the SLOs "
        "(--rank-by goodput)"
    )
    assert by_goodput.endswith(
        "200.0 tokens/s per user, 1600.0 tokens/s in all, on the Pareto front"
    )
    frugal = points(RANKED, "c02")
    by_energy = reason(next(p for p in frugal if p.pinned), "joules_per_token", frugal)
    assert (
        "the fewest joules per output token at its best level (--rank-by joules_per_token)"
        in by_energy
    )
    assert by_energy.endswith("off the Pareto front (beaten on both axes by c04, c03)")
    smaller = points(RANKED, "c03")
    noisy = reason(next(p for p in smaller if p.pinned), "goodput", smaller, "c03 (slots=4)")
    assert "taken under noise (--conservative): c03 (slots=4), the smaller cap" in noisy
    assert reason(None, "goodput", found) == ""
