"""llama.cpp: ``llama-server -m MODEL --port P … --parallel B -c CTX … --metrics``, its slots,
HTTP threads, context and metric names."""

from __future__ import annotations

from calibrate.engines.base import (
    CAP_REASON,
    MODEL_REASON,
    NAME_REASON,
    AxisValues,
    CapReport,
    Engine,
    EngineMetrics,
    PrefixCacheInfo,
)

# llama.cpp divides -c among its --parallel slots; give each slot this many tokens unless the
# job says how many it needs (pin: LaunchSpec.context_tokens) or [server] args set -c.
LLAMACPP_CTX_PER_SLOT = 4096
# llama.cpp serves HTTP from a small thread pool: every start gets the most requests calibrate
# will have in flight + 2 (``base.HTTP_SPARE``, SPEC §5.8).
LLAMACPP_THREADS_HTTP = "--threads-http"
LLAMACPP_PARALLEL = (1, 2, 4, 8, 16)  # the slots tune tries by default, up to 2B


def default_axes(batch: int) -> tuple[AxisValues, ...]:
    return (("parallel", tuple(p for p in LLAMACPP_PARALLEL if p <= max(2 * batch, 1))),)


ENGINE = Engine(
    kind="llamacpp",
    name="llama.cpp",
    cap_key="parallel",
    tune_flags={"parallel": "--parallel", "ctx_size": "-c", "batch": "-b", "ubatch": "-ub"},
    program=("llama-server",),
    model_flag="-m",
    name_flag="--alias",
    trailing=("--metrics",),  # /metrics: the queue gauges explain a knee
    refused={
        "-np": CAP_REASON,
        "--model": MODEL_REASON,
        "-a": NAME_REASON,
    },
    default_axes=default_axes,
    health_path="/health",  # 503 while the model loads
    forcing="ignore_eos",
    metrics=EngineMetrics(
        kv=("llamacpp:kv_cache_usage_ratio",),
        queue=("llamacpp:requests_deferred",),
        running=("llamacpp:requests_processing",),
    ),
    cap_report=CapReport("/props", "total_slots", "llama.cpp /props total_slots"),
    # each slot keeps its last prompt; an answer's timings say how many tokens it reused
    prefix_cache=PrefixCacheInfo(
        "llama.cpp's slot prompt cache",
        per_answer="timings.cache_n",
        switch='on by default; a request\'s "cache_prompt": false turns it off',
    ),
    context_hint="llama.cpp: raise --ctx-size or lower --parallel",
    http_threads_flag=LLAMACPP_THREADS_HTTP,
    ctx_per_slot=LLAMACPP_CTX_PER_SLOT,
    ctx_spellings=("-c", "--ctx-size"),  # yours in [server] args: calibrate sizes none
    restarts_per_tier=True,  # its batch size is --parallel: each tier's slots are a restart
)
