"""``sweep --find-max --rates`` on a simulated 4-slot server on a virtual clock: the synchronous
rate first, then the rate probes, and the boundary at the slots' capacity — the ratio claims
that over real HTTP needed the machine to themselves (a starved core sends late)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from calibrate.config import Config, SloConfig, SweepConfig
from calibrate.gpu.vram import VramMonitor
from calibrate.load.sender import Sender
from calibrate.stages.sweep.run import Sweep
from calibrate.stages.sweep.spec import SweepOptions
from tests.stage_fakes import close_runs, recorder, simulated_sender, stage_ctx
from tests.tier_helpers import jsonl

__all__ = ["close_runs"]  # the autouse fixture, used by being imported

TTFT = SloConfig(ttft_p99_s=0.1)


def _four_slots(seconds: float) -> Sender:
    """4 slots, ``seconds`` a request (its first token a quarter in): 4 / seconds req/s at most."""
    return simulated_sender(slots=4, ttft_s=seconds / 4, per_token_s=seconds / 4, answer_tokens=3)


def _rate_sweep(tmp_path: Path, sender: Sender) -> Sweep:
    cfg = Config(sweep=replace(SweepConfig(), level_s=0.3, repeats=1), slo=TTFT)
    ctx = stage_ctx(tmp_path, cfg, "sweep")
    monitor = VramMonitor([])
    options = replace(
        SweepOptions.from_config(cfg, 4, slo=TTFT, stream=True, arrival="constant"),
        find_max_rates=(0.0, 0.0),
    )
    return Sweep(ctx, options, monitor, recorder(ctx, monitor, tmp_path), sender)


def test_the_rate_search_lands_at_the_capacity_of_a_simulated_four_slot_server(
    tmp_path: Path,
) -> None:
    """0.2 s a request: one at a time is 5 req/s (the synchronous rate, the bottom); 4 slots
    answer 20 req/s. Below that a constant rate never queues (TTFT 0.05 s); above it requests
    wait for a slot and the achieved rate falls behind the offered one, far above it TTFT
    passes 0.1 s too. The boundary is the capacity, to the search's 5 % — a level of 0.3 s
    cannot tell 21.5 req/s (7 % over, achieved 20.5) from keeping up, and says so honestly:
    it read "kept up" (4.7 % short, just inside 5 %) and was the boundary, surer than its
    eight answers a run; now the slope's interval straddles 5 % and it is not kept (SPEC §5.14).
    23.7 req/s (1.2×) read "not sure it kept up" too, its queue forming only halfway through
    each run; the halves of its answers are sure of it: saturated from one run."""
    sweep = _rate_sweep(tmp_path, _four_slots(0.2))
    said: list[str] = []
    sweep.note = said.append
    result = sweep.run()
    fm = result.find_max
    assert fm is not None and fm.over == "rates" and fm.bottom == 5.0
    assert fm.start == "the synchronous rate"
    assert said[0] == "find-max: synchronous 5 req/s, so rates 5–5120 req/s"
    assert fm.order == (5.0, 40.0, 14.1, 23.7, 18.3, 20.8, 22.2, 21.5), fm.order
    assert (fm.last_passing, fm.first_failing) == (20.8, 21.5)
    assert 20.0 <= fm.last_passing <= 1.1 * 20.0, "at the slots' capacity, 4× the synchronous"
    levels = {lv.rate.offered_rate: lv for lv in result.levels if lv.rate is not None}
    assert levels[40.0].verdict == "stop: slo" and levels[40.0].rate is not None
    assert levels[40.0].rate.why.startswith("achieved 23.2 req/s is 42% below the offered 40")
    assert said[2].startswith("find-max probe 2: 40 req/s breaks them: ttft p99 0.25 s is over")
    assert said[4] == (
        "find-max probe 4: 23.7 req/s fails: saturated: achieved 21.1 req/s is 11% below the "
        "offered 23.7; a queue formed: the last half of the answers waited longer than the first, "
        "at least 10% below over 8 answers (1 run, 95%)"
    ), said[4]
    assert said[8].startswith("find-max probe 8: 21.5 req/s fails: not sure it kept up: "), said
    assert "over 48 answers (6 runs, 95%), across the 5% line" in said[8]
    assert all(lv.stats.ttft_p99_s <= 0.1 for r, lv in levels.items() if r <= 21.5)
    summary = result.summary(sweep.options)
    assert result.passed and summary.recommended_concurrency is not None
    assert summary.recommended_concurrency >= 4, "the most in flight at 20.8 req/s: the 4 slots"
    rows = jsonl(sweep.ctx.run.path / "tiers.jsonl")
    assert [r.get("offered_rate") for r in rows][1:] == list(fm.order), "written as probed"


def test_a_rate_search_whose_bottom_failed_unsure_never_says_an_slo_broke() -> None:
    """Seen beside CPU burners: the bottom probe, 5 req/s, failed only for being unsure it kept
    up (its p99 within the SLO), and the sweep said "sweep failed: no level met the SLOs (ttft
    p99 ≤ 0.5 s): 5 req/s already failed …". A rate probe passes on more than the SLOs: the
    headline now says no rate passed, and what a pass takes."""
    from calibrate.stages.sweep.find_max import FindMax
    from calibrate.stages.sweep.result import SweepResult

    unsure = "not sure it kept up: anywhere from 9% above to 7% below over 8 answers (1 run)"
    search = FindMax(
        None, 5.0, (5.0,), 8.0, failed_why=unsure, over="rates", bottom=5.0, start="--rates 5:8"
    )
    slo = SloConfig(ttft_p99_s=0.5)
    result = SweepResult((), 4, 0.1, None, "none", 0, slo=slo, find_max=search)
    assert result.reason == (
        "no rate passed (the SLOs, ttft p99 ≤ 0.5 s, met without saturating): 5 req/s already "
        f"failed (the bottom of the search, --rates 5:8): {unsure}; 1 probe (5)"
    ), result.reason
    over_c = replace(search, over="concurrency", failed_why="ttft p99 0.9 s over the SLO")
    assert replace(result, find_max=over_c).reason.startswith("no level met the SLOs (ttft p99")


def test_a_rate_boundary_placed_on_a_probe_unsure_it_kept_up_is_no_sure_boundary() -> None:
    """Seen beside CPU burners: a rate probe whose shortfall's interval crossed the 5 % line
    ("8.05 req/s achieved of 8 offered, anywhere from 17 % above to 5 % below") counted as
    failed, the search walked down through the noise and exited 0 naming a boundary below it,
    sure. A boundary whose first failing probe failed on that doubt alone is inconclusive,
    saying the interval; --conservative takes the highest probe below it that surely passed."""
    from calibrate.stages.sweep.find_max import find_max
    from calibrate.stages.sweep.rates import judge_rate
    from calibrate.stages.sweep.result import SweepResult
    from calibrate.stages.verdict.probe import Probe
    from tests.stage_fakes import CLEAN

    slo = SloConfig(ttft_p99_s=0.5)
    doubt = "achieved 8.05 req/s — anywhere from 17% above to 5% below over 16 answers"
    runs = [replace(CLEAN, ttft_p99_s=0.05)]  # within the SLO: the doubt is all it failed on
    eight = judge_rate(8, runs, slo, "", "", doubt)
    assert not eight.passed and eight.unsure == doubt
    assert judge_rate(8, runs, slo, "saturated: 30% short", "", doubt).unsure == ""  # surely
    history = [Probe(5, True), eight, Probe(6.5, True)]
    search = find_max(history, slo, 8, over="rates", bottom=5, start="--rates 5:8")
    assert (search.last_passing, search.first_failing) == (6.5, 8)
    result = SweepResult((), 4, 0.1, None, "none", 0, slo=slo, find_max=search)
    assert not result.passed
    assert result.inconclusive.startswith(
        f"inconclusive: the runs cannot tell whether 8 req/s keeps up: {doubt} — "
    ), result.inconclusive
    assert "--conservative" in result.what_to_do and "(6.5 req/s)" in result.what_to_do
    saturated = find_max(
        [Probe(5, True), replace(eight, unsure=""), Probe(6.5, True)], slo, 8, over="rates"
    )
    assert not saturated.unsure, "a probe that surely failed leaves the boundary sure"
    # an unsure probe inside the bracket a sure failure closes (within 10 %) settles nothing
    # more: the simulated 4-slot server's 21.5 unsure between 20.8 passed and 22.2 saturated
    closed = [Probe(20.8, True), Probe(22.2, False, why="saturated"), replace(eight, level=21.5)]
    assert not find_max(closed, slo, 40, over="rates").unsure
    walked = [Probe(5, True), eight, replace(eight, level=6.5), Probe(5.8, True)]
    assert [p.level for p in find_max(walked, slo, 8, over="rates").unsure] == [6.5]
