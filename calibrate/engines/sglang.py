"""SGLang: ``python3 -m sglang.launch_server --model-path MODEL --port P … --enable-metrics``,
its cap, tune axes and metric names."""

from __future__ import annotations

from calibrate.engines.base import (
    BATCHED_TOKENS,
    MODEL_REASON,
    AxisValues,
    BatchInvariance,
    CapReport,
    Engine,
    EngineMetrics,
    PrefixCacheInfo,
    around,
)

# SGLang serves /metrics only with this flag (off by default): without it its KV-cache usage
# (the pressure signal of an engine that reserves its memory at start) and queue gauge are
# missing, and the ladder's VRAM stop rule reads a flat NVML line.
ENABLE_METRICS = "--enable-metrics"


def default_axes(batch: int) -> tuple[AxisValues, ...]:
    return (("max_running_requests", around(batch)), ("chunked_prefill_size", BATCHED_TOKENS[:3]))


ENGINE = Engine(
    kind="sglang",
    name="SGLang",
    batch_invariance=BatchInvariance(flag="--enable-deterministic-inference"),
    cap_key="max_running_requests",
    tune_flags={
        "max_running_requests": "--max-running-requests",
        "chunked_prefill_size": "--chunked-prefill-size",
        "mem_fraction_static": "--mem-fraction-static",
    },
    program=("python3", "-m", "sglang.launch_server"),
    model_flag="--model-path",
    name_flag="--served-model-name",
    trailing=(ENABLE_METRICS,),
    metrics_hint='start SGLang with --enable-metrics (kind = "sglang" does)',
    refused={"--model": MODEL_REASON},
    default_axes=default_axes,
    memory_key="mem_fraction_static",
    health_path="/health",
    preallocates=True,
    # newer SGLang names its metrics with "sglang_"
    metrics=EngineMetrics(
        kv=("sglang:token_usage", "sglang_token_usage"),
        queue=("sglang:num_queue_reqs", "sglang_num_queue_reqs"),
        preemptions=("sglang:num_retracted_requests_total", "sglang_num_retracted_requests_total"),
        running=("sglang:num_running_reqs", "sglang_num_running_reqs"),
    ),
    # /get_server_info holds the launch arguments: max_running_requests is null unless given
    cap_report=CapReport(
        "/get_server_info",
        "max_running_requests",
        "SGLang max_running_requests",
        unset="SGLang names its cap there only when started with --max-running-requests N",
    ),
    # the radix cache's tokens found, of the prompt tokens received (on unless switched off)
    prefix_cache=PrefixCacheInfo(
        "SGLang's radix cache",
        hits=("sglang:cached_tokens_total", "sglang_cached_tokens_total"),
        queries=("sglang:prompt_tokens_total", "sglang_prompt_tokens_total"),
        switch="on unless SGLang is started with --disable-radix-cache",
    ),
)
