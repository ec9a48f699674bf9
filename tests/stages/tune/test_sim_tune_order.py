"""Candidates are measured one after another: a machine that slows as the tune goes on reads as
a lead of whichever was measured first. On the simulated server (a virtual clock) each start
serves slower than the one before, and tune's sure lead is measured again in the other order
(A B B A) before it is claimed."""

from __future__ import annotations

from pathlib import Path

from calibrate.stages.tune.grid import TunePlan, build_plan
from calibrate.stages.tune.outcome import TuneOutcome
from tests.stage_fakes import close_runs
from tests.stages.tune.sim_engine import PLACEHOLDERS, SweepEngine, sim_tune

__all__ = ["close_runs"]  # the autouse fixture, used by being imported


def _plan(slots: str, kv_tokens: str = "50000") -> TunePlan:
    grid = [f"slots={slots}", f"kv_tokens={kv_tokens}", "memory_fraction=0.8"]
    return build_plan(
        "custom", 4, config_grid=grid, cli_grid=[], memory_fractions=(), placeholders=PLACEHOLDERS
    )


def _ids(outcome: TuneOutcome) -> list[str]:
    return [r.candidate.id for r in outcome.ranked]


def test_a_lead_that_the_order_of_measuring_made_is_inconclusive(tmp_path: Path) -> None:
    """Two candidates that differ only in a flag the server ignores, on a machine 50 % slower
    at each start: c01, measured first, read 50 % faster with three tight runs each, and tune
    named it the winner, "+50 %", significant. Measured again the other way round (c02, then
    c01) c02 leads: the order decided it — inconclusive, no winner, and the line says why."""
    engine = SweepEngine(tmp_path, repeats=3, drift=0.5)
    said: list[str] = []
    outcome = sim_tune(tmp_path, engine, _plan("4", "50000,60000"), said=said)
    assert _ids(outcome) == ["c01", "c02"], "measured first, read faster"
    assert [s for s, _, _ in engine.started] == ["c01", "c02", "c02 again", "c01 again"]
    assert outcome.swapped and outcome.winner is None and outcome.lead is None
    text = outcome.inconclusive
    assert text.startswith("inconclusive: the runs cannot tell whether c01 adds 10 % over c02")
    assert "measured again in the other order, c02 led c01" in text
    assert "the order they were measured in decided the lead" in text
    assert any("both measured again in the other order" in line for line in said)
    assert outcome.summary({}).winner is None


def test_a_real_lead_survives_the_second_measurement_and_a_rerun_keeps_it(
    tmp_path: Path,
) -> None:
    """Four slots against two on a machine 10 % slower at each start: four slots lead in both
    orders, the lead is claimed on the runs of both measurements; a rerun of the run measures
    nothing again."""
    engine = SweepEngine(tmp_path, repeats=3, drift=0.1)
    outcome = sim_tune(tmp_path, engine, _plan("2,4"), run_id="order")
    assert [s for s, _, _ in engine.started] == ["c01", "c02", "c02 again", "c01 again"]
    assert outcome.winner is not None and outcome.winner.candidate.id == "c02"
    assert not outcome.swapped and not outcome.inconclusive
    lead = outcome.lead
    assert lead is not None and lead.significant is True and lead.runs == (6, 6)
    assert outcome.restarts == 4
    again = SweepEngine(tmp_path, repeats=3, drift=0.1)
    resumed = sim_tune(tmp_path, again, _plan("2,4"), run_id="order")
    assert again.started == [], "what was measured, the second measurements too, is kept"
    assert resumed.lead is not None and resumed.lead.significant is True


def test_a_budget_that_leaves_no_second_measurement_leaves_the_lead_no_claim(
    tmp_path: Path,
) -> None:
    """--restarts 2 over two candidates: nothing is left to measure them again, so the lead
    is the ranking's pick, said as no claim, and why."""
    engine = SweepEngine(tmp_path, repeats=3, drift=0.1)
    outcome = sim_tune(tmp_path, engine, _plan("2,4"), restarts=2)
    assert [s for s, _, _ in engine.started] == ["c01", "c02"]
    assert outcome.winner is not None and outcome.winner.candidate.id == "c02"
    lead = outcome.lead
    assert lead is not None and lead.significant is None
    assert lead.caveat() == (
        " (not measured again in the other order: --restarts spent, so not a claim)"
    )
    assert outcome.lead_json()["unchecked"] == "--restarts spent"
