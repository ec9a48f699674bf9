"""A tune's ratios on the simulated server (``stage_fakes.SimulatedLoop``, a virtual clock): each
candidate's ``{slots}`` is the simulated server's decode slots, measured by the real ``Sweep``
and read back as tune reads it (``stages.tune.measure``), driven by the real ``Tune``: the memory
step, the ranking by slots with each candidate's best concurrency, successive halving's longer
window, goodput within the SLOs over the steady window, and a budget a rerun resumes.

These are the ratio and verdict claims of tests/test_tune.py and tests/test_tune_slo.py, whose
HTTP tests keep what is about the CLI (the managed server, the files, pin, the lines said)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from calibrate.config import SloConfig
from calibrate.stages.sweep.levels import Level
from calibrate.stages.sweep.result import SweepResult
from calibrate.stages.tune.grid import Candidate, TunePlan
from calibrate.stages.tune.measure import measurement
from calibrate.stages.tune.outcome import TuneOutcome
from calibrate.stages.tune.result import CandidateResult
from calibrate.stages.tune.search import Tune
from calibrate.stages.tune.store import TuneStore
from tests.stage_fakes import close_runs, open_run
from tests.stages.tune.sim_engine import SweepEngine, sim_plan, sim_tune
from tests.tier_helpers import stats_of

__all__ = ["close_runs"]  # the autouse fixture, used by being imported


def _slots(result: CandidateResult) -> str:
    return str(result.candidate.value("slots"))


def test_the_memory_step_then_every_candidate_ranked_by_its_slots(tmp_path: Path) -> None:
    """0.9 does not start (an OOM at load), 0.8 does and is fixed for the grid; then 1, 2 and 4
    slots at ~0.1 s an answer serve 10, 20 and 40 a second, each at its slot count in flight
    (one slot gains nothing from a second request in flight): the winner is 4 slots, at
    concurrency 4, 100 % over the runner-up."""
    engine = SweepEngine(tmp_path)
    said: list[str] = []
    outcome = sim_tune(tmp_path, engine, sim_plan("slots=1,2,4", (0.9, 0.8)), said=said)
    assert outcome.memory == "0.8"
    first, second = outcome.probes
    assert (first.fraction, first.started, first.exit_code) == ("0.9", False, 1)
    assert (second.fraction, second.ok) == ("0.8", True)
    assert said[:3] == [
        "memory step: memory_fraction=0.9 (the most demanding candidate)",
        "  memory_fraction=0.9 did not start and serve (exit code 1): the server exited "
        "(exit code 1); stepping down",
        "memory step: memory_fraction=0.8 (the most demanding candidate)",
    ]
    ranked = outcome.ranked
    assert [_slots(r) for r in ranked] == ["4", "2", "1"]
    assert all(r.candidate.value("memory_fraction") == "0.8" for r in ranked)
    goodput = [round(r.goodput_per_s, 6) for r in ranked]
    assert goodput == [40.0, 20.0, 10.0]
    assert [r.best.concurrency for r in ranked if r.best] == [4, 2, 1]
    assert outcome.margin == pytest.approx(1.0)
    summary = outcome.summary({})
    assert summary.winner is not None
    assert summary.winner.to_json() == {
        "batch_size": 4,
        "concurrency": 4,
        "flags": {"slots": "4", "kv_tokens": "50000", "memory_fraction": "0.8"},
    }


def test_halving_measures_the_better_half_again_at_twice_the_window(tmp_path: Path) -> None:
    """Three candidates at half the window, then the better two (2 and 4 slots) at the full
    window, whose levels' runs last twice as long; the winner is from the last rung."""
    engine = SweepEngine(tmp_path, level_s=1.0)
    said: list[str] = []
    outcome = sim_tune(tmp_path, engine, sim_plan("slots=1,2,4"), "halving", said=said)
    rung_0 = [("c01", 0, 0.5), ("c02", 0, 0.5), ("c03", 0, 0.5)]
    assert engine.started == [*rung_0, ("c03", 1, 1.0), ("c02", 1, 1.0)]
    assert "halving rung 1: c03, c02 at 1× the window" in said
    first_level = {
        key: next(w.min_s for c, w, _ in loop.runs if c == 1) for key, loop in engine.loops.items()
    }
    assert first_level[("c02", 0)] == 0.5 and first_level[("c02", 1)] == 1.0
    assert outcome.winner is not None and _slots(outcome.winner) == "4"
    assert outcome.winner.rung == 1


