"""Synthetic prompts of a chosen token length (SPEC §5.11): seeded words, a unique prefix each.

No tokenizer: ``TokenModel`` is a straight line from words to the server's own
``usage.prompt_tokens`` (template overhead + tokens per word), fitted by ``stages.token_probe``.
Each request starts with its own marker, so no prefix cache can share its KV with another's;
``shared`` moves that marker back, so the first fraction of every prompt is the same text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# Plain, common English words: most tokenizers spend one token (with its leading space) on each.
_WORD_TEXT = (
    "the of and to in is was for on with as by at from that this be are it an or have not "
    "which one all were when there can more if no out so what up about into than them some "
    "time only other new would these two may first then do any like my now over such our man "
    "me even most made after also did many before must through back years where much your way "
    "well down should because each just those people how too little state good very make world "
    "still own see men work long get here between both life being under never day same another "
    "know while last might us great old year off come since against go came right used take "
    "three small house water light place city river paper table window garden music story"
)
WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class TokenModel:
    """``prompt_tokens ≈ overhead_tokens + tokens_per_word × words`` on this server."""

    overhead_tokens: float = 0.0
    tokens_per_word: float = 1.0

    def words_for(self, tokens: int) -> int:
        """How many words make a prompt of about ``tokens`` tokens (at least one)."""
        return max(1, round((tokens - self.overhead_tokens) / self.tokens_per_word))

    def to_json(self) -> dict[str, float]:
        return {
            "overhead_tokens": round(self.overhead_tokens, 3),
            "tokens_per_word": round(self.tokens_per_word, 5),
        }


def _words(rng: random.Random, count: int) -> list[str]:
    return rng.choices(WORDS, k=count) if count > 0 else []


def synthetic_prompt(
    words: int,
    key: int,
    *,
    seed: int,
    shared: float = 0.0,
    shared_words: int | None = None,
    salt: str = "",
) -> str:
    """``words`` seeded words; request ``key``'s own marker after the shared fraction (or the
    first ``shared_words`` words: a shared prefix of a given length, ``--prefix-tokens``).

    With ``shared`` 1.0 every prompt is the same text (a prefix cache holds it once); with 0
    the marker comes first and no two prompts share a single block. ``salt`` (a run's own) goes
    into the marker: a rerun sends the same words, but its prompts share no block with the last
    run's, which an engine's prefix cache may still hold.
    """
    if shared_words is None:
        shared_words = round(words * shared)
    shared_words = min(words, shared_words)
    head = _words(random.Random(f"calibrate-shared-{seed}"), shared_words)
    if shared_words >= words:
        return " ".join(head)
    own = _words(random.Random(f"calibrate-{seed}-{key}"), words - shared_words - 1)
    return " ".join([*head, f"r{salt}{key}:", *own])


def target_tokens(low: int, high: int, key: int, *, seed: int) -> int:
    """Request ``key``'s input length: ``low`` when fixed, else uniform in [low, high], seeded."""
    if low == high:
        return low
    return random.Random(f"calibrate-length-{seed}-{key}").randint(low, high)
