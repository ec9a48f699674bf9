"""The mock server's knobs: one frozen value built from the command line or by tests."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

OnKvFull = Literal["oom", "preempt", "queue"]
ON_KV_FULL: tuple[OnKvFull, ...] = ("oom", "preempt", "queue")
MetricsStyle = Literal["mock", "vllm", "sglang", "llamacpp", "tgi", "lmdeploy"]
METRICS_STYLES: tuple[MetricsStyle, ...] = ("mock", "vllm", "sglang", "llamacpp", "tgi", "lmdeploy")
# how a request the engine cannot serve is answered: an HTTP error (vLLM, and LMDeploy from
# v0.16), or LMDeploy's HTTP 200 with finish_reason "error" and "internal error happened, status
# code ResponseType.…" as its text (v0.9.2 – v0.15)
ErrorStyle = Literal["http", "lmdeploy"]
ERROR_STYLES: tuple[ErrorStyle, ...] = ("http", "lmdeploy")
Outcome = Literal["ok", "oom", "fail", "reset", "overload"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "oom", "fail", "reset", "overload")
# the wrong shapes of --malformed-rate (mock.reply.malformed_body): what a broken server sends
SHAPES: tuple[str, ...] = (
    "choices-null",  # "choices": [null]
    "choices-number",  # "choices": [1]
    "message-string",  # the message (chat) or text (completions) is not what it should be
    "content-number",  # "content": 42 / "text": 42
    "no-choices",  # no "choices" at all
    "huge-usage",  # a good answer whose usage.completion_tokens is 10**330 (overflows a float)
    "negative-usage",  # a good answer whose usage counts are negative
)


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
    # a server that drifts: every request after the first N takes slow_after_factor × as long
    slow_after: int | None = None
    slow_after_factor: float = 2.0
    vram_total_mib: int = 81920
    vram_base_mib: int = 40960
    vram_per_request_mib: int = 2048
    oom_at: int | None = None
    nondeterministic_above: int | None = None
    diverge_at_token: int | None = None  # above that: answers differ from this token on (1-based)
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
    refuse_stream: bool = False  # "stream": true is HTTP 400, as a server that cannot stream
    refuse_stream_options: bool = False  # a body with stream_options is HTTP 400 (unknown field)
    expose_props: bool = False
    # SGLang's launch flag: its GET /get_server_info (served with metrics_style "sglang") names
    # it; 0: null there, as SGLang started without --max-running-requests says
    max_running_requests: int = 0
    log_requests: bool = False
    max_model_len: int = 4096
    slot_context: int = 0  # llama.cpp's per-slot context: prompt + answer past it is cut (0: off)
    # Hostile answers (issue 10): each drawn from its own seeded generator, apart from the faults.
    malformed_rate: float = 0.0  # a reply of a wrong shape (see SHAPES)
    echo_headers_rate: float = 0.0  # HTTP 500 whose message repeats the request's headers
    lone_surrogate: bool = False  # every answer ends with a JSON "\ud800" (a lone surrogate)
    drip_s: float = 0.0  # answers sent one byte every drip_s seconds
    keepalive_only: bool = False  # answers are SSE streams of ": ping" comments, nothing else
    keepalive_limit_s: float = 60.0  # ... until the client leaves or this long has passed
    huge_mib: float = 0.0  # answers padded to this many MiB
    # Memory that grows with tokens (issue 12): a request holds prompt + generated tokens of KV.
    kv_mib_per_1k_tokens: float = 0.0  # 0 = VRAM grows per request (vram_per_request_mib)
    kv_capacity_tokens: int = 0  # 0 = unlimited
    on_kv_full: OnKvFull = "oom"
    preallocate: bool = False  # used VRAM flat at base + the whole KV capacity, as vLLM/SGLang
    prefix_cache: bool = False  # identical prompt prefixes (whole KV blocks) are held once
    # each 1,000 prompt tokens not found in the prefix cache delay the first token this much
    prefill_ms_per_1k_tokens: float = 0.0
    step_ms_per_1k_tokens: float = 0.0  # each decode step costs this much more per 1k resident
    jitter: float = 0.0  # ttft and per-token time × uniform [1 - jitter, 1 + jitter], seeded
    answer_tokens: int = 0  # every answer this many tokens long (0: each prompt's own length)
    metrics_style: MetricsStyle = "mock"
    # chat messages go through a chat template before the answer is derived (as an instruct
    # model's engine applies one): a raw /v1/completions of the same text answers otherwise
    chat_template: bool = False
    metrics: bool = True  # False: GET /metrics is 404, an engine whose metrics are off
    # GET /metrics waits this long before it reads its gauges and answers: a slow scrape (real
    # vLLM's CPU build, asked every 50 ms, answered 120–300 ms apart while it generated)
    metrics_delay_s: float = 0.0
    error_style: ErrorStyle = "http"
    # Start-up memory (tune's memory step): asked for more than fits → exit 1 at start, CUDA OOM.
    memory_fraction: float | None = None
    max_memory_fraction: float | None = None
    # DCGM-style GPU power (SPEC §13): power_w + power_per_request_w × requests in flight, served
    # as DCGM_FI_DEV_POWER_USAGE and (dcgm_energy) DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION; 0: none.
    power_w: float = 0.0
    power_per_request_w: float = 0.0
    dcgm_energy: bool = True  # False: the power gauge alone (calibrate integrates it)

    @property
    def start_oom(self) -> str | None:
        """The CUDA-OOM text a real engine prints when its memory fraction does not fit."""
        f, g = self.memory_fraction, self.max_memory_fraction
        if f is None or g is None or f <= g:
            return None
        return (
            f"torch.OutOfMemoryError: CUDA out of memory while loading the model (simulated: "
            f"--memory-fraction {f:g} > --max-memory-fraction {g:g})"
        )

    @property
    def fingerprint(self) -> str:
        """The answers' ``system_fingerprint``: ``fp_mock_<text seed>``; under ``--metrics-style
        vllm`` vLLM's own form, ``vllm-<version>-<hash of the engine config>``, the version
        standing for the weights and build (the text seed) and the hash changing with the
        settings an engine's flags set (its slots, context, KV cache), as real vLLM's does."""
        if self.metrics_style != "vllm":
            return f"fp_mock_{self.text_seed}"
        config = (
            self.slots,
            self.max_model_len,
            self.kv_capacity_tokens,
            self.kv_mib_per_1k_tokens,
            self.on_kv_full,
            self.preallocate,
            self.prefix_cache,
            self.models,
        )
        digest = hashlib.sha256(repr(config).encode("utf-8")).hexdigest()[:8]
        return f"vllm-0.0.0+mock{self.text_seed}-{digest}"

    @property
    def tracks_tokens(self) -> bool:
        """Whether requests decode step by step against a token ledger (else: fixed timing)."""
        return bool(
            self.kv_mib_per_1k_tokens or self.kv_capacity_tokens or self.step_ms_per_1k_tokens
        )

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("at least one model name is needed")
        rates = ("fail_rate", "reset_rate", "truncate_rate", "slow_rate", "overload_rate")
        for name in (*rates, "malformed_rate", "echo_headers_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {rate}")
        if self.slots < 0:
            raise ValueError(f"slots must be ≥ 0 (0 = unlimited), got {self.slots}")
        if self.diverge_at_token is not None and (
            self.diverge_at_token < 1 or self.nondeterministic_above is None
        ):
            raise ValueError(
                "diverge_at_token needs nondeterministic_above and must be ≥ 1 (the first token)"
            )
        if self.slot_context < 0:
            raise ValueError(f"slot_context must be ≥ 0 (0 = off), got {self.slot_context}")
        times = (self.ttft_s, self.per_token_s, self.slow_s, self.retry_after_s, self.drip_s)
        if min(*times, self.metrics_delay_s) < 0 or self.keepalive_limit_s <= 0:
            raise ValueError("times must be ≥ 0")
        if (self.slow_after or 0) < 0 or self.slow_after_factor <= 0:
            raise ValueError("slow_after must be ≥ 0 and slow_after_factor > 0")
        if not 0 <= self.huge_mib <= 4096:
            raise ValueError(f"huge_mib must be in [0, 4096], got {self.huge_mib}")
        costs = (self.step_ms_per_1k_tokens, self.prefill_ms_per_1k_tokens)
        if min(self.kv_mib_per_1k_tokens, self.kv_capacity_tokens, *costs) < 0:
            raise ValueError("KV sizes, step and prefill costs must be ≥ 0")
        if min(self.power_w, self.power_per_request_w) < 0:
            raise ValueError("power_w and power_per_request_w must be ≥ 0")
        if self.answer_tokens < 0:
            raise ValueError(f"answer_tokens must be ≥ 0 (0 = off), got {self.answer_tokens}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")
        if self.on_kv_full not in ON_KV_FULL:
            raise ValueError(f"on_kv_full must be one of {', '.join(ON_KV_FULL)}")
        if self.metrics_style not in METRICS_STYLES:
            raise ValueError(f"metrics_style must be one of {', '.join(METRICS_STYLES)}")
        if self.error_style not in ERROR_STYLES:
            raise ValueError(f"error_style must be one of {', '.join(ERROR_STYLES)}")
        if self.unknown_model_status not in (400, 404):
            raise ValueError("unknown_model_status must be 400 or 404")
