"""The mock server's knobs: one frozen value built from the command line or by tests."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MockSettings:
    """Every behaviour of the mock; the defaults describe a healthy, fast, unlimited server."""

    models: tuple[str, ...] = ("internlm-s2",)
    text_seed: int = 0
    seed: int = 0
    ttft_s: float = 0.05
    per_token_s: float = 0.01
    slots: int = 0
    slow_above: int | None = None
    slow_factor: float = 1.0
    vram_total_mib: int = 81920
    vram_base_mib: int = 40960
    vram_per_request_mib: int = 2048
    oom_at: int | None = None
    nondeterministic_above: int | None = None
    fail_rate: float = 0.0
    reset_rate: float = 0.0
    truncate_rate: float = 0.0
    slow_rate: float = 0.0
    slow_s: float = 1.0
    overload_rate: float = 0.0
    retry_after_s: float = 1.0
    whitespace_variant: bool = False
    no_done: bool = False
    no_usage: bool = False
    usage_in_last_chunk: bool = False
    unknown_model_status: int = 404
    any_model: bool = False  # accept any model name, answer as the first served one
    strict_422: bool = False
    expose_props: bool = False
    log_requests: bool = False
    max_model_len: int = 4096

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("at least one model name is needed")
        for name in ("fail_rate", "reset_rate", "truncate_rate", "slow_rate", "overload_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {rate}")
        if self.slots < 0:
            raise ValueError(f"slots must be ≥ 0 (0 = unlimited), got {self.slots}")
        if min(self.ttft_s, self.per_token_s, self.slow_s, self.retry_after_s) < 0:
            raise ValueError("times must be ≥ 0")
        if self.unknown_model_status not in (400, 404):
            raise ValueError("unknown_model_status must be 400 or 404")
