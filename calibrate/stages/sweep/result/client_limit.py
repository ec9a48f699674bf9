"""The client's limit over a sweep's levels (SPEC §5.6, §5.14), one half of a ``SweepResult``.

Levels from the first one at which calibrate's own self-check found the client to be the
bottleneck (``Level.client_bound``) are measured but never recommended: their throughput is the
client's limit. When the best level the client could measure is the last one before that, the
curve above it is unknown and the sweep is inconclusive.
"""

from __future__ import annotations

from calibrate.load.procs.selfcheck import client_limit_hint
from calibrate.stages.sweep.find_max import FindMax
from calibrate.stages.sweep.levels import Level, probed_level


class ClientLimit:
    """The client-limit half of a ``SweepResult`` (a dataclass with these fields)."""

    levels: tuple[Level, ...]
    find_max: FindMax | None

    @property
    def client_limit(self) -> Level | None:
        """The level from which on calibrate itself was the bottleneck at every level (a client-
        bound level with a clean one above it, not over the server's cap, was a hiccup)."""
        limit: Level | None = None
        for lv in self.levels:
            if lv.capped and not lv.client_bound:
                continue
            limit = (limit or lv) if lv.client_bound else None
        return limit

    @property
    def measurable(self) -> tuple[Level, ...]:
        """The levels whose throughput the server, not the client, set: those below the client
        limit, without any client-bound one among them."""
        limit = self.client_limit
        below = self.levels if limit is None else self.levels[: self.levels.index(limit)]
        return tuple(lv for lv in below if not lv.client_bound)

    def _named_limit(self) -> float | None:
        """The concurrency an inconclusive find-max names as client-bound (None: another mode)."""
        fm = self.find_max
        if fm is None or fm.over == "rates":
            return None
        for at in (fm.last_passing, fm.first_failing):
            level = probed_level(self.levels, fm, at)
            if level is not None and level.client_bound:
                return at
        return None

    def _find_max_inconclusive(self) -> str:
        """A boundary is only as good as its two sides: when calibrate itself was the bottleneck
        at the last passing or the first failing probe, who missed the SLOs is unknown."""
        fm = self.find_max
        assert fm is not None
        for side, at in (("last passing", fm.last_passing), ("first failing", fm.first_failing)):
            level = probed_level(self.levels, fm, at)
            if level is not None and level.client_bound:
                where = f"{at:g} req/s" if fm.over == "rates" else f"C = {at}"
                return (
                    f"inconclusive: the client was the limit at {where}, the {side} probe — "
                    f"whether the server or calibrate set the SLO boundary is unknown "
                    f"({level.client_bound})"
                )
        return ""

    @property
    def client_what_to_do(self) -> str:
        """For a sweep the client limited: a faster client, or (when some levels were measured
        cleanly) the levels below the limit to run again."""
        limit = self._named_limit()
        below = [
            lv.concurrency
            for lv in self.measurable
            if lv.rate is None and not lv.auto and (limit is None or lv.concurrency < limit)
        ]
        again = f"; or sweep only below the limit: --concurrency {','.join(map(str, below))}"
        cause = next((lv.client_bound for lv in self.levels if lv.client_bound), "")
        return client_limit_hint(cause) + (again if below else "")
