"""The mock's ``/metrics`` in Prometheus text, named as the engine ``--metrics-style`` mimics.

Every style keeps the mock's own simulated-VRAM gauges (``mock_vram_*_bytes``), so a metrics
sampler measures device memory whatever the style. Beside them each engine's own names: its
running and queued requests and, where the engine exports one, its KV-cache usage:

- vllm: ``vllm:num_requests_running`` (at most the slots), ``vllm:num_requests_waiting`` (the
  prompts of a list beyond the slots too), ``vllm:num_requests_waiting_by_reason`` (capacity;
  deferred 0), ``vllm:kv_cache_usage_perc``
- sglang: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``
- llamacpp: ``llamacpp:requests_processing``, ``llamacpp:requests_deferred`` (no KV gauge, as
  current llama.cpp)
- tgi: ``tgi_batch_current_size``, ``tgi_queue_size`` (no KV gauge)
- lmdeploy: ``lmdeploy:num_requests_running``, ``lmdeploy:num_requests_waiting``,
  ``lmdeploy:gpu_cache_usage_perc``, labelled ``engine="0"`` (its data-parallel rank)
- mock (the default): the mock's gauges and the vLLM three, unlabelled by engine, as before.

With ``--power-w W``, a DCGM exporter's gauges for the simulated GPU beside them (labelled
``gpu="0"``): ``DCGM_FI_DEV_POWER_USAGE`` (W: W + ``--power-per-request-w`` × requests in flight)
and ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ since start; left out with ``--no-dcgm-energy``).

Under ``--on-kv-full preempt`` the engine's preemption counter too: ``vllm:num_preemptions_total``
(mock and vllm styles), ``sglang:num_retracted_requests_total`` (sglang).

The prefix cache (``mock.prefix``), as each engine publishes it, whether it is on or off:
vLLM's ``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` (prompt tokens
looked up and found; 0 while the cache is off) and ``vllm:cache_config_info`` with its
``enable_prefix_caching`` label (mock and vllm styles); SGLang's ``sglang:prompt_tokens_total``,
``sglang:cached_tokens_total`` and ``sglang:cache_hit_rate`` gauge. llama.cpp publishes none in
``/metrics``: its answers carry ``timings.cache_n`` (``mock.reply``); TGI none at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from calibrate.mock.kv import BLOCK_TOKENS, PrefixCounts
from calibrate.mock.settings import OUTCOMES, MetricsStyle, MockSettings

MIB = 1024 * 1024


@dataclass(frozen=True)
class Snapshot:
    """Gauges and counters at one moment, for /metrics and tests."""

    in_flight: int
    running: int
    waiting: int
    vram_used_mib: int
    vram_peak_mib: int
    vram_total_mib: int
    kv_cache_usage: float
    requests_total: int
    outcomes: dict[str, int]
    kv_tokens_in_use: int = 0
    kv_capacity_tokens: int = 0
    preemptions_total: int = 0  # sequences evicted from a full KV cache (on_kv_full="preempt")
    power_w: float = 0.0  # the simulated GPU's draw now (settings.power_w; 0: no GPU gauges)
    energy_mj: float = 0.0  # ... and the energy it has used since the mock started
    prefix: PrefixCounts = field(default_factory=PrefixCounts)  # the prefix cache's counters


# name, help, value-of-snapshot
Gauge = tuple[str, str, float]
_BY_REASON = "Waiting requests by reason: capacity, or deferred by a transient constraint."


def _metric(
    name: str, kind: str, help_text: str, samples: Sequence[tuple[str, float]]
) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    return lines + [f"{name}{labels} {value!r}" for labels, value in samples]


def _engine_gauges(style: MetricsStyle, snap: Snapshot) -> list[Gauge]:
    if style in ("mock", "vllm"):
        return [
            ("vllm:num_requests_running", "Requests in execution batches.", snap.running),
            ("vllm:num_requests_waiting", "Requests waiting to be processed.", snap.waiting),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage; 1 means 100 percent.",
                snap.kv_cache_usage,
            ),
        ]
    if style == "sglang":
        return [
            ("sglang:num_running_reqs", "The number of running requests.", snap.running),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", snap.waiting),
            ("sglang:token_usage", "The token usage.", snap.kv_cache_usage),
            ("sglang:num_used_tokens", "The number of used tokens.", snap.kv_tokens_in_use),
        ]
    if style == "llamacpp":
        return [
            ("llamacpp:requests_processing", "Number of requests processing.", snap.running),
            ("llamacpp:requests_deferred", "Number of requests deferred.", snap.waiting),
        ]
    if style == "lmdeploy":
        return [
            ("lmdeploy:num_requests_running", "Number of running requests.", snap.running),
            ("lmdeploy:num_requests_waiting", "Number of waiting requests.", snap.waiting),
            ("lmdeploy:gpu_cache_usage_perc", "GPU KV-cache usage.", snap.kv_cache_usage),
        ]
    return [
        ("tgi_batch_current_size", "Current batch size", snap.running),
        ("tgi_queue_size", "Current queue size", snap.waiting),
    ]


def _reasons(snap: Snapshot) -> list[tuple[str, float]]:
    """vLLM's reasons for waiting: capacity (slots or KV room, as its scheduler counts both);
    deferred (a LoRA budget, a KV transfer) the mock never does."""
    return [("capacity", snap.waiting), ("deferred", 0)]


def _with(labels: str, extra: str) -> str:
    """``{a="1"}`` with ``extra`` added: ``{a="1",reason="capacity"}``."""
    return f"{{{extra}}}" if not labels else f"{labels[:-1]},{extra}}}"


def _preemption_counter(style: MetricsStyle) -> str | None:
    """The engine's name for its preemption counter (vLLM's in the mock's own style)."""
    if style in ("mock", "vllm"):
        return "vllm:num_preemptions_total"
    return "sglang:num_retracted_requests_total" if style == "sglang" else None


