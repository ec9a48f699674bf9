"""The determinism report (SPEC §13): K copies of the fixed prompt, how many distinct answers.

Pure functions over the copies' texts: the distinct completions (most common first), the first
token at which one differs from the most common, and the two variants' text around it. Tokens
are counted as a word or one CJK character (the mock's tokenizer); a server's own tokenizer may
split finer, so the position is a word position on a real model. ``engine_switch`` names the
batch-invariant switch of a managed vLLM or SGLang and says whether its command turned it on
(``switch.py``).

Two functions touch the world: ``managed_switch`` reads the managed engine's record and process
environment, and ``write_determinism`` judges a whole run's copies and writes
``determinism.json`` into its run folder.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from calibrate.config import Config
from calibrate.io.tier_table.row import DeterminismCells
from calibrate.stages.context import StageContext
from calibrate.stages.determinism.switch import EngineSwitch, engine_switch, managed_switch

__all__ = ["EngineSwitch", "engine_switch", "managed_switch"]  # and the checks below

_CJK = "\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef"
_TOKEN = re.compile(rf"\s*(?:[{_CJK}]|[^\s{_CJK}]+)")
AROUND = 4  # tokens shown on each side of the first difference


def tokens(text: str) -> list[str]:
    """``text`` as tokens that join back into it (whitespace belongs to the token after it)."""
    found = _TOKEN.findall(text)
    rest = text[sum(len(p) for p in found) :]
    if rest:
        found.append(rest)
    return found


def first_difference(a: str, b: str) -> int | None:
    """The 1-based position of the first token where ``a`` and ``b`` differ (None: equal).
    A text that is a prefix of the other differs at the token after its end."""
    if a == b:
        return None
    ta, tb = tokens(a), tokens(b)
    for n, (x, y) in enumerate(zip(ta, tb, strict=False), start=1):
        if x.strip() != y.strip():
            return n
    if len(ta) == len(tb):  # only the whitespace between tokens differs
        return next(n for n, (x, y) in enumerate(zip(ta, tb, strict=True), start=1) if x != y)
    return min(len(ta), len(tb)) + 1


def around(text: str, position: int, width: int = AROUND) -> str:
    """The tokens of ``text`` around ``position`` (1-based), with … where it was cut."""
    parts = tokens(text)
    start = max(0, position - 1 - width)
    end = position + width
    shown = "".join(parts[start:end]).strip()
    return ("…" if start > 0 else "") + shown + ("…" if end < len(parts) else "")


@dataclass(frozen=True)
class Divergence:
    """Where the earliest-differing variant leaves the most common answer."""

    token: int  # 1-based position of the first differing token
    common: str  # the most common answer around it
    variant: str  # the variant around it


@dataclass(frozen=True)
class DeterminismCheck:
    """K copies of one prompt at one batch size or level: what came back."""

    copies: int  # sent
    answered: int  # answered with text
    counts: tuple[int, ...]  # copies per distinct completion, most common first
    divergence: Divergence | None  # None: one distinct completion (or none answered)
    in_flight: int  # copies in flight at once
    common: str | None = None  # the most common answer (None: none answered)
    server_cap: int | None = None  # the most the server runs at once (None: not known)
    cap_source: str = ""  # where that was read ("llama.cpp /props total_slots", …)

    @property
    def ran_at_once(self) -> int | None:
        """The most copies the server can have run at once: ``in_flight``, or its cap where
        that is lower (the rest queued, sharing no batch); None where the cap is not known."""
        return None if self.server_cap is None else min(self.in_flight, self.server_cap)

    @property
    def queued(self) -> bool:
        """The server runs fewer at once than were in flight: the copies queued."""
        return self.server_cap is not None and self.server_cap < self.in_flight

    def at_once_note(self) -> str:
        """What follows a claim about ``in_flight`` copies at once: ``""`` when the server ran
        them all together, else what it ran (or that it is not known)."""
        if self.in_flight < 2 or (self.server_cap is not None and not self.queued):
            return ""
        if self.server_cap is None:
            return " (how many the server ran at once is not known: its cap could not be read)"
        return (
            f" — but the server runs {self.server_cap} at once ({self.cap_source}): the copies "
            f"queued, at most {self.server_cap} shared a batch, so this is not "
            f"{self.in_flight} at once"
        )

    @property
    def distinct(self) -> int:
        return len(self.counts)

    @property
    def deterministic(self) -> bool | None:
        """False when two answers differ; True only when every copy answered (two at least)
        and all alike; None when copies failed: alike answers of fewer copies than were sent
        say nothing of those that did not answer, nor ran with as many in flight (§5.14)."""
        if self.divergence is not None:
            return False
        return True if self.answered == self.copies >= 2 else None

    def cells(self) -> DeterminismCells:
        """Its cells in the tier's (or level's) row."""
        d = self.divergence
        return DeterminismCells(
            self.copies,
            self.answered,
            self.distinct,
            d.token if d else None,
            d.common if d else None,
            d.variant if d else None,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self.cells())

    def describe(self, where: str) -> str:
        """``batch 4: 2 distinct completions of 8; first difference at token 5: '…' vs '…'``."""
        failed = self.copies - self.answered
        missing = f" ({failed} unanswered)" if failed else ""
        if self.deterministic:
            said = f"{where}: {self.answered} of {self.copies} copies identical"
            return said + self.at_once_note()
        if self.divergence is None:
            alike = {0: "none answered", 1: "1 answered"}.get(
                self.answered, f"{self.answered} answered alike"
            )
            return f"{where}: {alike}, {failed} of {self.copies} unanswered — not established"
        d = self.divergence
        return (
            f"{where}: {self.distinct} distinct completions of {self.copies}{missing}; first "
            f"difference at token {d.token}: {d.common!r} vs {d.variant!r}"
        )


def check(
    texts: Sequence[str | None], in_flight: int, cap: tuple[int, str] | None = None
) -> DeterminismCheck:
    """The copies' answers (None: that copy failed) compared with each other; ``cap``: the
    server's own cap and where it was read, where it was."""
    answered = [t for t in texts if t is not None]
    ranked = Counter(answered).most_common()  # ties: the one seen first
    divergence = None
    if len(ranked) > 1:
        common = ranked[0][0]
        found = [(first_difference(common, other), other) for other, _ in ranked[1:]]
        position, variant = min(((p, v) for p, v in found if p is not None), key=lambda pv: pv[0])
        divergence = Divergence(position, around(common, position), around(variant, position))
    return DeterminismCheck(
        len(texts),
        len(answered),
        tuple(n for _, n in ranked),
        divergence,
        in_flight,
        ranked[0][0] if ranked else None,
        cap[0] if cap is not None else None,
        cap[1] if cap is not None else "",
    )


