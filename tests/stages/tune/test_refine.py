"""``--search refine`` on a simulated N-slot server (``stage_fakes.SimulatedLoop``, fake clock):
the best of a 120-candidate grid in a fraction of the grid's restarts, a patience stop on a flat
landscape, a restart budget that a rerun continues with the same choices, and the Pareto front
with the point pin takes."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from calibrate.config import TuneSearch
from calibrate.io.store import RunDir
from calibrate.load.request import Request
from calibrate.load.window import LevelWindow
from calibrate.stages.tune.grid import Axis, Candidate, TunePlan
from calibrate.stages.tune.outcome import TuneOutcome
from calibrate.stages.tune.result import BestLevel, CandidateResult, Measurement
from calibrate.stages.tune.search import Tune
from calibrate.stages.tune.store import TuneStore
from tests.stage_fakes import SimulatedLoop, chat_body, close_runs, open_run

__all__ = ["close_runs"]  # the autouse fixture, used by being imported

LEVELS = (8, 16, 32, 64)  # closed-loop concurrency per candidate, as the sweep's levels
FEW_LEVELS = (8, 16)  # a fifth of LEVELS' simulated requests, where the best is not asked for
TOKENS = 100  # output tokens per answer
# slots (the engine's cap: decode slots) × a scheduler knob; a grid of 15 × 8 = 120 candidates
SLOTS = ("1", "2", "3", "4", "6", "8", "10", "12", "16", "20", "24", "32", "40", "48", "64")
CHUNK = ("256", "512", "1024", "2048", "4096", "8192", "16384", "32768")


def service_s(slots: int, chunk: int) -> float:
    """One answer's time on a slot: more slots share the memory bandwidth (slower each, fast
    beyond 20), a chunk far from 4096 wastes steps. Goodput = slots / service peaks at 20, 4096."""
    contention = 1 + (slots / 24) ** 3
    waste = 1 + 0.15 * abs(math.log2(chunk / 4096)) ** 1.5
    return float(0.05 * contention * waste)


@dataclass
class SimulatedEngine:
    """The Lifecycle a tune drives, with each candidate served by a simulated N-slot server
    (``N`` its ``slots`` flag) measured at every level, three runs a level, on a fake clock."""

    flat: bool = False  # every candidate serves the same (a landscape with nothing to find)
    # the levels each candidate is measured at: a test of what a budget or patience stops, or
    # of a rerun's choices, needs a landscape, not the best's own level (64 in flight, most of
    # a candidate's simulated requests)
    levels: tuple[int, ...] = LEVELS
    restarts: list[str] = field(default_factory=list)
    counter: Iterator[int] = field(default_factory=itertools.count)

    def _supply(self) -> Request:
        n = next(self.counter)  # a body the simulated server answers: one of 64 prompts, each
        prompt = f"p{n % 64}"  # answer made once (the sim's text is the mock's, and costs)
        return Request("/chat/completions", chat_body(prompt), (prompt,), n)

    def run(
        self, candidate: Candidate, rung: int, window: float, _run: RunDir, again: bool = False
    ) -> CandidateResult:
        self.restarts.append(candidate.id)
        slots = 4 if self.flat else int(candidate.value("slots") or 1)
        chunk = 4096 if self.flat else int(candidate.value("chunk") or 4096)
        cost = service_s(slots, chunk)
        # a run's requests take ±0.5 % of their time, by repeat: runs differ as on a quiet machine
        loop = SimulatedLoop(lambda c, repeat: cost * (1 + 0.005 * (repeat % 3 - 1)), slots=slots)
        best: BestLevel | None = None
        for level in self.levels:
            runs = []
            for _ in range(3):
                found = loop.closed_loop(self._supply, level, LevelWindow(0.25, 4 * level))
                runs.append(len(found.items) / found.total_s)
            items = sorted(runs)[1]
            if best is None or items > best.goodput_per_s * 1.02:
                best = BestLevel(
                    level, items, items, items * TOKENS, cost, cost, None, runs_per_s=tuple(runs)
                )
        measured = Measurement(best, (), 0, 0, None, None, None, "none", "")
        return CandidateResult(candidate, rung, window, True, served=True, measurement=measured)


def _plan(slots: tuple[str, ...] = SLOTS, chunk: tuple[str, ...] = CHUNK) -> TunePlan:
    axes = (Axis("slots", slots, "--grid"), Axis("chunk", chunk, "--grid"))
    return TunePlan("custom", axes, 8, None, (), cap_passed=False)


def _tune(
    run: RunDir, engine: SimulatedEngine, search: TuneSearch, plan: TunePlan, **kw: object
) -> Tune:
    return Tune(plan, TuneStore(run), engine, search, 1.0, 0.0, notify=lambda _: None, **kw)  # type: ignore[arg-type]


def _winner(outcome: TuneOutcome) -> str:
    assert outcome.winner is not None
    return outcome.winner.candidate.describe()


def _run(tmp_path: Path, run_id: str | None = None) -> RunDir:
    return open_run(tmp_path, "tune", run_id)


def test_refine_finds_the_grids_best_in_a_fraction_of_its_restarts(tmp_path: Path) -> None:
    """The grid's best of all 120 is the landscape's own maximum (``service_s``: 20 slots at
    chunk 4096, 2.6 % above the next, so ±0.5 % runs cannot swap them); the grid is run around
    it (9 candidates: measuring all 120 took 30 s of this suite), refine over all 120."""
    plan = _plan()
    best = max(
        plan.candidates(),
        key=lambda c: (
            int(c.value("slots") or 1)
            / service_s(int(c.value("slots") or 1), int(c.value("chunk") or 4096))
        ),
    )
    assert best.describe() == "slots=20, chunk=4096"
    grid_engine = SimulatedEngine()
    near = _plan(SLOTS[8:11], CHUNK[3:6])  # 16, 20, 24 slots × chunks 2048, 4096, 8192
    grid = _tune(_run(tmp_path), grid_engine, "grid", near).run()
    assert len(grid_engine.restarts) == near.size == 9
    assert _winner(grid) == best.describe()  # what the grid measures is the landscape's best
    engine = SimulatedEngine()
    found = _tune(_run(tmp_path), engine, "refine", plan, restarts=20).run()
    assert plan.size == 120 and _winner(found) == best.describe()
    assert found.complete and found.stopped.startswith(("converged", "patience"))
    assert len(engine.restarts) == found.restarts <= 10 < 20 < plan.size / 4  # 8 when written
    assert len(set(engine.restarts)) == len(engine.restarts), "no candidate restarted twice"
    # the front: the pinned point and why; a point off it is beaten on both axes by one on it
    front = found.front()
    pinned = next(p for p in front if p.pinned)
    assert pinned.flags == "slots=20, chunk=4096" and pinned.on_front
    reason = found.pin_reason(front)
    assert reason.startswith("pin takes ") and "(--rank-by goodput)" in reason
    assert "on the Pareto front" in reason
    for point in front:
        if not point.on_front:
            assert any(point.dominated_by(q) for q in front if q.on_front)
    assert found.summary({}).details["pareto"][0]["on_front"] is True


def test_a_flat_landscape_stops_on_patience_after_one_plus_k_restarts(tmp_path: Path) -> None:
    engine = SimulatedEngine(flat=True, levels=FEW_LEVELS)
    outcome = _tune(_run(tmp_path), engine, "refine", _plan(), patience=4).run()
    assert len(engine.restarts) == 1 + 4
    assert outcome.stopped.startswith("patience: 4 candidates in a row without a significant gain")
    assert outcome.complete and not outcome.untested


def test_a_restart_budget_stops_and_a_rerun_continues_with_the_same_choices(
    tmp_path: Path,
) -> None:
    plan = _plan(SLOTS[4:12], CHUNK[:6])
    whole = SimulatedEngine(levels=FEW_LEVELS)
    _tune(_run(tmp_path), whole, "refine", plan).run()
    assert len(whole.restarts) > 5
    run = _run(tmp_path)
    cut_engine = SimulatedEngine(levels=FEW_LEVELS)
    cut = _tune(run, cut_engine, "refine", plan, restarts=5).run()
    assert cut_engine.restarts == whole.restarts[:5]
    assert not cut.complete and cut.spent_by == "--restarts"
    assert [c.id for c in cut.untested] == [whole.restarts[5]], "the next it would measure"
    rest = SimulatedEngine(levels=FEW_LEVELS)
    done = _tune(_run(tmp_path, run.run_id), rest, "refine", plan).run()
    assert rest.restarts == whole.restarts[5:], "the measured five are not restarted"
    assert done.complete and done.restarts == len(whole.restarts)


def test_the_grid_keeps_to_a_restart_budget_too(tmp_path: Path) -> None:
    engine = SimulatedEngine(levels=FEW_LEVELS)
    outcome = _tune(_run(tmp_path), engine, "grid", _plan(), restarts=7).run()
    assert len(engine.restarts) == 7 and len(outcome.untested) == 120 - 7
    assert outcome.spent_by == "--restarts" and not outcome.complete