def _labels(style: MetricsStyle, model: str) -> str:
    if style == "vllm":
        return f'{{engine="0",model_name="{model}"}}'
    if style == "lmdeploy":
        return '{engine="0"}'
    if style in ("mock", "sglang"):
        return f'{{model_name="{model}"}}'
    return ""


def _prefix_cache(style: MetricsStyle, labels: str, counts: PrefixCounts, on: bool) -> list[str]:
    """The prefix cache's counters under the engine's own names (none for llama.cpp and TGI)."""
    if style in ("mock", "vllm"):
        info = f'block_size="{BLOCK_TOKENS}",enable_prefix_caching="{on}"'
        info_labels = f'{{{info},engine="0"}}' if style == "vllm" else f"{{{info}}}"
        return [
            *_metric(
                "vllm:prefix_cache_queries_total",
                "counter",
                "Prefix cache queries, in terms of number of queried tokens.",
                [(labels, counts.queries_tokens)],
            ),
            *_metric(
                "vllm:prefix_cache_hits_total",
                "counter",
                "Prefix cache hits, in terms of number of cached tokens.",
                [(labels, counts.hits_tokens)],
            ),
            *_metric(
                "vllm:cache_config_info",
                "gauge",
                "Information of the LLMEngine CacheConfig",
                [(info_labels, 1.0)],
            ),
        ]
    if style == "sglang":
        return [
            *_metric(
                "sglang:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                [(labels, counts.prompt_tokens)],
            ),
            *_metric(
                "sglang:cached_tokens_total",
                "counter",
                "Number of cached prompt tokens.",
                [(labels, counts.hits_tokens)],
            ),
            *_metric(
                "sglang:cache_hit_rate",
                "gauge",
                "The prefix cache hit rate.",
                [(labels, counts.last_hit_rate)],
            ),
        ]
    return []


def render_metrics(snap: Snapshot, settings: MockSettings) -> str:
    """Prometheus text exposition of the simulated GPU, the engine's gauges and the counters."""
    style = settings.metrics_style
    own: list[Gauge] = [
        ("mock_vram_used_bytes", "Simulated GPU memory in use.", snap.vram_used_mib * MIB),
        ("mock_vram_total_bytes", "Simulated GPU memory in total.", snap.vram_total_mib * MIB),
        ("mock_vram_peak_bytes", "Highest simulated GPU memory in use.", snap.vram_peak_mib * MIB),
        ("mock_requests_in_flight", "Sequences received and not yet answered.", snap.in_flight),
    ]
    if settings.tracks_tokens:
        own.append(("mock_kv_tokens_used", "KV-cache tokens held now.", snap.kv_tokens_in_use))
        if snap.kv_capacity_tokens:
            own.append(("mock_kv_tokens_capacity", "KV-cache capacity.", snap.kv_capacity_tokens))
    if settings.preallocate:
        own.append(("mock_vram_preallocated", "1: used memory is reserved at start.", 1))
    lines: list[str] = []
    for name, help_text, value in own:
        lines += _metric(name, "gauge", help_text, [("", value)])
    labels = _labels(style, settings.models[0])
    for name, help_text, value in _engine_gauges(style, snap):
        lines += _metric(name, "gauge", help_text, [(labels, value)])
    if style in ("mock", "vllm"):  # every wait of the mock is for capacity (slots, KV room)
        reasons = [(_with(labels, f'reason="{r}"'), n) for r, n in _reasons(snap)]
        lines += _metric("vllm:num_requests_waiting_by_reason", "gauge", _BY_REASON, reasons)
    if settings.on_kv_full == "preempt" and (counter := _preemption_counter(style)):
        help_text = "Cumulative number of preemptions (KV cache full)."
        lines += _metric(counter, "counter", help_text, [(labels, snap.preemptions_total)])
    lines += _prefix_cache(style, labels, snap.prefix, settings.prefix_cache)
    if settings.power_w:
        gpu = '{gpu="0",UUID="GPU-mock-0",modelName="mock"}'
        lines += _metric(
            "DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", [(gpu, snap.power_w)]
        )
        if settings.dcgm_energy:
            help_text = "Total energy consumption since boot (in mJ)."
            lines += _metric(
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                "counter",
                help_text,
                [(gpu, snap.energy_mj)],
            )
    outcomes = [(f'{{outcome="{k}"}}', snap.outcomes.get(k, 0)) for k in OUTCOMES]
    lines += _metric("mock_requests_total", "counter", "Requests received, by outcome.", outcomes)
    return "\n".join(lines) + "\n"
