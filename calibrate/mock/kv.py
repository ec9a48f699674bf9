"""The mock's KV cache: which tokens each active sequence holds (``KvLedger``), and the prefix
cache of prompts seen before (``PrefixCache``).

A sequence holds its prompt tokens and the tokens generated so far. With the prefix cache on,
prompts are cut into blocks of ``BLOCK_TOKENS`` tokens, each block named by a hash of everything
up to its end (as vLLM does), and a block several active sequences share is held once; the partial
last block and the generated tokens are always a sequence's own. Not thread-safe: MockModel holds
its lock around every call.

The prefix cache (``--prefix-cache``): the blocks of prompts seen before (``prompt_blocks``) are
kept, newest first, up to the KV capacity (``--kv-capacity-tokens``, else
``DEFAULT_BLOCKS``), and a new prompt's leading blocks found there are its cached tokens. Those
are not prefilled: the first token waits ``--prefill-ms-per-1k-tokens`` for each 1,000 prompt
tokens *not* found, so a job whose prompts share a prefix answers sooner, as on a real engine.

Counted the way the engines publish it (``mock.metrics``): the prompt tokens looked up and the
tokens found (vLLM's ``prefix_cache_queries``/``prefix_cache_hits``, SGLang's
``prompt_tokens``/``cached_tokens``), and, for llama.cpp's answers, each request's own
``timings.cache_n`` / ``prompt_n``. As vLLM, the last prompt token is always computed, and a
cache that is off looks nothing up (its counters stay 0). A request of llama.cpp's with
``"cache_prompt": false`` is not looked up either. Thread-safe: its own lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from calibrate.mock import text
from calibrate.mock.settings import MockSettings

BLOCK_TOKENS = 16
DEFAULT_BLOCKS = 65536  # 1M tokens of cached prompt when the KV capacity is not set


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
        blocks = prompt_blocks(prompt)
        own = max(0, prompt_tokens - len(blocks) * BLOCK_TOKENS)
        return cls(blocks, own, out_tokens)


def prompt_blocks(prompt: str) -> tuple[int, ...]:
    """The whole ``BLOCK_TOKENS`` blocks of ``prompt``, each named by a hash of everything up to
    its end: two prompts share a block only when they agree up to it."""
    pieces = text.pieces(prompt)
    blocks: list[int] = []
    chain = 0
    for start in range(0, len(pieces) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        chain = hash((chain, *pieces[start : start + BLOCK_TOKENS]))
        blocks.append(chain)
    return tuple(blocks)


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


@dataclass(frozen=True)
class PrefixCounts:
    """The counters at one moment: prompt tokens looked up and found, since the start; and the
    share found for the last request (SGLang's ``cache_hit_rate`` gauge)."""

    queries_tokens: int = 0
    hits_tokens: int = 0
    prompt_tokens: int = 0  # every prompt token received, looked up or not (SGLang's counter)
    last_hit_rate: float = 0.0


@dataclass(frozen=True)
class Prefill:
    """One request's prompts against the cache: tokens found, tokens to compute, its cost."""

    cached_tokens: int
    prompt_tokens: int
    seconds: float

    def timings(self, completion_tokens: int) -> dict[str, Any]:
        """llama.cpp's ``timings`` object of the answer (the counts; times are the mock's)."""
        return {
            "cache_n": self.cached_tokens,
            "prompt_n": self.prompt_tokens - self.cached_tokens,
            "prompt_ms": round(self.seconds * 1000, 3),
            "predicted_n": completion_tokens,
        }


class PrefixCache:
    """The blocks of prompts seen before, least recently used first out."""

    def __init__(self, settings: MockSettings) -> None:
        self._on = settings.prefix_cache
        self._prefill_s_per_token = settings.prefill_ms_per_1k_tokens / 1e6
        capacity = settings.kv_capacity_tokens // BLOCK_TOKENS
        self._capacity = capacity if capacity > 0 else DEFAULT_BLOCKS
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()
        self._counts = PrefixCounts()

    def prefill(
        self, prompts: Sequence[str], prompt_tokens: Sequence[int], *, look_up: bool = True
    ) -> Prefill:
        """Look the prompts up (and keep their blocks): how much of them is cached."""
        total = sum(prompt_tokens)
        cached = 0
        queried = 0
        with self._lock:
            if self._on and look_up:
                for prompt, tokens in zip(prompts, prompt_tokens, strict=True):
                    blocks = prompt_blocks(prompt)
                    cached += min(self._found(blocks) * BLOCK_TOKENS, max(tokens - 1, 0))
                    queried += tokens
                    self._keep(blocks)
            c = self._counts
            self._counts = PrefixCounts(
                c.queries_tokens + queried,
                c.hits_tokens + cached,
                c.prompt_tokens + total,
                cached / queried if queried else c.last_hit_rate,
            )
        return Prefill(cached, total, (total - cached) * self._prefill_s_per_token)

    def counts(self) -> PrefixCounts:
        with self._lock:
            return self._counts

    def _found(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks``, from the first, are cached."""
        found = 0
        for block in blocks:
            if block not in self._blocks:
                break
            found += 1
        return found

    def _keep(self, blocks: Sequence[int]) -> None:
        for block in blocks:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self._capacity:
            self._blocks.popitem(last=False)
