"""The mock's KV-cache ledger: which tokens each active sequence holds, and how many in all.

A sequence holds its prompt tokens and the tokens generated so far. With the prefix cache on,
prompts are cut into blocks of ``BLOCK_TOKENS`` tokens, each block named by a hash of everything
up to its end (as vLLM does), and a block several active sequences share is held once; the partial
last block and the generated tokens are always a sequence's own. Not thread-safe: MockModel holds
its lock around every call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from calibrate.mock import text

BLOCK_TOKENS = 16


@dataclass(frozen=True)
class SeqPlan:
    """What one sequence will hold: its shareable prompt blocks, its own tokens, its answer."""

    blocks: tuple[int, ...]
    own_prompt_tokens: int
    out_tokens: int

    @classmethod
    def of(cls, prompt: str, prompt_tokens: int, out_tokens: int, *, share: bool) -> SeqPlan:
        """The plan of ``prompt`` (``prompt_tokens`` as reported in usage)."""
        if not share:
            return cls((), prompt_tokens, out_tokens)
        pieces = text.pieces(prompt)
        blocks: list[int] = []
        chain = 0
        for start in range(0, len(pieces) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
            chain = hash((chain, *pieces[start : start + BLOCK_TOKENS]))
            blocks.append(chain)
        own = max(0, prompt_tokens - len(blocks) * BLOCK_TOKENS)
        return cls(tuple(blocks), own, out_tokens)


@dataclass
class _Held:
    plan: SeqPlan
    generated: int = 0


class KvLedger:
    """Active sequences by request ticket, in admission order, and the tokens they hold."""

    def __init__(self) -> None:
        self._held: dict[int, list[_Held]] = {}
        self._refs: dict[int, int] = {}
        self._own_tokens = 0  # partial prompt blocks + generated tokens, summed
        self._out_left = 0  # tokens still to be generated, summed (for reservations)

    @property
    def tokens_in_use(self) -> int:
        """Tokens held now: shared blocks once, plus every sequence's own tokens."""
        return len(self._refs) * BLOCK_TOKENS + self._own_tokens

    @property
    def tokens_reserved(self) -> int:
        """Tokens held once every active sequence has finished its answer."""
        return self.tokens_in_use + self._out_left

    @property
    def empty(self) -> bool:
        return not self._held

    def extra_tokens(self, plans: Sequence[SeqPlan], *, reserve: bool = False) -> int:
        """How many tokens admitting ``plans`` would add now (or, with ``reserve``, at the end)."""
        new_blocks = {b for p in plans for b in p.blocks if b not in self._refs}
        own = sum(p.own_prompt_tokens + (p.out_tokens if reserve else 0) for p in plans)
        return len(new_blocks) * BLOCK_TOKENS + own

    def add(self, ticket: int, plans: Iterable[SeqPlan]) -> None:
        """Sequences of request ``ticket`` start holding their prompts."""
        held = [_Held(p) for p in plans]
        self._held[ticket] = held
        for h in held:
            for block in h.plan.blocks:
                self._refs[block] = self._refs.get(block, 0) + 1
            self._own_tokens += h.plan.own_prompt_tokens
            self._out_left += h.plan.out_tokens

    def growth(self, ticket: int, step: int) -> int:
        """Tokens request ``ticket`` would add by reaching decode ``step``."""
        return sum(min(step, h.plan.out_tokens) - h.generated for h in self._held.get(ticket, ()))

    def grow(self, ticket: int, step: int) -> None:
        """Request ``ticket`` has generated ``step`` tokens per sequence (each up to its answer)."""
        for h in self._held.get(ticket, ()):
            now = min(step, h.plan.out_tokens)
            self._own_tokens += now - h.generated
            self._out_left -= now - h.generated
            h.generated = now

    def remove(self, ticket: int) -> None:
        """Request ``ticket`` is done: its tokens are free (shared blocks once nobody holds them)."""
        for h in self._held.pop(ticket, ()):
            for block in h.plan.blocks:
                left = self._refs[block] - 1
                if left:
                    self._refs[block] = left
                else:
                    del self._refs[block]
            self._own_tokens -= h.plan.own_prompt_tokens + h.generated
            self._out_left -= h.plan.out_tokens - h.generated

    def evicted(self, capacity_tokens: int) -> int:
        """How many of the newest sequences do not fit in ``capacity_tokens`` (0 when all do)."""
        if self.tokens_in_use <= capacity_tokens:
            return 0
        seen: set[int] = set()
        total = evicted = 0
        for held in self._held.values():
            for h in held:
                new = [b for b in h.plan.blocks if b not in seen]
                seen.update(new)
                total += len(new) * BLOCK_TOKENS + h.plan.own_prompt_tokens + h.generated
                evicted += total > capacity_tokens
        return evicted
