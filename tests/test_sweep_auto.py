"""``sweep --auto`` (SPEC §5.13): synchronous, then maximum throughput, then rates between —
the rates picked from what was measured, the curve in the report, and bad flags refused."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from calibrate.config import SloConfig
from calibrate.stages.measure.saturation import RateJudgement
from calibrate.stages.sweep.auto import auto_rates
from calibrate.stages.sweep.find_max import FindMax
from calibrate.stages.sweep.levels import AutoRole, AutoStep, Level, rate_boundary
from calibrate.stages.sweep.result import SweepResult
from tests.mockserver import start_mock
from tests.tier_helpers import FAST, assert_kept_or_client_bound, open_gate, run_dir, stats_of

WINDOWS = FAST + "[sweep]\nlevel_s = 0.6\nrepeats = 1\n"
LONGER = FAST + "[sweep]\nlevel_s = 1.2\nrepeats = 1\n"


def test_auto_rates_sit_evenly_between_synchronous_and_maximum() -> None:
    assert auto_rates(10.0, 50.0, 3) == (20.0, 30.0, 40.0)
    assert auto_rates(1.234, 5.678, 1) == (3.46,)  # 3 significant digits: typeable again
    assert auto_rates(10.0, 10.0, 4) == ()  # concurrency added nothing: nothing between
    assert auto_rates(10.0, 10.02, 5) == ()  # no distinct rate fits between once rounded
    assert auto_rates(0.0, 10.0, 3) == ()


def test_auto_measures_both_ends_then_rates_between_on_a_4_slot_mock(cli, isolated: Path) -> None:
    """~0.06 s a request and 4 slots: about 16 req/s one at a time and ~4× that with 4 in
    flight (the ladder proved 4). The rates between are drawn from those two measurements."""
    with start_mock(ttft_s=0.01, per_token_s=0.001, slots=4) as mock:
        open_gate(isolated, mock.base_url, LONGER, "ladder")  # one hiccup in 0.6 s: 2.47×
        result = cli("sweep", "--auto", "--auto-steps", "2", "--arrival", "constant", "--json")
    assert result.code == 0, result.err
    levels = result.json["levels_detail"]
    assert [lv["load"] for lv in levels] == ["synchronous", "rate", "rate", "maximum"]
    assert [lv["auto_step"] for lv in levels] == [0, 1, 2, 3]
    sync, low, high, most = levels
    assert sync["concurrency"] == 1 and most["concurrency"] == 4
    # 4 slots: more than 2.5× one (failed once at 1.4×, in a burner run with the machine
    # loaded far past its two burners; the sweep's own account of that, should it come again)
    assert most["achieved_rate"] > 2.5 * sync["achieved_rate"], result.err
    step = (most["achieved_rate"] - sync["achieved_rate"]) / 3
    assert low["offered_rate"] == pytest.approx(sync["achieved_rate"] + step, rel=0.01)
    assert high["offered_rate"] == pytest.approx(sync["achieved_rate"] + 2 * step, rel=0.01)
    assert all(lv["ttft_p50_s"] is not None for lv in levels), "streamed: TTFT at every level"
    assert result.json["load_mode"] == "auto"
    assert "auto: synchronous" in result.err and "→ rates" in result.err
    # the recommendation: the highest rate the server kept up with
    kept = [lv for lv in (low, high) if not lv["saturated"]]
    assert kept, result.err
    assert result.json["recommendation"].startswith(f"{kept[-1]['offered_rate']:g} req/s")
    # records carry the step: the timeline of the maximum level finds its requests
    run = run_dir(isolated, result.json["run_id"])
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    assert {r["auto_step"] for r in records} == {0, 1, 2, 3}
    assert all(r["offered_rate"] > 0 for r in records if r["auto_step"] in (1, 2))
    shown = cli("report", str(run), "--timeline", "3", "--html", "--json", "--no-plot")
    assert shown.code == 0, shown.err
    assert shown.json["timeline"]["requests"] == sum(r["auto_step"] == 3 for r in records)
    page = Path(shown.json["html"]).read_text("utf-8")
    assert "latency vs throughput" in page and "synchronous" in page


def test_two_auto_runs_compare_step_by_step(cli, isolated: Path) -> None:
    """Two auto runs compare step by step whatever each one's verdict (beside two CPU-burning
    processes one of two ended "the client was the limit", exit 1: honest, and said). Their
    rates run on a steady schedule: how a random one is judged is test_rates'."""
    auto = ("sweep", "--auto", "--auto-steps", "1", "--arrival", "constant", "--json")
    with start_mock(ttft_s=0.01, per_token_s=0.001, slots=4) as mock:
        open_gate(isolated, mock.base_url, WINDOWS, "ladder")
        first = cli(*auto)
        second = cli(*auto)
        # far below the 4 slots' ~60 req/s, on a steady schedule: kept up even on a busy box
        rates = cli("sweep", "--rates", "5", "--arrival", "constant", "--json")
    for run in (first, second, rates):
        assert_kept_or_client_bound(run, rates=True)
    a, b = (run_dir(isolated, r.json["run_id"]) for r in (first, second))
    compared = cli("report", str(a), str(b), "--json")
    assert compared.code == 0, compared.err
    assert [row["key"] for row in compared.json["rows"]] == [0, 1, 2]
    mixed = cli("report", str(a), str(run_dir(isolated, rates.json["run_id"])))
    assert mixed.code == 2 and "--auto with --auto" in mixed.err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--auto", "--rates", "1,2"], "cannot be given with --rates"),
        (["--auto", "--concurrency", "1,2"], "cannot be given with --concurrency"),
        (["--auto", "--auto-steps", "0"], "--auto-steps must be in [1, 50]"),
        (["--concurrency", "1,2", "--rates", "1"], "two load modes"),
        # the knee is the first level within noise of the best as they rise: "8,4,2,1" named 8
        (["--concurrency", "8,4,2,1"], "must rise, each level once\ne.g. --concurrency 1,2,4,8"),
        (["--concurrency", "1,2,2,4"], "must rise, each level once\ne.g. --concurrency 1,2,4"),
        (["--rates", "2,2,4"], "must rise, each rate once"),
        (["--rates", "inf,4"], "must rise, each rate once"),
    ],
)
def test_conflicting_load_flags_are_exit_2_before_anything_runs(
    cli, isolated: Path, flags: list[str], says: str
) -> None:
    open_gate(isolated, "http://127.0.0.1:9/v1", WINDOWS, "ladder")  # nothing listens there
    result = cli("sweep", *flags)
    assert result.code == 2 and says in result.err, result.err
    assert not list((isolated / "runs").glob("*-sweep-*")), "no run folder for a rejected command"


