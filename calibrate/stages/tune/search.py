"""Stage C″: search the engine's own flags, one restart per candidate, and rank them (SPEC §5.12).

First the memory step (vLLM ``--gpu-memory-utilization``, SGLang ``--mem-fraction-static``, a
custom ``{memory_fraction}``): the highest fraction at which the most demanding candidate starts
and serves one request, stepping down on a start failure; it is then fixed for the grid. Then
every candidate (``--search grid``), or successive halving (``--search halving``: all at a short
window, the better half again at twice the window, … the last two at the full window), or
successive refinement around the best so far (``--search refine``, ``tune.refine``: it stops on
``--patience`` or when no neighbour is better). Each finished measurement is on disk before the
next starts; a rerun with the same grid fingerprint skips what is there (refine replays its
choices on them). ``--budget-s`` and ``--restarts`` are checked before each start; what they
left is reported.
The winner's margin over the runner-up is claimed only when their runs' interval separates
(``tune.outcome``) — and, since candidates are measured one after another, only when it holds
with the two measured again in the other order (``_again``; two more restarts, within the
budgets).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from calibrate.confidence import DEFAULT_LEVEL
from calibrate.config import TuneSearch
from calibrate.gpu.energy import RankBy
from calibrate.server.exit_status import ended_words
from calibrate.stages.tune.candidate import Lifecycle
from calibrate.stages.tune.grid import Candidate, TunePlan
from calibrate.stages.tune.outcome import TuneOutcome, healthy, rank
from calibrate.stages.tune.refine import Rule, Stopped, replay
from calibrate.stages.tune.result import CandidateResult, MemoryProbe
from calibrate.stages.tune.store import TuneStore

Notify = Callable[[str], None]


def schedule(n: int, search: TuneSearch) -> list[tuple[int, float]]:
    """(candidates measured, window fraction) per rung: one full rung for the grid; for
    halving the field halves (rounded up) until two are left, the window doubling up to 1;
    refine measures at most every candidate once, at the full window."""
    if search != "halving" or n <= 2:
        return [(n, 1.0)]
    sizes = [n]
    while sizes[-1] > 2:
        sizes.append(math.ceil(sizes[-1] / 2))
    last = len(sizes) - 1
    return [(size, 2.0 ** (r - last)) for r, size in enumerate(sizes)]


@dataclass
class Tune:
    """Runs the memory step and the search for one tune run, writing each result as it ends."""

    plan: TunePlan
    store: TuneStore
    lifecycle: Lifecycle
    search: TuneSearch
    window: float  # [tune] window: every rung's window is this fraction of the sweep's
    budget_s: float
    notify: Notify
    on_result: Callable[[CandidateResult], None] = lambda result: None
    clock: Callable[[], float] = time.monotonic
    rank_by: RankBy = "goodput"
    level: float = DEFAULT_LEVEL  # [confidence] level: the winner's margin is tested at
    gain_min: float = 0.10
    conservative: bool = False
    restarts: int = (
        0  # at most this many candidate restarts in the run (resumed ones count); 0: any
    )
    patience: int = 6  # refine: candidates in a row without a significant gain
    slos: bool = False  # SLOs are set: goodput counts the answers within them
    done: dict[tuple[int, int], CandidateResult] = field(default_factory=dict)
    again: dict[tuple[int, int], CandidateResult] = field(default_factory=dict)  # measured again

    def __post_init__(self) -> None:
        self.deadline = self.clock() + self.budget_s if self.budget_s > 0 else math.inf
        for result in self.store.results():
            kept = self.again if result.again else self.done
            kept[(result.rung, result.candidate.index)] = result

    def _out_of_time(self) -> bool:
        return self.clock() >= self.deadline

    def _spent(self) -> str:
        """Which budget stops the next start ("" while neither does)."""
        if self.restarts and len(self.done) + len(self.again) >= self.restarts:
            return "--restarts"
        return "--budget-s" if self._out_of_time() else ""

    def memory_step(self) -> tuple[str | None, tuple[MemoryProbe, ...], bool]:
        """(the fixed fraction, the probes, whether the budget ran out before one passed)."""
        key = self.plan.memory_key
        if key is None:
            return None, (), False
        probes = {p.fraction: p for p in self.store.probes()}
        for fraction in self.plan.memory_fractions:
            probe = probes.get(fraction)
            if probe is None:
                if self._out_of_time():
                    return None, tuple(probes.values()), True
                self.notify(f"memory step: {key}={fraction} (the most demanding candidate)")
                probe = self.lifecycle.probe_memory(self.plan.probe(fraction), fraction)
                self.store.append_probe(probe)
                probes[fraction] = probe
                if not probe.ok:
                    code = (
                        f" ({ended_words(probe.exit_code)})" if probe.exit_code is not None else ""
                    )
                    self.notify(
                        f"  {key}={fraction} did not start and serve{code}: {probe.error}; stepping down"
                    )
            if probe.ok:
                self.notify(f"memory step: {key}={fraction} starts and serves; fixed for the grid")
                return fraction, tuple(probes.values()), False
        return None, tuple(probes.values()), False

    def run(self) -> TuneOutcome:
        memory, probes, spent = self.memory_step()
        plan = self.plan
        if plan.memory_key is not None and memory is None:
            untried = plan.candidates(None)
            return TuneOutcome(
                plan,
                None,
                probes,
                (),
                untried,
                spent,
                not spent,
                self.level,
                rank_by=self.rank_by,
                slos=self.slos,
            )
        pool = list(plan.candidates(memory))
        if self.search == "refine":
            return self._refine(memory, probes, pool)
        untested: tuple[Candidate, ...] = ()
        upto: int | None = None  # a rung cut short: everyone compared at the rung before it
        for rung, (size, rung_window) in enumerate(schedule(len(pool), self.search)):
            if rung > 0:
                previous = [
                    self.done[(rung - 1, c.index)] for c in pool if (rung - 1, c.index) in self.done
                ]
                pool = [r.candidate for r in rank(previous, self.rank_by) if healthy(r)][:size]
                self.notify(
                    f"halving rung {rung}: {', '.join(c.id for c in pool)} at {rung_window:g}× the window"
                )
            left = self._measure(pool, rung, rung_window * self.window)
            if left:
                untested, upto = left, rung - 1 if rung > 0 else None
                break
        return self._outcome(memory, probes, untested, "", upto)

    def _refine(
        self, memory: str | None, probes: tuple[MemoryProbe, ...], pool: list[Candidate]
    ) -> TuneOutcome:
        """Successive refinement: the walk replayed on what is measured names the next
        candidate (or why it stops); each is measured at the full window."""
        rule = Rule(self.patience, self.gain_min, self.level, self.rank_by)
        while True:
            found = {index: r for (rung, index), r in self.done.items() if rung == 0}
            _, ask = replay(self.plan.axes, pool, found, rule)
            if isinstance(ask, Stopped):
                return self._outcome(memory, probes, (), ask.text)
            if self._spent():
                return self._outcome(memory, probes, (ask.candidate,), "")
            self.notify(f"refine: {ask.candidate.id}, {ask.why}")
            self._measure([ask.candidate], 0, self.window)

    def _outcome(
        self,
        memory: str | None,
        probes: tuple[MemoryProbe, ...],
        untested: tuple[Candidate, ...],
        stopped: str,
        upto: int | None = None,
    ) -> TuneOutcome:
        """Every candidate's latest result, ranked; ``upto``: a halving cut short during a rung
        ranks them all at the rung before it, where each was measured at one window — the
        survivors measured again at the longer window are never ranked above those not yet
        (one at 0.5×, another at 1×: a pick the runs say was worse, once called "about equal")."""
        latest: dict[int, CandidateResult] = {}
        for (rung, index), result in sorted(self.done.items()):
            if upto is None or rung <= upto:
                latest[index] = result
        return self._again(self._ranked(memory, probes, latest, untested, stopped))

    def _ranked(
        self,
        memory: str | None,
        probes: tuple[MemoryProbe, ...],
        latest: dict[int, CandidateResult],
        untested: tuple[Candidate, ...],
        stopped: str,
    ) -> TuneOutcome:
        return TuneOutcome(
            self.plan,
            memory,
            probes,
            tuple(rank(list(latest.values()), self.rank_by)),
            untested,
            bool(untested),
            level=self.level,
            gain_min=self.gain_min,
            conservative=self.conservative,
            rank_by=self.rank_by,
            slos=self.slos,
            stopped=stopped,
            restarts=len(self.done) + len(self.again),
            spent_by=self._spent() if untested else "",
        )

    def _again(self, outcome: TuneOutcome) -> TuneOutcome:
        """A lead the runs call sure, measured again in the other order: the one measured later
        first, then the other (A B B A: a machine or server that drifts steadily weighs on both
        alike); the outcome judged on both measurements. A budget that leaves no room for it
        leaves the lead no claim, saying so."""
        top, second, lead = outcome.top, outcome.second, outcome.lead
        if top is None or second is None or lead is None or not lead.significant:
            return outcome
        if outcome.doubt is not None:
            return outcome
        order = [r for r in self.done.values() if r is top or r is second]
        pair = [(r.rung, r.candidate.index) for r in reversed(order)]  # the later one first
        for (rung, index), result in zip(pair, reversed(order), strict=True):
            if (rung, index) in self.again:
                continue
            spent = self._spent()
            if spent:
                return replace(outcome, unchecked=f"{spent} spent")
            if not self.again:
                self.notify(
                    f"{top.candidate.id} leads {second.candidate.id}: both measured again in the "
                    "other order (candidates measured one after another can read a machine that "
                    "slowed between them as a difference between them)"
                )
            self.notify(f"candidate {result.candidate.id}: restart and measure again")
            found = self.lifecycle.run(
                result.candidate, rung, result.window, self.store.run, again=True
            )
            found = replace(found, again=True)
            self.store.append(found)
            self.again[(rung, index)] = found
            self.on_result(found)
        again = tuple(self.again[key] for key in pair)
        outcome = replace(outcome, again=again, restarts=len(self.done) + len(self.again))
        failed = next((r for r in again if not healthy(r)), None)
        if failed is not None:  # nothing to judge the lead on a second time
            return replace(outcome, unchecked=f"{failed.candidate.id} {failed.status} again")
        return outcome

    def _measure(self, pool: list[Candidate], rung: int, window: float) -> tuple[Candidate, ...]:
        """Measure the pool's unmeasured candidates; those the budget left untested."""
        for n, candidate in enumerate(pool):
            if (rung, candidate.index) in self.done:
                continue
            if self._spent():
                return tuple(c for c in pool[n:] if (rung, c.index) not in self.done)
            self.notify(f"candidate {candidate.id} ({candidate.describe()}): restart and measure")
            result = self.lifecycle.run(candidate, rung, window, self.store.run)
            self.store.append(result)
            self.done[(rung, candidate.index)] = result
            self.on_result(result)
        return ()
