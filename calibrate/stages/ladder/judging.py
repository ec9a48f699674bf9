"""A ladder tier's verdict: the stop rules' word on its rounds, the server's cap it is judged by
(read back where the server restarts at B, else the one it reported or its running count
showed), and why its running count cannot show the tier ran whole. The ``Ladder`` is built on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from calibrate.stages.context import StageContext
from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.ladder.repeats import TierRaw
from calibrate.stages.measure.stop_rules import ServerCap, tier_verdict
from calibrate.stages.measure.tier import Tier, Verdict
from calibrate.stages.measure.tiers import Stats
from calibrate.stages.server_account.cap import most_running, observed_cap, running_unseen


class TierJudging:
    """The verdict of a tier as the ``Ladder`` (a dataclass with these fields) judges it."""

    ctx: StageContext
    options: LadderOptions
    history: list[Tier]
    cap: ServerCap | None
    cap_at: Callable[[int], ServerCap | None] | None
    raw: dict[int, TierRaw]

    def read_cap_back(self, batch: int) -> None:
        """Where the server is restarted at B for each tier, the cap it runs now is the one
        its tier is judged by (``cap_at``); the cap read once before the ladder otherwise."""
        if self.cap_at is not None:
            self.cap = self.cap_at(batch)

    def verdict_of(
        self, agg: Stats, rounds: Sequence[Stats], last: Tier | None
    ) -> tuple[Verdict, str]:
        """A tier's verdict from all its rounds so far, ``last`` the tier before it. Where the
        server was restarted at B and runs more slots than B (a build that turns --parallel 1
        into 4 unified slots), the tier's B requests still ran together and nothing queued:
        its verdict stands, and its reason says the server was not the one --parallel B
        describes (pinned at B it would run that many at once; verify reads it back)."""
        verdict, reason = self.judged(agg, rounds, last)
        cap, batch = self.cap, agg.batch_size
        if self.cap_at is None or cap is None or cap.slots <= batch:
            return verdict, reason
        if self.options.axis != "batch":
            return verdict, reason
        more = (
            f"the server ran {cap.slots} slots ({cap.source}), not {batch}: this tier sent "
            f"{batch} at once to a {cap.slots}-slot server, and --parallel {batch} pinned would "
            f"run {cap.slots} at once"
        )
        return verdict, f"{reason}; {more}" if reason else more

    def judged(self, agg: Stats, rounds: Sequence[Stats], last: Tier | None) -> tuple[Verdict, str]:
        opts = self.options
        return tier_verdict(
            agg,
            last.stats if last else None,
            vram_limit=opts.vram_limit,
            latency_rise=opts.latency_rise,
            slo=opts.slo,
            rounds_run=len(rounds),
            rounds_planned=opts.rounds,
            rounds=rounds,
            previous_rounds=last.rounds if last else (),
            cap=self.tier_cap(agg) if opts.axis == "batch" else None,
        )

    def accounted(self, tier: Tier) -> Tier:
        """``tier`` with why the server's running count cannot show it ran whole, if it cannot
        (``server_account.cap.running_unseen``; the batch axis only: a context tier is one B)."""
        if self.options.axis != "batch":
            return tier
        interval_s = self.ctx.config.ladder.sample_interval_s
        # each answer's own length, which a prompt list's one request does not show (its
        # prompts end apart, and the server counts each)
        raw = self.raw.get(tier.batch_size) if self.options.mode != "prompt-list" else None
        answers = [i.elapsed_s for i in raw.items if i.ok and i.role != "canary"] if raw else []
        shortest_s = min(answers, default=None)
        return replace(tier, unseen=running_unseen(tier.stats, interval_s, self.cap, shortest_s))

    def tier_cap(self, stats: Stats) -> ServerCap | None:
        """The cap ``stop: cap`` judges a tier by: the one the server reports (or a managed
        start's cap flag) when it is below B, else the one its own running gauge showed
        (``server_account.cap.observed_cap``, SPEC §6.1)."""
        known = self.cap
        if known is not None and known.slots < stats.batch_size:
            return known
        most = most_running([*(t.stats for t in self.history), stats])
        return observed_cap(stats, ran_elsewhere=most) or known
