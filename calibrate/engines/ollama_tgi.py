"""The two engines with the fewest switches: Ollama (configured through its environment, models
pulled by name) and Hugging Face TGI (``text-generation-launcher``). Neither forces an answer's
length: it stops where the model stops."""

from __future__ import annotations

from calibrate.engines.base import (
    CAP_REASON,
    MODEL_REASON,
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


def build_ollama(spec: LaunchSpec) -> EngineCommand:
    """``OLLAMA_HOST=127.0.0.1:P [OLLAMA_NUM_PARALLEL=B] ollama serve``."""
    prepare(spec, OLLAMA)  # a tuned key ollama does not take is still refused
    env = [("OLLAMA_HOST", f"127.0.0.1:{spec.port}")]
    if spec.batch_size:
        env.append(("OLLAMA_NUM_PARALLEL", str(spec.batch_size)))
    return EngineCommand(("ollama", "serve"), tuple(env), None)


def build_tgi(spec: LaunchSpec) -> EngineCommand:
    """``text-generation-launcher --model-id MODEL --port P [--max-concurrent-requests B] …``."""
    ready = prepare(spec, TGI)
    argv = ["text-generation-launcher", "--model-id", spec.model_path, "--port", str(spec.port)]
    argv += flag("--max-concurrent-requests", spec.batch_size) + ready.extra
    return EngineCommand((*argv, *ready.user), (), TGI.health_path, ready.notes)


def _ollama_axes(batch: int) -> tuple[AxisValues, ...]:
    return (("num_parallel", around(batch)),)


def _tgi_axes(batch: int) -> tuple[AxisValues, ...]:
    return (
        ("max_concurrent_requests", around(batch)),
        ("max_batch_total_tokens", ("8192", "16384", "32768")),
    )


OLLAMA = Engine(
    kind="ollama",
    name="Ollama",
    build=build_ollama,
    cap_key="num_parallel",
    tune_flags={"num_parallel": "OLLAMA_NUM_PARALLEL"},
    args_refused=(
        'args is not used with kind = "ollama": ollama serve takes no engine flags '
        "(set OLLAMA_* variables in the environment calibrate runs in; it passes them on): "
        "remove args"
    ),
    default_axes=_ollama_axes,
    needs_model_path=False,
    forcing="none",
)
TGI = Engine(
    kind="tgi",
    name="TGI",
    build=build_tgi,
    cap_key="max_concurrent_requests",
    tune_flags={
        "max_concurrent_requests": "--max-concurrent-requests",
        "max_batch_total_tokens": "--max-batch-total-tokens",
    },
    own_flags={
        "--max-concurrent-requests": CAP_REASON,
        "--port": PORT_REASON,
        "--model-id": MODEL_REASON,
    },
    default_axes=_tgi_axes,
    health_path="/health",
    forcing="none",
    metrics=EngineMetrics(queue=("tgi_queue_size",)),
)
