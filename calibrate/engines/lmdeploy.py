"""LMDeploy: ``lmdeploy serve api_server MODEL --server-port P … --enable-metrics``, its cap,
tune axes and metric names."""

from __future__ import annotations

from calibrate.engines.base import AxisValues, Engine, EngineMetrics, around
from calibrate.engines.sglang import ENABLE_METRICS


def default_axes(batch: int) -> tuple[AxisValues, ...]:
    return (("max_batch_size", around(batch)), ("cache_max_entry_count", ("0.5", "0.7", "0.9")))


ENGINE = Engine(
    kind="lmdeploy",
    name="LMDeploy",
    cap_key="max_batch_size",
    tune_flags={
        "max_batch_size": "--max-batch-size",
        "cache_max_entry_count": "--cache-max-entry-count",
    },
    program=("lmdeploy", "serve", "api_server"),
    port_flag="--server-port",
    name_flag="--model-name",
    trailing=(ENABLE_METRICS,),
    default_axes=default_axes,
    forcing="ignore_eos",
    preallocates=True,
    metrics=EngineMetrics(
        kv=("lmdeploy:gpu_cache_usage_perc",),
        queue=("lmdeploy:num_requests_waiting",),
        running=("lmdeploy:num_requests_running",),
    ),
)
