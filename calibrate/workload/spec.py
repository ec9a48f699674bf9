"""What ladder, sweep and tune send (SPEC §5.11): the workload's spec and its sizes.

``fixed`` (the default) repeats the fixed prompt; ``tasks`` takes items of a batch input file
(``--pick longest`` — the worst case for memory — or a seeded ``sample``), each after the job's
own ``--prompt`` as batch sends it; ``synthetic`` builds seeded prompts of ``--input-tokens``
(one size or a uniform ``A:B`` range) with answers forced to ``--output-tokens``, their first
``--prefix-tokens`` (or fraction ``--shared-prefix``) the same in every prompt; ``replay`` sends
a finished batch's own token counts (``JobTrace``: each item's input and output tokens, read
from its journal). Every bound is checked where the flags are read (``workload.resolve``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from calibrate.errors import UsageError

WorkloadSource = Literal["fixed", "tasks", "synthetic", "replay"]
Pick = Literal["longest", "sample"]
Axis = Literal["batch", "context"]
PICKS: tuple[Pick, ...] = ("longest", "sample")

# Documented maxima (README "Limits").
MAX_INPUT_TOKENS = 1_048_576
MAX_OUTPUT_TOKENS = 1_000_000
MAX_CONTEXT_STEPS = 32
MAX_BATCH_SIZE = 4096
MAX_GAP_S = 60.0  # a replayed job's pause longer than this is left out of its arrival pattern


@dataclass(frozen=True)
class TokenRange:
    """Input tokens per request: one size (low == high) or a uniform range."""

    low: int
    high: int

    @property
    def mean(self) -> int:
        return (self.low + self.high) // 2

    def describe(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}:{self.high}"


def parse_token_range(text: str | int, where: str) -> TokenRange:
    """``2000`` or ``"512:4096"`` → a range; anything else (or out of bounds) is exit 2."""
    raw = str(text).strip()
    low_text, sep, high_text = raw.partition(":")
    try:
        low = int(low_text)
        high = int(high_text) if sep else low
    except ValueError:
        raise UsageError(
            f"{where} must be a token count N or a range A:B, got {text!r}",
            "e.g. --input-tokens 2000, or --input-tokens 512:4096 for a uniform range",
        ) from None
    if not 1 <= low <= high <= MAX_INPUT_TOKENS:
        raise UsageError(
            f"{where} must be in [1, {MAX_INPUT_TOKENS}] (and A ≤ B for a range), got {raw}"
        )
    return TokenRange(low, high)


@dataclass(frozen=True)
class JobTrace:
    """A finished batch as a replay sends it: each item's input and output tokens (its usage),
    in the journal's order, and when each was sent (epoch seconds; None where the journal did
    not record it: journals written before calibrate recorded ``sent_at``)."""

    source: Path
    job_format: str  # "calibrate journal" or "OpenAI Batch API output"
    input_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    sent_at: tuple[float, ...] | None = None
    skipped: int = 0  # result lines without usable token counts (failed items)
    sampled_from: int = 0  # items found, when more than were kept (a seeded sample of them)

    @property
    def items(self) -> int:
        return len(self.input_tokens)

    def gaps_s(self) -> tuple[float, ...]:
        """The job's gaps between consecutive sends, in send order (none without times); a
        pause longer than ``MAX_GAP_S`` (a resume, an outage) is no gap of the job's pace."""
        if not self.sent_at or len(self.sent_at) < 2:
            return ()
        times = sorted(self.sent_at)
        return tuple(g for a, b in itertools.pairwise(times) if (g := b - a) <= MAX_GAP_S)

    def describe(self) -> str:
        found = (
            f"{self.sampled_from} items, {self.items} sampled"
            if self.sampled_from
            else (f"{self.items} items")
        )
        return f"replay of {self.source} ({self.job_format}, {found})"


@dataclass(frozen=True)
class WorkloadSpec:
    """The resolved workload: which source, and its sizes. ``prompt`` prefixes task items;
    ``prefix_tokens`` the same first tokens of every synthetic or replayed prompt."""

    source: WorkloadSource = "fixed"
    tasks: Path | None = None
    pick: Pick = "longest"
    input_tokens: TokenRange | None = None
    output_tokens: int | None = None
    shared_prefix: float = 0.0
    seed: int = 0
    prompt: str = ""
    prefix_tokens: int | None = None
    trace: JobTrace | None = None  # the replayed job (read before the stage, exit 2 if bad)

    @property
    def fixed(self) -> bool:
        return self.source == "fixed"

    @property
    def shares_prefix(self) -> bool:
        """Whether every prompt starts the same (beyond a chat template's own first tokens)."""
        if self.source == "tasks":
            return bool(self.prompt)
        return bool(self.prefix_tokens or self.shared_prefix)

    def describe(self) -> str:
        if self.source == "fixed":
            return "the fixed prompt"
        if self.source == "tasks":
            text = f"tasks {self.tasks} (pick {self.pick})"
            if self.prompt:
                text += f" after the shared --prompt {self.prompt[:40]!r}"
        elif self.source == "replay":
            assert self.trace is not None
            text = self.trace.describe()
        else:
            assert self.input_tokens is not None
            text = f"synthetic {self.input_tokens.describe()} input tokens"
        if self.prefix_tokens:
            text += f", the first {self.prefix_tokens} shared by every prompt"
        elif self.shared_prefix:
            text += f" ({self.shared_prefix:.0%} shared prefix)"
        if self.output_tokens:
            text += f", answers forced to {self.output_tokens} tokens"
        return text
