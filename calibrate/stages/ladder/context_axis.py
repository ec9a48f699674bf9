"""The context axis of the ladder (SPEC §5.3 ``--axis context``): which input length to try
next, and how its results are said — in input lengths, not batch sizes.

The planned lengths (512, 1k, 2k, … or ``--context-lengths``) are stepped until one fails;
then the axis bisects between the longest that passed and the shortest that failed until the
gap is at most 5 % of the passing length or 256 tokens, and reports the longest that passed.
Pure functions of the tiers run so far: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from calibrate.stages.measure.stop_rules import stopped_by
from calibrate.stages.measure.tier import StopReason, Tier
from calibrate.workload import MAX_CONTEXT_STEPS, MAX_INPUT_TOKENS

BISECT_GAP = 0.05  # of the longest passing length
BISECT_TOKENS = 256  # or this many tokens, whichever is more


def tier_length(tier: Tier) -> int | None:
    """The input length (tokens) a context-axis tier sized its prompts to."""
    target = tier.stats.input_tokens_target
    return round(target) if target is not None else None


def _lengths(history: Sequence[Tier], passed: bool) -> list[int]:
    verdict = "pass" if passed else "fail"
    return [n for t in history if t.verdict == verdict and (n := tier_length(t)) is not None]


def bracket(history: Sequence[Tier]) -> tuple[int, int] | None:
    """(longest passing, shortest failing) length once a length failed after one passed."""
    passed, failed = _lengths(history, True), _lengths(history, False)
    return (max(passed), min(failed)) if passed and failed else None


def close_enough(low: int, high: int) -> bool:
    return high - low <= max(BISECT_GAP * low, BISECT_TOKENS)


def next_length(history: Sequence[Tier], planned: Sequence[int]) -> int | None:
    """The input length of the next tier, or None when the axis is done.

    A tier that stopped the ladder for another reason (VRAM, an SLO, preemption) ends it: a
    longer input would only be more of the same.
    """
    if not history:
        return planned[0] if planned else None
    if history[-1].verdict not in ("pass", "fail"):
        return None
    found = bracket(history)
    if found is None:  # no failure yet: the next planned length; the first failed: done
        if _lengths(history, False):
            return None
        done = len(history)
        return planned[done] if done < len(planned) else None
    low, high = found
    return None if close_enough(low, high) else (low + high) // 2


def axis_stopped_by(history: Sequence[Tier], planned: Sequence[int]) -> StopReason:
    """A length was left to try: ``interrupted``; a length failed (and the bisection that
    followed ended with a pass or a fail): ``failure``; otherwise what the batch axis says."""
    if not history or next_length(history, planned) is not None:
        return "interrupted"
    if history[-1].verdict in ("pass", "fail") and bracket(history) is not None:
        return "failure"
    return stopped_by(history, planned)


def relabel(reason: str, batch: int, length: float | None) -> str:
    """A tier's reason said of its input length: "input 4,096 tokens: …" (at batch B > 1)."""
    if length is None:
        return reason
    where = f"input {round(length):,} tokens" + (f" at batch {batch}" if batch > 1 else "")
    return f"{where}: {reason.removeprefix(f'batch {batch}: ')}"


def outcome(history: Sequence[Tier], longest_tokens: int | None, batch: int) -> str:
    """The axis's one-line result, e.g. "longest passing input: 4,866 tokens (bisected between
    4,864 and 4,992 tokens of input; 4,992 failed: …)"."""
    at = f" at batch {batch}" if batch > 1 else ""
    head = f"longest passing input: {longest_tokens or 0:,} tokens{at}"
    found = bracket(history)
    if found is not None:
        low, high = found
        failed = next(t for t in history if t.verdict == "fail" and tier_length(t) == high)
        gap = f"within {max(BISECT_GAP * low, BISECT_TOKENS):,.0f} tokens"
        return (
            f"{head} (input lengths {low:,} passed, {high:,} failed, bisected to {gap}; "
            f"{failed.reason})"
        )
    if not history or history[-1].verdict == "pass":
        return f"{head} (every input length passed)"
    return f"{head} (stopped: {history[-1].reason})"


CONTEXT_START_TOKENS = 512
CONTEXT_MARGIN = 0.05  # prompts are built to within a few percent of their target


def default_context_lengths(max_model_len: int | None, output_tokens: int) -> tuple[int, ...]:
    """512, 1k, 2k, … up to what fits in ``max_model_len`` with the answer (and the last
    length that fits, a margin below it); without a known limit, up to the maximum."""
    if max_model_len is None:
        limit = MAX_INPUT_TOKENS
    else:
        limit = max_model_len - output_tokens - math.ceil(CONTEXT_MARGIN * max_model_len)
    lengths: list[int] = []
    n = CONTEXT_START_TOKENS
    while n <= limit and len(lengths) < MAX_CONTEXT_STEPS:
        lengths.append(n)
        n *= 2
    if max_model_len is not None and limit >= 1 and (not lengths or lengths[-1] < limit):
        lengths.append(limit)
    return tuple(lengths[-MAX_CONTEXT_STEPS:])
