"""The tune winner's margin over the runner-up is claimed only when the runs of their best levels
separate at ``[confidence] level`` (SPEC §13): the rule on fixed numbers, the winner line and
the summary's keys; a real tune run carries the keys whatever the machine measured."""

from __future__ import annotations

import shlex
import statistics
from dataclasses import replace
from pathlib import Path

from calibrate.cli.views.tune import winner_text
from calibrate.gpu.noise import MachineNoise
from calibrate.stages.tune.grid import Axis, Candidate, TunePlan
from calibrate.stages.tune.outcome import TuneOutcome, margin_of
from calibrate.stages.tune.result import BestLevel, CandidateResult, Measurement
from tests.tune_helpers import LEVELS, MOCK, tune_config
from tests.tune_helpers import lines as jsonl

# goodput per run (req/s) at each candidate's best level
CLEAR = ((12.0, 12.2, 12.4), (10.0, 10.1, 10.2))  # +21 %; 95 % interval +16.7 %…+24.9 %
# +6 %: at 95 % the interval of the difference is −4.1 %…+15.9 % (holds zero), at 80 % it is
# +0.6 %…+11.2 % (clears it)
CLOSE = ((10.3, 10.8, 11.3), (9.9, 10.2, 10.5))


def _best(*runs: float) -> BestLevel:
    goodput = statistics.fmean(runs)
    return BestLevel(4, goodput, goodput, 100.0, 0.1, 0.2, None, runs_per_s=runs)


def _measured(index: int, *runs: float, cap: int = 4, rung: int = 0) -> CandidateResult:
    m = Measurement(_best(*runs), (), 0, 0, None, None, None, "none", "completed")
    candidate = Candidate(index, (("slots", str(index)),), cap)
    return CandidateResult(candidate, rung, 1.0, True, served=True, measurement=m)


def _outcome(winner: tuple[float, ...], second: tuple[float, ...], level: float) -> TuneOutcome:
    plan = TunePlan("custom", (Axis("slots", ("1", "2"), "[tune] grid"),), 4, None, ())
    ranked = (_measured(2, *winner), _measured(1, *second))
    return TuneOutcome(plan, None, (), ranked, (), False, level=level)


def test_a_lead_is_significant_only_when_the_interval_clears_zero() -> None:
    clear = margin_of(_best(*CLEAR[0]), _best(*CLEAR[1]))
    assert clear is not None and clear.significant is True and clear.level == 0.95
    assert round(clear.fraction, 3) == 0.208 and clear.low is not None and clear.low > 0.15
    close = margin_of(_best(*CLOSE[0]), _best(*CLOSE[1]), 0.95)
    assert close is not None and close.significant is False and round(close.fraction, 3) == 0.059
    assert close.low is not None and close.high is not None and close.low < 0 < close.high
    looser = margin_of(_best(*CLOSE[0]), _best(*CLOSE[1]), 0.80)
    assert looser is not None and looser.significant is True, "the level decides"
    once = margin_of(_best(12.0), _best(10.0))
    assert once is not None and once.significant is None and once.runs == (1, 1)
    assert margin_of(_best(12.0), _best(0.0)) is None  # no ratio over nothing
    resumed = margin_of(BestLevel(4, 12.0, 12.0, 1.0, None, None, None), _best(*CLEAR[1]))
    assert resumed is not None and resumed.significant is None
    assert resumed.caveat() == " (no interval: an earlier calibrate kept no runs for one of them)"
    # a winner by the ranking whose runs are significantly slower is never claimed
    behind = margin_of(
        BestLevel(4, 10.5, 10.5, 1.0, None, None, None, runs_per_s=CLEAR[1]), _best(*CLEAR[0])
    )
    assert behind is not None and behind.fraction < 0 and behind.significant is True
    ahead = margin_of(
        BestLevel(4, 12.5, 12.5, 1.0, None, None, None, runs_per_s=CLEAR[1]), _best(*CLEAR[0])
    )
    assert ahead is not None and ahead.fraction > 0 and ahead.significant is False


