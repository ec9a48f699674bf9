"""vLLM: ``vllm serve MODEL --port P [--served-model-name N] [--max-num-seqs B] …``, its cap,
tune axes and metric names."""

from __future__ import annotations

from calibrate.engines.base import (
    BATCHED_TOKENS,
    MODEL_REASON,
    AxisValues,
    BatchInvariance,
    Engine,
    EngineMetrics,
    PrefixCacheInfo,
    around,
)


def default_axes(batch: int) -> tuple[AxisValues, ...]:
    return (("max_num_seqs", around(batch)), ("max_num_batched_tokens", BATCHED_TOKENS))


ENGINE = Engine(
    kind="vllm",
    name="vLLM",
    batch_invariance=BatchInvariance(env="VLLM_BATCH_INVARIANT"),
    cap_key="max_num_seqs",
    tune_flags={
        "max_num_seqs": "--max-num-seqs",
        "max_num_batched_tokens": "--max-num-batched-tokens",
        "gpu_memory_utilization": "--gpu-memory-utilization",
        "max_model_len": "--max-model-len",
    },
    program=("vllm", "serve"),
    name_flag="--served-model-name",
    refused={"--model": MODEL_REASON},
    default_axes=default_axes,
    memory_key="gpu_memory_utilization",
    health_path="/health",
    preallocates=True,
    metrics=EngineMetrics(
        kv=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),  # the second: vLLM < 0.10
        queue=("vllm:num_requests_waiting",),
        preemptions=("vllm:num_preemptions_total",),
        running=("vllm:num_requests_running",),
        waiting_by_reason=("vllm:num_requests_waiting_by_reason",),  # vLLM ≥ 0.11 (V1)
    ),
    # vLLM ≥ 0.9 counts prompt tokens looked up and found (the gpu_ names before it), and says
    # whether the cache is on in cache_config_info (on by default since V1)
    prefix_cache=PrefixCacheInfo(
        "vLLM's automatic prefix caching",
        hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        queries=("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        state="vllm:cache_config_info",
        state_label="enable_prefix_caching",
        switch="vllm serve … --enable-prefix-caching",
    ),
    context_hint="vLLM: raise --max-model-len",
    # vllm-0.32.0-980f5236: the version, then a hash of the engine's config (980f5236 with no
    # cap, d34c11a0 at --max-num-seqs 8; the same across restarts with the same flags)
    fingerprint=r"(?P<build>vllm-.+)-(?P<config>[0-9a-f]{6,64})",
)
