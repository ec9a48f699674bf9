"""What calibrate knows per engine kind, one module each, behind one lookup: ``engine(kind)``.

Each module (``vllm``, ``llamacpp``, ``sglang``, ``lmdeploy``, ``ollama_tgi``, ``custom``) holds
an ``Engine`` (``base.py``): its command line as data (or its own builder), health path, cap flag
and how the server reports its cap, tune flags and default axes, the forcing it honours, its
metric names, the flags ``[server] args`` may not set, and its context hint. A new engine is one
module and one line in ``ENGINES``. This package imports nothing of calibrate but ``errors``
(``server``, ``gpu``, ``http``, ``stages`` and ``config`` ask it, never the other way).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from calibrate.engines import custom, llamacpp, lmdeploy, ollama_tgi, sglang, vllm
from calibrate.engines.base import CapReport, Engine, PrefixCacheInfo, ServerKind
from calibrate.errors import ConfigError

#: every kind, in the order help and messages list them
ENGINES: tuple[Engine, ...] = (
    vllm.ENGINE,
    llamacpp.ENGINE,
    sglang.ENGINE,
    lmdeploy.ENGINE,
    ollama_tgi.OLLAMA,
    ollama_tgi.TGI,
    custom.ENGINE,
)
KINDS: tuple[ServerKind, ...] = tuple(e.kind for e in ENGINES)
_BY_KIND: dict[str, Engine] = {e.kind: e for e in ENGINES}


def engine(kind: str) -> Engine:
    """The engine of ``kind``; an unknown kind is a config error naming the known ones."""
    found = _BY_KIND.get(kind)
    if found is None:
        raise ConfigError(f"unknown server kind {kind!r}", f"Use one of: {', '.join(KINDS)}.")
    return found


def find(kind: str | None) -> Engine | None:
    """The engine of ``kind``; None for no kind or one calibrate does not know."""
    return _BY_KIND.get(kind) if kind else None


def reporting_cap(source: str) -> Engine | None:
    """The engine whose own cap report is named ``source`` ("llama.cpp /props total_slots"):
    an unmanaged server's kind, told by the endpoint that answered."""
    return next((e for e in ENGINES if e.cap_report and e.cap_report.source == source), None)


def _preferring(*first: Engine) -> tuple[Engine, ...]:
    """``first`` in that order, then every other engine: a scrape of one server holds one
    engine's names, so the order matters only to an exporter that mixes them."""
    kinds = {e.kind for e in first}
    return (*first, *(e for e in ENGINES if e.kind not in kinds))


#: the KV-cache usage gauges, queue gauges and preemption counters of every engine, in the
#: order they are preferred
KV_METRICS = tuple(
    name
    for e in _preferring(vllm.ENGINE, sglang.ENGINE, lmdeploy.ENGINE, llamacpp.ENGINE)
    for name in e.metrics.kv
)
QUEUE_METRICS = tuple(
    name
    for e in _preferring(
        vllm.ENGINE, sglang.ENGINE, llamacpp.ENGINE, ollama_tgi.TGI, lmdeploy.ENGINE
    )
    for name in e.metrics.queue
)
PREEMPTION_METRICS = tuple(name for e in _preferring(vllm.ENGINE) for name in e.metrics.preemptions)
#: the running gauges (requests the server executes now), in the order the queue gauges are
RUNNING_METRICS = tuple(
    name
    for e in _preferring(
        vllm.ENGINE, sglang.ENGINE, llamacpp.ENGINE, ollama_tgi.TGI, lmdeploy.ENGINE
    )
    for name in e.metrics.running
)
WAITING_REASON_METRICS = tuple(name for e in ENGINES for name in e.metrics.waiting_by_reason)
#: where a running server says its own cap, asked in this order
CAP_REPORTS: tuple[CapReport, ...] = tuple(e.cap_report for e in ENGINES if e.cap_report)
#: engines that reserve their KV cache at start: NVML shows flat usage whatever the load
PREALLOCATING_KINDS: frozenset[str] = frozenset(e.kind for e in ENGINES if e.preallocates)
#: the prefix caches whose counters a scrape may hold, in the order they are looked for
PREFIX_CACHES: tuple[PrefixCacheInfo, ...] = tuple(
    e.prefix_cache for e in _preferring(vllm.ENGINE, sglang.ENGINE) if e.prefix_cache
)


@dataclass(frozen=True)
class Fingerprint:
    """An answer's ``system_fingerprint`` read for what it is: the engine's build, and the hash
    of its configuration where the engine puts one in (vLLM); llama.cpp's ``b4567-abc1234`` and
    TGI's ``2.0.1-native`` are a build alone."""

    text: str
    build: str
    config: str = ""  # "" when the fingerprint carries no configuration
    engine: str = ""  # "vLLM" when an engine's pattern matched

    def config_change(self, now: Fingerprint) -> str | None:
        """``"vLLM vllm-0.32.0: engine config 980f5236 → d34c11a0"`` when only the configuration
        changed from this one to ``now`` (same engine, same build); None otherwise."""
        if self.text == now.text or not self.config or self.build != now.build:
            return None
        return f"{self.engine} {self.build}: engine config {self.config} → {now.config}"


def read_fingerprint(text: str) -> Fingerprint:
    """``text`` split by the first engine whose pattern it matches; else the build alone."""
    for found in ENGINES:
        match = re.fullmatch(found.fingerprint, text) if found.fingerprint else None
        if match is not None:
            return Fingerprint(text, match["build"], match["config"], found.name)
    return Fingerprint(text, text)