def test_the_winner_line_says_whether_the_margin_is_significant() -> None:
    clear = winner_text(_outcome(*CLEAR, 0.95), 0.10)
    assert clear is not None and "+21% over the runner-up c01 (slots=1)" in clear
    assert "significant" not in clear and "gain_min" not in clear
    close = winner_text(_outcome(*CLOSE, 0.95), 0.10)
    assert close is not None and close.startswith("winner: c02 (slots=2): 10.80 req/s")
    assert close.endswith(
        "+6% over the runner-up c01 (slots=1), not significant at 95 % (the intervals overlap): "
        "about equal, measure longer to tell"
    )
    looser = winner_text(_outcome(*CLOSE, 0.80), 0.10)
    assert looser is not None and "not significant" not in looser
    assert "within [sweep] gain_min (10%)" in looser  # significant, yet under gain_min
    once = winner_text(_outcome((12.0,), (10.0,), 0.95), 0.10)
    assert once is not None and once.endswith(
        "+20% over the runner-up c01 (slots=1) (one run each: no interval; "
        "set [sweep] repeats = 3 to tell)"
    )


def test_the_summary_and_the_results_carry_the_test() -> None:
    body = _outcome(*CLOSE, 0.95).summary({}).details
    assert body["margin"] == 0.0588 and body["significant"] is False
    assert body["confidence"] == 0.95 and body["margin_interval"] == [-0.0414, 0.159]
    once = _outcome((12.0,), (10.0,), 0.95).summary({}).details
    assert once["significant"] is None and once["margin_interval"] is None
    result = _measured(2, *CLOSE[0])
    again = CandidateResult.from_json(result.to_json())
    assert again is not None and again.best is not None
    assert again.best.runs_per_s == CLOSE[0]
    old = {**result.to_json(), "best": {"concurrency": 4, "goodput_per_s": 10.8}}
    older = CandidateResult.from_json(old)  # a line written before the runs were kept
    assert older is not None and older.best is not None and older.best.runs_per_s == ()


def test_a_tune_run_names_whether_its_margin_is_significant(cli, isolated: Path) -> None:
    # the keys and the line's form only: whether the mock's two candidates separate on this
    # machine is not the test's business (the rule is tested above on fixed numbers)
    levels = LEVELS.replace("repeats = 1", "repeats = 2") + "[confidence]\nlevel = 0.8\n"
    tune_config(isolated, 'grid = ["slots=1,2", "kv_tokens=50000"]\n', levels=levels)
    result = cli("tune", "--json")
    if result.code == 1:  # a busy box: runs too wide to back either — said so, nothing picked
        said = " ".join(result.err.split())
        assert "tune inconclusive: the runs cannot tell whether c0" in said, result.err
        assert result.json["passed"] is False, result.json
        return
    assert result.code == 0, result.err
    winner = result.json["winner"]
    assert winner["significant"] in (True, False) and winner["confidence"] == 0.8
    assert isinstance(winner["margin"], float) and len(winner["margin_interval"]) == 2
    line = next(x for x in result.err.splitlines() if x.startswith("winner: "))
    assert f"winner: {winner['id']} (" in line and "over the runner-up c0" in line
    assert ("not significant at 80 %" in line) == (winner["significant"] is False)
    run = isolated / "runs" / result.json["run_id"]
    for candidate in jsonl(run / "candidates.jsonl"):  # two runs of the best level at least
        assert candidate["best"] is None or len(candidate["best"]["runs_per_s"]) >= 2
    ledger = jsonl(isolated / "runs/ledger.jsonl")[-1]["summary"]
    assert ledger["significant"] == winner["significant"] and ledger["confidence"] == 0.8