def across(a: DeterminismCheck, b: DeterminismCheck) -> Divergence | None:
    """Where two sets of copies part: each may answer alike within itself and still not as
    the other (an answer that changes with the load); None when their most common answers
    match, or a set had none."""
    if a.common is None or b.common is None or a.common == b.common:
        return None
    at = first_difference(a.common, b.common) or 1
    return Divergence(at, around(a.common, at), around(b.common, at))


def copies_per_wave(copies: int, batch: int) -> list[int]:
    """Waves of ``batch`` copies until at least ``copies`` were sent: every wave full, so each
    copy ran with ``batch`` in flight (at batch 16, 16 copies rather than 8)."""
    batch = max(1, batch)
    waves = max(1, -(-copies // batch))
    return [batch] * waves


def overall(checks: Sequence[tuple[str, DeterminismCheck]]) -> str | None:
    """One line over every tier or level: ``determinism (8 copies each): identical at batch 1,
    2; 2 distinct at batch 4 (first difference at token 5)``; None when none was checked."""
    if not checks:
        return None
    same = [
        where + (f" (the server ran {c.ran_at_once} at once)" if c.queued else "")
        for where, c in checks
        if c.deterministic
    ]
    unsure = [
        f"not established at {where} ({c.copies - c.answered} of {c.copies} unanswered)"
        for where, c in checks
        if c.deterministic is None
    ]
    differ = [
        f"{c.distinct} distinct at {where} (first difference at token {c.divergence.token})"
        for where, c in checks
        if c.divergence is not None
    ]
    parts = [f"identical at {', '.join(same)}"] if same else []
    unknown = [
        w for w, c in checks if c.deterministic and c.in_flight > 1 and c.ran_at_once is None
    ]
    if unknown:  # "identical at batch 4" is no claim about 4 at once where that is not known
        parts.append(f"how many the server ran at once is not known at {', '.join(unknown)}")
    apart = tiers_apart(checks)
    if apart is not None:  # each alike within itself, not as the other: the answer moved
        (a, b), d = apart
        parts.append(f"but {a} and {b} answer differently (first difference at token {d.token})")
    copies = sorted({c.copies for _, c in checks})
    each = f"{copies[0]}" if len(copies) == 1 else f"{copies[0]}–{copies[-1]}"
    return f"determinism ({each} copies each): " + "; ".join([*parts, *unsure, *differ])


def tiers_apart(
    checks: Sequence[tuple[str, DeterminismCheck]],
) -> tuple[tuple[str, str], Divergence] | None:
    """The first two tiers (or levels) whose most common answers differ: the answer changes
    with the load though each tier's copies agree (None: every tier's answer is the first's)."""
    answered = [(where, c) for where, c in checks if c.common is not None]
    first = answered[0] if answered else None
    for where, c in answered[1:]:
        assert first is not None
        if (found := across(first[1], c)) is not None:
            return (first[0], where), found
    return None


@dataclass(frozen=True)
class Determinism:
    """What the copies of the fixed prompt found over the run (SPEC §13)."""

    line: str  # ``determinism (8 copies each): identical at batch 1, 2; …``
    copies: int
    differed: bool
    switch: EngineSwitch | None  # the managed engine's batch-invariant switch, as read
    unsettled: bool = False  # copies failed where none differed: not established

    @property
    def deterministic(self) -> bool | None:
        return False if self.differed else None if self.unsettled else True

    def to_json(self) -> dict[str, Any]:
        return {
            "copies": self.copies,
            "deterministic": self.deterministic,
            "switch": self.switch.to_json() if self.switch is not None else None,
        }


def judge_determinism(
    cfg: Config, checks: Sequence[tuple[str, DeterminismCheck]]
) -> Determinism | None:
    """The run's determinism and the engine's switch (None when no copies were sent)."""
    line = overall(checks)
    if line is None:
        return None
    differed = any(c.divergence is not None for _, c in checks) or tiers_apart(checks) is not None
    copies = max(c.copies for _, c in checks)
    unsettled = any(c.deterministic is None for _, c in checks)
    return Determinism(line, copies, differed, managed_switch(cfg), unsettled)


def write_determinism(
    ctx: StageContext, checks: Sequence[tuple[str, DeterminismCheck]]
) -> Determinism | None:
    """``determinism.json`` beside the tiers: the switch as read (SPEC §13)."""
    found = judge_determinism(ctx.config, checks)
    if found is not None:
        ctx.run.write_json("determinism.json", found.to_json())
    return found
