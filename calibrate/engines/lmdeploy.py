"""LMDeploy: ``lmdeploy serve api_server``, its flags, cap, tune axes and metric names."""

from __future__ import annotations

from calibrate.engines.base import (
    CAP_REASON,
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
from calibrate.engines.sglang import ENABLE_METRICS


def build(spec: LaunchSpec) -> EngineCommand:
    """``lmdeploy serve api_server MODEL --server-port P … --enable-metrics``."""
    ready = prepare(spec, ENGINE)
    argv = ["lmdeploy", "serve", "api_server", spec.model_path, "--server-port", str(spec.port)]
    argv += flag("--model-name", spec.served_name) + flag("--max-batch-size", spec.batch_size)
    argv += [*ready.extra, ENABLE_METRICS]
    return EngineCommand((*argv, *ready.user), (), ENGINE.health_path, ready.notes)


def default_axes(batch: int) -> tuple[AxisValues, ...]:
    return (("max_batch_size", around(batch)), ("cache_max_entry_count", ("0.5", "0.7", "0.9")))


ENGINE = Engine(
    kind="lmdeploy",
    name="LMDeploy",
    build=build,
    cap_key="max_batch_size",
    tune_flags={
        "max_batch_size": "--max-batch-size",
        "cache_max_entry_count": "--cache-max-entry-count",
    },
    own_flags={
        "--max-batch-size": CAP_REASON,
        "--server-port": PORT_REASON,
        "--model-name": NAME_REASON,
    },
    default_axes=default_axes,
    forcing="ignore_eos",
    preallocates=True,
    metrics=EngineMetrics(
        kv=("lmdeploy:gpu_cache_usage_perc",), queue=("lmdeploy:num_requests_waiting",)
    ),
)
