"""The workload (SPEC §5.11): what ladder, sweep and tune send — its spec (``spec``) and how the
flags over the ``[workload]`` section resolve to it (``resolve``)."""

from calibrate.workload.resolve import (
    AxisFlags,
    ResolvedWorkload,
    WorkloadFlags,
    parse_context_lengths,
    resolve_workload,
    resolve_workload_flags,
)
from calibrate.workload.spec import (
    MAX_BATCH_SIZE,
    MAX_CONTEXT_STEPS,
    MAX_INPUT_TOKENS,
    MAX_OUTPUT_TOKENS,
    PICKS,
    Axis,
    JobTrace,
    Pick,
    TokenRange,
    WorkloadSource,
    WorkloadSpec,
    parse_token_range,
)

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_CONTEXT_STEPS",
    "MAX_INPUT_TOKENS",
    "MAX_OUTPUT_TOKENS",
    "PICKS",
    "Axis",
    "AxisFlags",
    "JobTrace",
    "Pick",
    "ResolvedWorkload",
    "TokenRange",
    "WorkloadFlags",
    "WorkloadSource",
    "WorkloadSpec",
    "parse_context_lengths",
    "parse_token_range",
    "resolve_workload",
    "resolve_workload_flags",
]