def _level(
    step: int,
    role: AutoRole,
    per_s: float,
    saturated: bool | None = None,
    *,
    goodput_per_s: float | None = None,
    split: tuple[int, int] = (0, 1),
) -> Level:
    concurrency = 1 if role == "synchronous" else 4
    stats = stats_of(4, concurrency, items_per_s=per_s, goodput_per_s=goodput_per_s)
    rate = None
    if saturated is not None:
        achieved = per_s * (0.8 if saturated else 1.0)
        rate = RateJudgement(per_s, achieved, 1.0, 10, saturated, "", split=split)
    return Level(stats, (stats,), None, False, "pass", False, rate, AutoStep(step, role))


def _recommended(*levels: Level) -> str:
    return SweepResult(levels, 4, 0.1, None, "none", 0).recommendation


def test_auto_recommends_the_highest_rate_kept_up_with_else_the_synchronous_level() -> None:
    sync, most = _level(0, "synchronous", 10.0), _level(3, "maximum", 40.0)
    kept, over = _level(1, "rate", 20.0, saturated=False), _level(2, "rate", 30.0, saturated=True)
    assert _recommended(sync, kept, over, most).startswith("20 req/s: achieved 20.00 req/s")
    assert _recommended(sync, _level(1, "rate", 20.0, saturated=True), most) == (
        "synchronous (concurrency 1): 10.00 req/s — every rate tried above it saturated"
    )
    assert _recommended(sync, _level(3, "maximum", 10.2)) == (
        "synchronous (concurrency 1): 10.00 req/s — no rate between it and the maximum ran"
    )


