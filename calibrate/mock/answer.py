"""What the mock answers to one prompt: deterministic text of a length the request controls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from calibrate.mock import text
from calibrate.mock.settings import MockSettings

FinishReason = Literal["stop", "length", "error"]


@dataclass(frozen=True)
class Generation:
    """The answer to one prompt."""

    text: str
    finish_reason: FinishReason
    completion_tokens: int


@dataclass(frozen=True)
class AnswerLength:
    """The request's say on the length: a cap, a floor, EOS ignored; and a truncation fault."""

    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    truncate: bool = False


def answer(
    prompt: str, settings: MockSettings, length: AnswerLength, *, perturb_at: int | None = None
) -> Generation:
    """The answer to ``prompt``; ``perturb_at`` (the sequences in its batch) varies it.

    Its natural length comes from the prompt; ``ignore_eos`` makes it exactly ``max_tokens``
    long, ``min_tokens`` at least that long; ``max_tokens`` caps it (finish "length").
    """
    full = text.natural_text(prompt, settings.text_seed)
    if settings.answer_tokens:  # every answer this long, whatever its prompt
        own = text.count_tokens(full)
        n = settings.answer_tokens
        full = text.extend(full, prompt, settings.text_seed, n) if n > own else text.cut(full, n)
    if perturb_at is not None and settings.diverge_at_token is not None:
        full = text.diverge(full, prompt, perturb_at, settings.diverge_at_token, settings.seed)
    elif perturb_at is not None:
        full = text.perturb(full, prompt, perturb_at)
    natural = text.count_tokens(full)
    target = length.max_tokens if length.ignore_eos and length.max_tokens is not None else natural
    target = max(target, length.min_tokens)
    limit = target if length.max_tokens is None else min(target, length.max_tokens)
    if length.truncate:
        limit = min(limit, max(1, max(natural, target) // 2))
    if limit > natural:
        out = text.extend(full, prompt, settings.text_seed, limit)
    else:
        out = text.cut(full, limit) if limit < natural else full
    cut_short = limit < natural or limit < target
    finish: FinishReason = "length" if length.ignore_eos or cut_short else "stop"
    if settings.whitespace_variant:
        out += " \n"
    if settings.lone_surrogate:
        out += "\ud800"
    if settings.huge_mib:
        out += " " + "x" * max(0, int(settings.huge_mib * 1024 * 1024) - len(out) - 1)
    return Generation(text=out, finish_reason=finish, completion_tokens=limit)