def test_a_winner_the_runs_cannot_back_is_inconclusive_unless_conservative() -> None:
    """SPEC §5.14 for tune: the pick stands when the runner-up cannot be gain_min better — the
    winner leads (CLEAR) or the two are about equal (CLOSE, within 10 % either way); when the
    runs are so wide that the runner-up might be far better, tune names no winner (exit 1,
    passed false) unless --conservative takes the one with the smaller cap."""
    assert _outcome(*CLEAR, 0.95).doubt is None
    assert _outcome(*CLOSE, 0.95).doubt is None
    wide = _outcome((10.0, 16.0, 13.0), (9.0, 14.0, 11.0), 0.95)
    assert wide.doubt is not None and wide.winner is None
    assert wide.inconclusive.startswith("inconclusive: the runs cannot tell whether c02 adds 10 %")
    assert wide.summary({}).winner is None
    taken = _outcome((10.0, 16.0, 13.0), (9.0, 14.0, 11.0), 0.95)
    taken = TuneOutcome(
        taken.plan, None, (), taken.ranked, (), False, level=0.95, conservative=True
    )
    assert taken.winner is not None and not taken.inconclusive
    assert taken.summary({}).details["under_noise"]["taken_under_noise"] is True


def test_a_winner_is_judged_against_the_other_candidate_never_itself() -> None:
    """--conservative took the second-ranked (the smaller cap) under noise, and the line said
    "+0% over the runner-up c01" — itself, its interval its own runs against themselves. The
    runner-up is the first then, and the lead the real one: behind it. And a winner surely behind
    (a halving cut short ranks a later rung first) is never "within gain_min: about equal"."""
    plan = TunePlan("custom", (Axis("slots", ("1", "2"), "[tune] grid"),), 4, None, ())
    first, second = _measured(2, 10.0, 16.0, 13.0), _measured(1, 9.0, 14.0, 11.0, cap=2)
    taken = TuneOutcome(plan, None, (), (first, second), (), False, conservative=True)
    assert taken.winner is second and taken.runner_up is first
    assert taken.lead is not None and taken.lead.fraction < 0
    assert taken.summary({}).details["runner_up"]["id"] == "c02"
    text = winner_text(taken, 0.10)
    assert text is not None and "over the runner-up c02" in text and "+0%" not in text, text
    later, earlier = _measured(2, *CLEAR[1], rung=1), _measured(1, *CLEAR[0])
    behind = TuneOutcome(plan, None, (), (later, earlier), (), False, conservative=True)
    assert behind.winner is later and behind.lead is not None and behind.lead.significant
    said = winner_text(behind, 0.10)
    assert said is not None and "the runner-up surely served more" in said, said
    assert "about equal" not in said, said


def test_a_tune_left_inconclusive_names_the_machine_its_candidates_were_measured_on() -> None:
    """Every level of both candidates recorded 1.4–1.7 of 2 cores busy, and the verdict said
    "the runs varied (this machine's own load could not be read)", offering no quieter machine
    (SPEC §5.14: noise measured for each candidate and named in the verdict). Kept in
    candidates.jsonl, a resumed run names it too."""
    busy = MachineNoise(10.0, 2, 16.0, 0.0, 20.0)
    plan = TunePlan("custom", (Axis("slots", ("1", "2"), "[tune] grid"),), 4, None, ())
    first, second = _measured(2, 10.0, 16.0, 13.0), _measured(1, 9.0, 14.0, 11.0)
    noisy = [
        replace(r, measurement=replace(r.measurement, noise=busy))
        for r in (first, second)
        if r.measurement is not None
    ]
    outcome = TuneOutcome(plan, None, (), tuple(noisy), (), False)
    assert outcome.winner is None
    assert "other processes used 1.6 of this machine's 2 cores" in outcome.inconclusive
    assert "could not be read" not in outcome.inconclusive
    back = CandidateResult.from_json(noisy[0].to_json())
    assert back is not None and back.measurement is not None and back.measurement.noise == busy


