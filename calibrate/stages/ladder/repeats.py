"""More rounds for the tiers the ladder's setting rests on, when their rounds cannot tell them
apart (SPEC §5.14). The ``Ladder`` is built on it.

Once every tier ran, each pair the setting's rule leaves unsure (``ladder.setting.choose``) is
repeated a round at a time — the tier with fewer rounds first, so the rounds go A B A B … and a
drift of the machine weighs on both — until the rounds settle it or both tiers have the ladder's
round bound. A managed llama.cpp is restarted (and warmed) at ``--parallel B`` before each round
of another B, as before each tier. Each round is measured as the tier's own were: the machine's
noise beside it, its line in rounds.jsonl; the tier's row is written again to tiers.jsonl from all
its rounds (the later line supersedes) and said as a line, not a second row of the live table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from calibrate.gpu.engine_metrics import Gauge, counted_rise
from calibrate.gpu.noise import NoiseMark, NoiseMeter
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.gpu.vram import VramMonitor
from calibrate.gpu.vram.peaks import WindowPeak
from calibrate.load.items import ItemResult
from calibrate.load.sender import Sender
from calibrate.stages.context import StageContext
from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.ladder.result import WarmUp
from calibrate.stages.ladder.setting import choose, measured, tier_point
from calibrate.stages.measure.item_records import record_round
from calibrate.stages.measure.tier import Tier, Verdict
from calibrate.stages.measure.tier_run import client_bound_since, client_mark
from calibrate.stages.measure.tiers import Stats
from calibrate.stages.verdict.knee import judge, spread_of
from calibrate.stages.verdict.separation import futile, next_of_pair


@dataclass
class TierRaw:
    """A tier's items and VRAM windows over all its rounds (its aggregate is made from them)."""

    items: list[ItemResult] = field(default_factory=list)
    peaks: list[WindowPeak] = field(default_factory=list)


