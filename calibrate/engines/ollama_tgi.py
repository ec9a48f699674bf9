"""The two engines with the fewest switches: Ollama (configured through its environment, models
pulled by name) and Hugging Face TGI (``text-generation-launcher --model-id MODEL --port P
[--max-concurrent-requests B] …``). Neither forces an answer's length: it stops where the model
stops."""

from __future__ import annotations

from calibrate.engines.base import (
    AxisValues,
    Engine,
    EngineCommand,
    EngineMetrics,
    LaunchSpec,
    around,
    tuned_flags,
)


def build_ollama(spec: LaunchSpec) -> EngineCommand:
    """``OLLAMA_HOST=127.0.0.1:P [OLLAMA_NUM_PARALLEL=B] ollama serve``."""
    tuned_flags(spec, OLLAMA)  # a tuned key ollama does not take is still refused
    env = [("OLLAMA_HOST", f"127.0.0.1:{spec.port}")]
    if spec.batch_size:
        env.append(("OLLAMA_NUM_PARALLEL", str(spec.batch_size)))
    return EngineCommand(("ollama", "serve"), tuple(env), None)


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
    cap_key="num_parallel",
    tune_flags={"num_parallel": "OLLAMA_NUM_PARALLEL"},
    launch=build_ollama,
    env_set=("OLLAMA_HOST", "OLLAMA_NUM_PARALLEL"),
    args_refused=(
        'args is not used with kind = "ollama": ollama serve takes no engine flags '
        "(set its OLLAMA_* variables in [server] env): "
        "remove args"
    ),
    default_axes=_ollama_axes,
    needs_model_path=False,
    forcing="none",
)
TGI = Engine(
    kind="tgi",
    name="TGI",
    cap_key="max_concurrent_requests",
    tune_flags={
        "max_concurrent_requests": "--max-concurrent-requests",
        "max_batch_total_tokens": "--max-batch-total-tokens",
    },
    program=("text-generation-launcher",),
    model_flag="--model-id",
    default_axes=_tgi_axes,
    health_path="/health",
    forcing="none",
    metrics=EngineMetrics(queue=("tgi_queue_size",), running=("tgi_batch_current_size",)),
)
