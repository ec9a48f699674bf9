"""llama.cpp: ``llama-server``, its flags, slots, HTTP threads, context and metric names."""

from __future__ import annotations

from calibrate.engines.base import (
    CAP_REASON,
    MODEL_REASON,
    NAME_REASON,
    PORT_REASON,
    AxisValues,
    CapReport,
    Engine,
    EngineCommand,
    EngineMetrics,
    LaunchSpec,
    flag,
    prepare,
)

# llama.cpp divides -c among its --parallel slots; give each slot this many tokens unless the
# verified workload says how many it needs (pin: LaunchSpec.context_tokens).
LLAMACPP_CTX_PER_SLOT = 4096

# llama.cpp serves HTTP from a small thread pool (by default --parallel + 2 threads on a small
# machine); a kept-alive idle connection holds a thread until its 5 s keep-alive timeout, so more
# clients than threads stall for 5 s (measured: 16 clients, --parallel 4: 24.9 req/s and 6.3 s
# stalls; --threads-http 20: 123 req/s). Every llama.cpp start gets this many beyond the most
# requests calibrate will have in flight (SPEC §5.8).
LLAMACPP_THREADS_HTTP = "--threads-http"
LLAMACPP_HTTP_SPARE = 2
LLAMACPP_PARALLEL = (1, 2, 4, 8, 16)  # the slots tune tries by default, up to 2B

_CTX_REASON = (
    "calibrate sizes from the slots and the verified workload: remove it; "
    "search it with calibrate tune --grid ctx_size=V1,V2"
)
_THREADS_REASON = "calibrate sets from the most requests in flight + 2: remove it"


def threads_http(spec: LaunchSpec) -> int | None:
    """llama.cpp's HTTP threads for ``spec``: the most requests in flight (the concurrency, or
    the cap when that is larger) + 2; None when neither is known (the engine's default)."""
    return http_threads(spec.batch_size, spec.concurrency)


def http_threads(batch: int | None, concurrency: int | None) -> int | None:
    """The HTTP threads for cap ``batch`` and ``concurrency`` in flight (see ``threads_http``)."""
    known = [n for n in (concurrency, batch) if n]
    return max(known) + LLAMACPP_HTTP_SPARE if known else None


def build(spec: LaunchSpec) -> EngineCommand:
    """``llama-server -m MODEL --port P … --parallel B -c CTX … --metrics``."""
    ready = prepare(spec, ENGINE)
    slots = spec.batch_size
    argv = ["llama-server", "-m", spec.model_path, "--port", str(spec.port)]
    argv += flag("--alias", spec.served_name) + flag(LLAMACPP_THREADS_HTTP, threads_http(spec))
    argv += flag("--parallel", slots)
    ctx = spec.tuned_value("ctx_size") or spec.context_tokens
    ctx = ctx or (slots * LLAMACPP_CTX_PER_SLOT if slots else None)
    argv += [
        *flag("-c", ctx),
        *ready.extra,
        "--metrics",
    ]  # /metrics: the queue gauges explain a knee
    return EngineCommand((*argv, *ready.user), (), ENGINE.health_path, ready.notes)


def default_axes(batch: int) -> tuple[AxisValues, ...]:
    return (("parallel", tuple(p for p in LLAMACPP_PARALLEL if p <= max(2 * batch, 1))),)


ENGINE = Engine(
    kind="llamacpp",
    name="llama.cpp",
    build=build,
    cap_key="parallel",
    tune_flags={"parallel": "--parallel", "ctx_size": "-c", "batch": "-b", "ubatch": "-ub"},
    own_flags={
        "--parallel": CAP_REASON,
        "-np": CAP_REASON,
        "--port": PORT_REASON,
        "-m": MODEL_REASON,
        "--model": MODEL_REASON,
        "--alias": NAME_REASON,
        "-a": NAME_REASON,
        "-c": _CTX_REASON,
        "--ctx-size": _CTX_REASON,
        LLAMACPP_THREADS_HTTP: _THREADS_REASON,
    },
    default_axes=default_axes,
    health_path="/health",  # 503 while the model loads
    forcing="ignore_eos",
    metrics=EngineMetrics(
        kv=("llamacpp:kv_cache_usage_ratio",), queue=("llamacpp:requests_deferred",)
    ),
    cap_report=CapReport("/props", "total_slots", "llama.cpp /props total_slots"),
    context_hint="llama.cpp: raise --ctx-size or lower --parallel",
    http_threads_flag=LLAMACPP_THREADS_HTTP,
    ctx_per_slot=LLAMACPP_CTX_PER_SLOT,
    restarts_per_tier=True,  # its batch size is --parallel: each tier's slots are a restart
)