class TierRepeats:
    """Rounds again for a ``Ladder`` (a dataclass with these fields and methods)."""

    ctx: StageContext
    options: LadderOptions
    monitor: VramMonitor
    history: list[Tier]
    baseline: str | None
    raw: dict[int, TierRaw]
    noise: NoiseMeter | None
    note: Callable[[str], None]  # a line for the user, as the ladder goes
    before_tier: Callable[[int], bool]
    selfload: SelfLoadMonitor | None
    sender: Sender

    if TYPE_CHECKING:  # the Ladder's own, used here

        def warm_up(self, batch: int) -> WarmUp: ...

        def run_round(
            self, batch: int, round_no: int
        ) -> tuple[list[ItemResult], float, int, WindowPeak]: ...

        def measured(
            self,
            batch: int,
            round_no: int | None,
            items: Sequence[ItemResult],
            total_s: float,
            peaks: list[WindowPeak],
            baseline: str | None,
            waves: int,
        ) -> Stats: ...

        def aggregate(
            self,
            batch: int,
            rounds: Sequence[Stats],
            items: Sequence[ItemResult],
            peaks: list[WindowPeak],
            baseline: str | None,
        ) -> Stats: ...

        def preemption_counter(self) -> Gauge | None: ...

        def read_cap_back(self, batch: int) -> None: ...

        def verdict_of(
            self, agg: Stats, rounds: Sequence[Stats], last: Tier | None
        ) -> tuple[Verdict, str]: ...

        def accounted(self, tier: Tier) -> Tier: ...

    def noise_mark(self) -> NoiseMark | None:
        return self.noise.mark() if self.noise is not None else None

    def with_noise(self, stats: Stats, mark: NoiseMark | None) -> Stats:
        """``stats`` with what the rest of the machine did since ``mark``."""
        if self.noise is None or mark is None:
            return stats
        return replace(stats, noise=self.noise.since(mark))

    def settle(self) -> None:
        """Repeat the pairs of tiers the setting still doubts (see the module's doc)."""
        if self.options.axis != "batch":
            return
        tried: set[tuple[int, int]] = set()
        while True:
            found = choose(self.history, self.options.gain_min, self.options.confidence)
            pairs = [(a.batch_size, b.batch_size) for a, b in (found.doubts if found else ())]
            left = [pair for pair in pairs if pair not in tried]
            if not left:
                return
            tried.add(left[0])
            self.separate(*left[0])

    def tier_of(self, batch: int) -> Tier:
        return next(t for t in self.history if t.batch_size == batch)

    def tier_before(self, batch: int) -> Tier | None:
        """The tier run just before ``batch``'s (its latency rule's base), None for the first."""
        at = next(n for n, t in enumerate(self.history) if t.batch_size == batch)
        return self.history[at - 1] if at else None

    def separate(self, base: int, cur: int) -> None:
        """Rounds of tiers ``base`` and ``cur``, interleaved, until the rounds settle whether
        ``cur`` adds ``gain_min`` over ``base`` or both have the round bound."""
        o = self.options
        while True:
            a, b = self.tier_of(base), self.tier_of(cur)
            if not (a.passed and b.passed):
                return  # a round again failed: the ladder's verdict says so
            spread = spread_of([tier_point(t) for t in measured(self.history)])
            pa, pb = tier_point(a), tier_point(b)
            if judge(pa, pb, o.gain_min, o.confidence, spread) != "unsure":
                return
            which = next_of_pair((len(a.rounds), len(b.rounds)), o.round_bound)
            if which is None:
                return
            if futile(pa.sample, pb.sample, o.gain_min, o.confidence, spread, o.round_bound):
                self.note(
                    f"batch {cur} against batch {base}: even {o.round_bound} rounds each, as "
                    "noisy as these, could not tell them apart — not repeated"
                )
                return
            self.round_again((base, cur)[which])

    def round_again(self, batch: int) -> None:
        """One more round of a tier that ran: its row again from all its rounds."""
        if self.before_tier(batch) and self.options.warmup_waves:
            self.warm_up(batch)  # a restarted engine is cold again
        self.read_cap_back(batch)
        tier = self.tier_of(batch)
        round_no = len(tier.rounds) + 1
        mark = self.noise_mark()
        client = client_mark(self.selfload, self.sender)
        before = self.preemption_counter()
        items, seconds, waves, peak = self.run_round(batch, round_no)
        after = self.preemption_counter()
        # a round run while calibrate itself was the limit marks its tier, as its first did
        starved = client_bound_since(self.selfload, self.sender, client)
        stats = self.measured(batch, round_no, items, seconds, [peak], self.baseline, waves)
        stats = self.with_noise(stats, mark)
        record_round(self.ctx, stats, self.monitor.source)
        raw = self.raw.setdefault(batch, TierRaw())
        raw.items += items
        raw.peaks.append(peak)
        rounds = (*tier.rounds, stats)
        agg = self.aggregate(batch, rounds, raw.items, raw.peaks, self.baseline)
        preempted, metric = tier.stats.preemptions, tier.stats.preemption_metric
        if (rise := counted_rise([before, after])) is not None:  # across a restart, too
            preempted = (preempted or 0) + round(rise.value)
            metric = rise.metric
        agg = replace(agg, preemptions=preempted, preemption_metric=metric)
        # judged again from all its rounds: a cap, a preemption or a breach the new round showed
        # stops the tier as it would have the first time (its rows and its verdict agree)
        verdict, reason = self.verdict_of(agg, rounds, self.tier_before(batch))
        if stats.errors:
            reason = (
                f"batch {batch}: {stats.errors} of {stats.items} requests failed "
                f"({stats.kinds_text}) in round {round_no}, run again to tell it from another tier"
            )
        bound = tier.client_bound or starved
        again = self.accounted(
            replace(
                tier, stats=agg, rounds=rounds, verdict=verdict, reason=reason, client_bound=bound
            )
        )
        self.history[self.history.index(tier)] = again
        self.ctx.run.append("tiers.jsonl", again.to_json())
        self.note(
            f"batch {batch} again, round {round_no} (to tell it from another tier, interleaved): "
            f"{stats.items_per_s:.3g} items/s; {agg.items_per_s:.3g} over its {len(rounds)} rounds"
            + (f" — calibrate itself was the limit during it ({starved})" if starved else "")
        )