def test_auto_whose_rate_the_client_could_not_send_recommends_nothing_and_says_why() -> None:
    """Seen in a fresh clone's make test on a loaded machine: synchronous 5.85 req/s, maximum
    40.5, and the one rate between, 23.2 req/s, sent while calibrate itself was the bottleneck
    (left out). The sweep recommended the synchronous level "— every rate tried above it
    saturated" (exit 0): none had; whether 23.2 req/s keeps up was never measured. Now it is
    inconclusive for the client's limit, as a rate sweep is, and says what to do."""
    sync, most = _level(0, "synchronous", 5.85), _level(2, "maximum", 40.5)
    starved = replace(
        _level(1, "rate", 23.2, saturated=False),
        client_bound="calibrate's threads waited 59 ms on average to run",
    )
    result = SweepResult((sync, most, starved), 4, 0.1, None, "none", 0)  # in the order run
    assert not result.passed, result.recommendation
    assert result.inconclusive.startswith(
        "inconclusive: the client was the limit at rate ≥ 23.2 req/s — the best level it "
        "could measure is the last one before that (synchronous (concurrency 1))"
    ), result.inconclusive
    assert "--workers" in result.what_to_do, result.what_to_do
    kept = _level(1, "rate", 23.2, saturated=False)
    assert SweepResult((sync, most, kept), 4, 0.1, None, "none", 0).passed, "unstarved: sure"
    failing = replace(kept, verdict="fail")  # its answers failed: kept up with, it was not
    assert SweepResult((sync, most, failing), 4, 0.1, None, "none", 0).recommendation == (
        "synchronous (concurrency 1): 5.85 req/s — no rate tried above it was kept up with for sure"
    )


def test_auto_with_slos_recommends_the_most_goodput_and_a_split_rate_is_no_sure_answer() -> None:
    """With SLOs, --auto took the highest rate kept up with whatever its goodput ("17.1 req/s:
    goodput 2.88 within the SLOs" over a synchronous level's 8.43); the most goodput is taken,
    as a rate sweep does. And a rate whose runs split on saturating (2 of 6) left --rates
    inconclusive but --auto sure on the same runs (exit 0, "not saturated")."""
    slo = SloConfig(e2e_p99_s=0.15)
    sync = _level(0, "synchronous", 8.43, goodput_per_s=8.43)
    low = _level(1, "rate", 10.2, saturated=False, goodput_per_s=6.45)
    high = _level(2, "rate", 17.1, saturated=False, goodput_per_s=2.88)
    most = _level(3, "maximum", 18.8, goodput_per_s=0.72)
    slos = SweepResult((sync, low, high, most), 4, 0.1, None, "none", 0, slo=slo)
    assert slos.best is sync and slos.passed
    assert slos.recommendation.startswith("synchronous (concurrency 1): goodput 8.43 req/s")
    assert "misses them" not in slos.recommendation
    # goodput counts the requests within; a level whose own p99 breaks a bound says so
    late = replace(sync, stats=replace(sync.stats, latency_p99_s=0.24))
    missed = SweepResult((late, low, high, most), 4, 0.1, None, "none", 0, slo=slo)
    assert missed.best is late
    assert "; the level itself misses them: E2E latency p99 0.24 s is over the SLO 0.15 s" in (
        missed.recommendation
    )
    split = _level(2, "rate", 17.1, saturated=False, split=(2, 6))
    unsure = SweepResult((sync, low, split, most), 4, 0.1, None, "none", 0)
    assert "17.1 req/s keeps up: 2 of 6 runs did not" in unsure.inconclusive, unsure.inconclusive
    assert not unsure.passed
    taken = replace(unsure, conservative=True)
    assert taken.best is low and taken.under_noise is not None


def test_a_rate_boundary_says_the_concurrency_pin_takes_never_above_the_cap() -> None:
    """The find-max over rates said "at most 8 requests were in flight there, which pin and
    status take as concurrency 8" while the ledger took 4, the server's own cap."""
    over = _level(1, "rate", 20.1, saturated=False)
    over = replace(over, stats=replace(over.stats, concurrency=8))
    fm = FindMax(20.1, None, (5.0, 20.1), 40.0, over="rates", bottom=5.0)
    said = rate_boundary(over, fm, "e2e p99 1 s", 4)
    assert "at most 8 requests were in flight there (the server runs 4 at once" in said, said
    assert "which pin and status take as concurrency 4" in said
    assert "as concurrency 8" not in said
    assert "take as concurrency 8" in rate_boundary(over, fm, "e2e p99 1 s", None)