def test_goodput_is_the_throughput_within_the_slos_over_the_steady_window(tmp_path: Path) -> None:
    """[slo] e2e p99 ≤ 0.3 s with 8 [determinism] copies after each level's window: a level
    whose every request answers within the bound shows a goodput equal to its throughput (the
    copies sent after the window count in neither); one slot with four in flight makes each
    request wait 0.3 s before its 0.1 s, and its goodput is nothing."""
    slo = SloConfig(e2e_p99_s=0.3)
    engine = SweepEngine(tmp_path, slo=slo, copies=8)
    outcome = sim_tune(tmp_path, engine, sim_plan("slots=1,2"))
    by_slots = {_slots(r): r for r in outcome.ranked}
    assert list(by_slots) == ["2", "1"]
    for slots, result in by_slots.items():
        assert result.measurement is not None
        for level in result.measurement.levels:
            good, items = level["goodput_per_s"], level["items_per_s"]
            assert good <= items * (1 + 1e-6), (slots, level)
            if level["concurrency"] <= int(slots):
                assert good == pytest.approx(items, rel=1e-3), (slots, level)
    four = next(lv for lv in by_slots["1"].measurement.levels if lv["concurrency"] == 4)  # type: ignore[union-attr]
    assert four["goodput_per_s"] < 0.5 * four["items_per_s"]
    best = {s: r.best.concurrency for s, r in by_slots.items() if r.best}
    assert best == {"2": 2, "1": 1}


def test_a_budget_leaves_candidates_untested_and_a_rerun_measures_only_those(
    tmp_path: Path,
) -> None:
    """--budget-s is checked before each start, on tune's clock: the first candidate's sweep
    spends it, the second is left untested; a rerun of the same run measures the second only."""
    plan = sim_plan("slots=1,2")
    engine = SweepEngine(tmp_path)
    cut = sim_tune(tmp_path, engine, plan, run_id="cut", budget_s=0.3)
    assert [r.candidate.id for r in cut.ranked] == ["c01"] and engine.clock.now > 0.3
    assert [c.id for c in cut.untested] == ["c02"] and not cut.complete
    assert cut.spent_by == "--budget-s"
    again = SweepEngine(tmp_path, clock=engine.clock)
    done = sim_tune(tmp_path, again, plan, run_id="cut")
    assert [s for s, _, _ in again.started] == ["c02"], "the measured one is not restarted"
    assert done.complete and [_slots(r) for r in done.ranked] == ["2", "1"]


def _level_at(concurrency: int, per_s: float, running: int, queued: int = 0) -> Level:
    """A level at batch 4 whose runs served ``per_s`` while the server's running gauge peaked at
    ``running`` (with ``queued`` waiting meanwhile)."""
    stats = stats_of(
        4,
        concurrency,
        items_per_s=per_s,
        server_running_max=running,
        server_queue_max=queued,
        running_while_queued=running if queued else None,
        running_metric="vllm:num_requests_running",
    )
    runs = tuple(replace(stats, items_per_s=per_s * f) for f in (0.99, 1.0, 1.01))
    return Level(stats, runs, None, False, "pass", False)


def test_a_candidate_is_measured_at_its_own_cap_never_above_it() -> None:
    """A custom engine's ``--slots 2`` under the ladder's batch 4: the sweep of the candidate saw
    it run 2 at once while 2 waited, and itself never recommends concurrency 4 there; tune took
    4 (the most goodput, served from its queue) and pin wrote batch 4, concurrency 4 beside
    ``--slots 2`` — a cap the server never ran (SPEC §6.1, §5.14)."""
    levels = (_level_at(1, 10.0, 1), _level_at(2, 20.0, 2), _level_at(4, 30.0, 2, queued=2))
    result = SweepResult(levels, 4, 0.1, None, "none", 0)
    measured = measurement(result, SloConfig(), 0.1)
    assert measured.best is not None and measured.best.concurrency == 2
    assert measured.server_slots == 2
    candidate = Candidate(0, (("slots", "2"),), 4)
    found = CandidateResult(candidate, 0, 1.0, True, served=True, measurement=measured)
    assert found.cap == 2
    back = CandidateResult.from_json(found.to_json())
    assert back is not None and back.cap == 2, "a resumed tune reads the cap it ran at"
    plan = TunePlan("custom", (), 4, None, ())
    setting = TuneOutcome(plan, None, (), (found,), (), False).summary({}).winner
    assert setting is not None and (setting.batch_size, setting.concurrency) == (2, 2)


def test_a_halving_cut_during_a_rung_ranks_everyone_at_the_rung_before(tmp_path: Path) -> None:
    """--restarts 4 over three candidates: all three at half the window, then c03 again at the
    full one, and the budget ends before c02's. c03's longer-window result was ranked above
    every half-window one whatever it measured (a later rung first): a pick its runs could show
    was worse, compared across windows. A rung cut short ranks everyone at the rung before."""
    engine = SweepEngine(tmp_path, level_s=1.0)
    run = open_run(tmp_path / "runs", "tune", None)
    tune = Tune(
        sim_plan("slots=1,2,4"),
        TuneStore(run),
        engine,  # type: ignore[arg-type]
        "halving",
        1.0,
        0.0,
        lambda text: None,
        clock=engine.clock,
        restarts=4,
    )
    outcome = tune.run()
    assert engine.started[-1] == ("c03", 1, 1.0) and [c.id for c in outcome.untested] == ["c02"]
    assert [r.rung for r in outcome.ranked] == [0, 0, 0]
    assert outcome.winner is not None and _slots(outcome.winner) == "4"
    assert outcome.winner.window == 0.5
