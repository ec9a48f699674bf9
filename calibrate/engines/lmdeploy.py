"""LMDeploy: ``lmdeploy serve api_server MODEL --server-port P …``, its cap, tune axes and
metric names.

Its ``/metrics`` came in v0.9.2 behind ``--enable-metrics``; from v0.11.0 they are on by default
and that flag is gone (``--disable-metrics`` turns them off), so passing it stops the start with
"unrecognized arguments" — as it does before v0.9.2, which has no metrics at all. calibrate passes
no metrics flag; on v0.9.2 – v0.10.x put ``--enable-metrics`` in ``[server] args`` (the warning
of a ladder that finds no KV-cache gauge says so).
"""

from __future__ import annotations

from calibrate.engines.base import AxisValues, Engine, EngineMetrics, around


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
    metrics_hint=(
        "LMDeploy serves /metrics by default from v0.11; on v0.9.2–v0.10.x only with "
        '--enable-metrics: add it to [server] args (args = ["--enable-metrics", …])'
    ),
    default_axes=default_axes,
    forcing="ignore_eos",
    preallocates=True,
    metrics=EngineMetrics(
        kv=("lmdeploy:gpu_cache_usage_perc",),
        queue=("lmdeploy:num_requests_waiting",),
        running=("lmdeploy:num_requests_running",),
    ),
)
