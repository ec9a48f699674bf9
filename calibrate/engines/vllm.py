"""vLLM: ``vllm serve``, its flags, cap, tune axes and metric names."""

from __future__ import annotations

from calibrate.engines.base import (
    BATCHED_TOKENS,
    CAP_REASON,
    MODEL_REASON,
    NAME_REASON,
    PORT_REASON,
    AxisValues,
    Engine,
    EngineCommand,
    EngineMetrics,
    LaunchSpec,
    around,
    flag,
    prepare,
)


def build(spec: LaunchSpec) -> EngineCommand:
    """``vllm serve MODEL --port P [--served-model-name N] [--max-num-seqs B] …``."""
    ready = prepare(spec, ENGINE)
    argv = ["vllm", "serve", spec.model_path, "--port", str(spec.port)]
    argv += flag("--served-model-name", spec.served_name) + flag("--max-num-seqs", spec.batch_size)
    argv += ready.extra
    return EngineCommand((*argv, *ready.user), (), ENGINE.health_path, ready.notes)


def default_axes(batch: int) -> tuple[AxisValues, ...]:
    return (("max_num_seqs", around(batch)), ("max_num_batched_tokens", BATCHED_TOKENS))


ENGINE = Engine(
    kind="vllm",
    name="vLLM",
    build=build,
    cap_key="max_num_seqs",
    tune_flags={
        "max_num_seqs": "--max-num-seqs",
        "max_num_batched_tokens": "--max-num-batched-tokens",
        "gpu_memory_utilization": "--gpu-memory-utilization",
        "max_model_len": "--max-model-len",
    },
    own_flags={
        "--max-num-seqs": CAP_REASON,
        "--port": PORT_REASON,
        "--model": MODEL_REASON,
        "--served-model-name": NAME_REASON,
    },
    default_axes=default_axes,
    memory_key="gpu_memory_utilization",
    health_path="/health",
    preallocates=True,
    metrics=EngineMetrics(
        kv=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),  # the second: vLLM < 0.10
        queue=("vllm:num_requests_waiting",),
        preemptions=("vllm:num_preemptions_total",),
    ),
    context_hint="vLLM: raise --max-model-len",
)
