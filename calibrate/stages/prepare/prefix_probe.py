"""The engine's prefix cache, as the workload will meet it (SPEC §13): named, on or off, and
what it changes.

A job that sends one instruction before every item (``--prompt``, a long system prompt, a
few-shot block) is served faster by an engine with a prefix cache: the shared tokens are read
once, not once per item. Before the load, a workload whose prompts share a prefix is probed:
one of its own prompts primes the cache, then ``PROBES`` more of them and ``PROBES`` copies that
start with a marker of their own (the same prompts, nothing shared: a prefix cache hashes from
the first token) are sent one at a time for one token each. The probe says how many of their
prompt tokens the engine found in its cache — its own counters (``gpu.engine_metrics``:
vLLM's ``prefix_cache_hits``/``queries``, SGLang's ``cached_tokens``/``prompt_tokens``) or each
answer's own count (llama.cpp's ``timings.cache_n``, OpenAI's ``prompt_tokens_details``) — and
how much sooner the shared ones answered. Over the whole run the counters are read again
(``PrefixWatch``): how much of the load's prompts came from the cache.

Nothing here fails a stage: a server that publishes nothing is measured by time alone, and one
whose probe fails is said so and measured as it is.
"""

from __future__ import annotations

import logging
import secrets
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from calibrate.config import LadderMode
from calibrate.engines import find
from calibrate.engines.args import ServerKind
from calibrate.engines.base import PrefixCacheInfo
from calibrate.errors import RequestError
from calibrate.gpu.engine_metrics import PrefixCounters, read_prefix_counters
from calibrate.http.client import OpenAIClient
from calibrate.http.models import Completion, SamplingParams
from calibrate.load.request import CHAT_PATH, COMPLETIONS_PATH
from calibrate.stages.prepare.prefix_finding import PrefixFinding, Share

log = logging.getLogger("calibrate")

PROBES = 3  # timed requests of each kind: shared prefix, and nothing shared
PROBE_KEY = -1000  # the probe's own request numbers (the workload's are ≥ 0)
LLAMACPP_FIELD = "timings.cache_n"  # llama.cpp's answers: prompt tokens its slot reused


@dataclass(frozen=True)
class Probe:
    """How the probe sends one prompt for one token, and reads the server's counters."""

    client: OpenAIClient
    model: str
    params: SamplingParams
    mode: LadderMode

    def send(self, prompt: str) -> Completion:
        params = replace(self.params, max_tokens=1)
        if self.mode == "prompt-list":
            body = self.client.completions_body(self.model, [prompt], params)
            return self.client.post_completion(COMPLETIONS_PATH, body)
        return self.client.post_completion(
            CHAT_PATH, self.client.chat_body(self.model, prompt, params)
        )

    def counters(self) -> PrefixCounters | None:
        client = self.client
        return read_prefix_counters(lambda: client.get_text("/metrics"))


def answer_cached(completion: Completion) -> tuple[int, str] | None:
    """The prompt tokens an answer says its engine found cached, and where it said so."""
    body = completion.body or {}
    timings = body.get("timings")
    if isinstance(timings, dict) and _count(timings.get("cache_n")) is not None:
        return int(timings["cache_n"]), LLAMACPP_FIELD
    usage = body.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if isinstance(details, dict) and _count(details.get("cached_tokens")) is not None:
        return int(details["cached_tokens"]), "usage.prompt_tokens_details.cached_tokens"
    return None


def _llamacpp_cache() -> PrefixCacheInfo | None:
    found = find("llamacpp")
    return found.prefix_cache if found is not None else None


def _count(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else None


def _share(
    probe: Probe, prompts: Sequence[str], before: PrefixCounters | None
) -> tuple[Share, PrefixCounters | None]:
    """Send ``prompts`` one at a time: the median time to one token, and the share of their
    prompt tokens found in the cache (the counters' difference, else the answers' own)."""
    seconds: list[float] = []
    said = prompt_tokens = 0
    where = ""
    for prompt in prompts:
        completion = probe.send(prompt)
        seconds.append(completion.elapsed_s)
        if completion.usage is not None:
            prompt_tokens += completion.usage.prompt_tokens or 0
        if (found := answer_cached(completion)) is not None:
            said += found[0]
            where = found[1]
    after = probe.counters()
    hit: float | None = None
    if before is not None and after is not None and after.queries > before.queries:
        hit = (after.hits - before.hits) / (after.queries - before.queries)
        where = after.metric
    elif where and prompt_tokens:
        hit = said / prompt_tokens
    return Share(statistics.median(seconds), hit, where or None), after


def probe_prefix(
    probe: Probe, prompts: Callable[[int, int], list[str]], kind: ServerKind | None
) -> PrefixFinding:
    """Prime, then ``PROBES`` prompts of the workload and ``PROBES`` with nothing shared."""
    engine = find(kind)
    info = engine.prefix_cache if engine is not None else None
    try:
        own = prompts(PROBES + 1, PROBE_KEY)
        probe.send(own[0])  # the first reads the prefix: it primes the cache
        start = probe.counters()
        shared, mid = _share(probe, own[1:], start)
        salt = f"{secrets.randbits(24):06x}"  # none of them in the cache from an earlier run
        unique, _ = _share(probe, [f"u{salt}-{i}: {p}" for i, p in enumerate(own[1:])], mid)
    except RequestError as exc:
        log.warning("the prefix-cache probe failed: %s", exc.info.message)
        return PrefixFinding.unmeasured(info, f"the probe failed: {exc.info.message}")
    counters = start or mid
    if info is None and shared.source == LLAMACPP_FIELD:  # only llama.cpp answers so
        info = _llamacpp_cache()
    return PrefixFinding(
        cache=counters.cache if counters else info.name if info else None,
        enabled=counters.enabled if counters else None,
        switch=info.switch if info else counters.switch if counters else "",
        shared=shared,
        unique=unique,
    )


class PrefixWatch:
    """The prefix-cache counters at the start of the load and at its end: the run's share of
    prompt tokens found in the cache (None where the server publishes no counters)."""

    def __init__(self, read: Callable[[], PrefixCounters | None]) -> None:
        self._read = read
        self.start = read()
        self._end: PrefixCounters | None = None

    def run_hit(self) -> tuple[float | None, PrefixCounters | None]:
        """The share over the run so far, and the counters it was read from (read once)."""
        if self.start is None:
            return None, None
        if self._end is None:
            self._end = self._read()
        end = self._end
        if end is None or end.queries <= self.start.queries:
            return None, end
        return (end.hits - self.start.hits) / (end.queries - self.start.queries), end