def test_a_winner_ranked_by_cost_cites_the_figures_it_was_ranked_by() -> None:
    """--rank-by joules_per_token picked by one J/tok figure a candidate, and the line cited
    "+53% over the runner-up …, not significant at 95 %: about equal" — a goodput margin, a
    statistic the ranking did not use (SPEC §5.14: a verdict and the row it cites use one)."""
    plan = TunePlan("custom", (Axis("slots", ("1", "2"), "[tune] grid"),), 4, None, ())
    cheap, dear = _measured(1, 9.0, 14.0, 11.0), _measured(2, 236.2, 142.0, 72.1)
    ranked = []
    for r, jpt in ((cheap, 0.017), (dear, 0.023)):
        assert r.measurement is not None and r.measurement.best is not None
        best = replace(r.measurement.best, joules_per_output_token=jpt)
        ranked.append(replace(r, measurement=replace(r.measurement, best=best)))
    outcome = TuneOutcome(plan, None, (), tuple(ranked), (), False, rank_by="joules_per_token")
    assert outcome.winner is ranked[0] and outcome.lead is None
    assert outcome.lead_json()["significant"] is None
    text = winner_text(outcome, 0.10)
    assert text is not None and "0.017 J/output token against 0.023 for the runner-up c02" in text
    assert "no interval" in text and "over the runner-up" not in text, text


def test_a_conservative_pick_between_two_of_one_cap_never_claims_the_smaller_cap(
    cli, isolated: Path
) -> None:
    """Two candidates of a command that caps itself ({slots}) both run at the ladder's batch 4;
    --conservative took the first-ranked c02 (slots=2) and pin's line said "c02 (slots=2), the
    smaller cap of the two" — over slots=1, a cap it does not have."""
    drifting = (
        shlex.join(MOCK) + " --port {port} --slots {slots} --slow-after 8 --slow-after-factor 4"
    )
    levels = LEVELS.replace("concurrency = [1, 2, 4]", "concurrency = [1]").replace(
        "repeats = 1", "repeats = 2"
    )
    tune_config(isolated, 'grid = ["slots=1,2"]\n', command=drifting, levels=levels)
    taken = cli("tune", "--conservative", "--json")
    assert taken.code == 0, taken.err
    caps = {c["cap"] for c in taken.json["candidates"]}
    assert caps == {4}, caps  # calibrate passes no cap: both run at the ladder's batch
    reason = taken.json["pinned_reason"]
    if "taken under noise" in reason:  # the machine left the two in doubt (it nearly always does)
        assert "the smaller cap of the two" not in reason, reason
        assert "the first-ranked of the two (neither has the smaller cap)" in reason, reason
    assert "the smaller cap of the two" not in " ".join(taken.err.split())


def test_a_winner_over_a_runner_up_of_another_window_says_so() -> None:
    """A halving whose second survivor crashed at the full window leaves a runner-up measured
    at the half window: before, the line said "+21% over the runner-up c01" as if the two were
    measured alike. Now it names both windows, and a point pin's reason calls beaten by one
    measured over another window says so too."""
    plan = TunePlan("custom", (Axis("slots", ("1", "2"), "[tune] grid"),), 4, None, ())
    full, half = _measured(2, *CLEAR[0], rung=1), replace(_measured(1, *CLEAR[1]), window=0.5)
    outcome = TuneOutcome(plan, None, (), (full, half), (), False)
    said = winner_text(outcome, 0.10)
    assert said is not None and "over the runner-up c01" in said, said
    unlike = " — the runner-up was measured over 0.5× the window, the winner over 1×: not like"
    assert said.endswith(unlike + " for like"), said
    alike = winner_text(_outcome(CLEAR[0], CLEAR[1], 0.95), 0.10)
    assert alike is not None and "window" not in alike, alike
    front = outcome.summary({}).details["pareto"]
    assert sorted((p["id"], p["window"]) for p in front) == [("c01", 0.5), ("c02", 1.0)]
