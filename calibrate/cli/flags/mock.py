"""The mock command's flags and the MockSettings they describe (``calibrate mock``, tests)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

from calibrate.errors import UsageError
from calibrate.mock.settings import ERROR_STYLES, METRICS_STYLES, ON_KV_FULL, MockSettings

# Every setting's flag: (flag, metavar, help). Its type and default are the MockSettings field's
# of the flag's name (``--ttft`` sets ``ttft_s``; ``--no-X`` of a field X that defaults to True
# clears it); a bool field is a switch.
# fmt: off
SETTINGS: tuple[tuple[str, str | None, str | None], ...] = (
    ("--text-seed", None, "changes every generated text"),
    ("--seed", None, "seed of the fault draws"),
    ("--ttft", "S", "time to first token"),
    ("--per-token", "S", "time per token"),
    ("--slots", None, "requests decoding at once (0 = no limit)"),
    ("--slow-above", "N", "in flight above N: slower tokens"),
    ("--slow-factor", None, "per-token factor, --slow-above"),
    ("--slow-after", "N", "a server that drifts: every request after the first N takes "
     "--slow-after-factor × as long (first token and each token after it)"),
    ("--slow-after-factor", "F", "with --slow-after: how much slower (default 2)"),
    ("--vram-total-mib", None, None),
    ("--vram-base-mib", None, None),
    ("--vram-per-request-mib", None, None),
    ("--oom-at", "N", "in flight above N: CUDA OOM (500)"),
    ("--nondeterministic-above", "N", "above N running in one batch (not queued): text varies"),
    ("--diverge-at-token", "T",
     "with --nondeterministic-above: answers differ from token T on (seeded), not one word"),
    ("--fail-rate", "P", "HTTP 500"),
    ("--reset-rate", "P", "drop connection"),
    ("--truncate-rate", "P", "cut, 'length'"),
    ("--slow-rate", "P", "add --slow-s"),
    ("--slow-s", "S", None),
    ("--overload-rate", "P", "HTTP 429"),
    ("--retry-after", "S", "429 Retry-After"),
    ("--whitespace-variant", None, "append ' \\n' to outputs"),
    ("--no-done", None, "streams end without data: [DONE]"),
    ("--no-usage", None, "never send usage"),
    ("--usage-in-last-chunk", None, "usage on the finish chunk"),
    ("--unknown-model-status", None, None),
    ("--any-model", None, "accept any model name and answer as the first --model (llama.cpp's habit)"),
    ("--strict-422", None, "invalid bodies get 422, not 400"),
    ("--refuse-stream", None,
     'answer any "stream": true request with HTTP 400 (a server or proxy that cannot stream)'),
    ("--refuse-stream-options", None,
     "answer any request carrying stream_options with HTTP 400 (an unknown field to it)"),
    ("--expose-props", None, "serve llama.cpp's GET /props"),
    ("--max-running-requests", "N", "with --metrics-style sglang: SGLang's GET /get_server_info "
     "names N as its max_running_requests (default 0: null, as SGLang started without it)"),
    ("--log-requests", None, "access log on stderr"),
    ("--max-model-len", None, None),
    ("--slot-context", "N", "llama.cpp's per-slot context (/props n_ctx): answers stop when "
     "prompt + answer reach N, finish_reason length (0: off)"),
    ("--malformed-rate", "P",
     "replies of a wrong shape (choices [null] or [1], bad message or content, no choices)"),
    ("--echo-headers-rate", "P",
     "HTTP 500 whose message repeats the request headers (the key too)"),
    ("--lone-surrogate", None, 'answers end with a lone surrogate, the JSON escape "\\ud800"'),
    ("--drip-s", "S", "send answers one byte every S seconds (0 = at once)"),
    ("--keepalive-only", None, 'answer with an SSE stream of ": ping" comments and nothing else'),
    ("--keepalive-limit-s", "S", "--keepalive-only streams end after S seconds (default 60)"),
    ("--huge-mib", "N", "pad every answer's text to about N MiB"),
    ("--kv-mib-per-1k-tokens", "F", "simulated VRAM = base + F MiB per 1,000 KV tokens held "
     "(prompt + generated so far, per active request) instead of --vram-per-request-mib (0 = off)"),
    ("--kv-capacity-tokens", "N",
     "KV cache size in tokens; the KV-usage metric is tokens held / N (0 = unlimited)"),
    ("--on-kv-full", None, "when a request's KV does not fit: oom = it fails with HTTP 500 'CUDA "
     "out of memory'; preempt = no error, every decode step takes (1 + k)× as long, k = the "
     "newest sequences that do not fit (recomputed, counted as waiting); queue = it waits for "
     "room for its prompt and answer, counted as queued (default oom)"),
    ("--preallocate", None, "used VRAM flat at base + the whole KV capacity from the start (as "
     "vLLM and SGLang reserve it) while the KV-usage metric still rises"),
    ("--prefix-cache", None, "a prefix cache: prompts sharing a prefix hold its whole 16-token "
     "KV blocks once, and blocks seen before are not prefilled again; its hit counters in every "
     "--metrics-style as that engine publishes them (llama.cpp: each answer's timings.cache_n)"),
    ("--prefill-ms-per-1k-tokens", "F", "the first token waits F ms more per 1,000 prompt tokens "
     "not found in the prefix cache (default 0: prompts cost nothing to read)"),
    ("--step-ms-per-1k-tokens", "F", "each decode step costs F ms more per 1,000 tokens held by "
     "the batch: per-token time = --per-token + F/1000 × tokens/1000 (default 0)"),
    ("--jitter", "F", "multiply each request's ttft and per-token time by a seeded uniform draw "
     "in [1-F, 1+F] (--seed; default 0)"),
    ("--answer-tokens", "N", "every answer N tokens long, whatever its prompt (default 0: each "
     "prompt's own length)"),
    ("--metrics-style", None, "/metrics names as vllm, sglang, llamacpp, tgi or lmdeploy export "
     "them, queue gauge included; mock = the mock's own plus vLLM's (default); the mock_vram_* "
     "gauges are always there"),
    ("--chat-template", None, "apply a chat template to chat messages, as an engine serving an "
     "instruct model does: a raw /v1/completions of the same text then answers otherwise"),
    ("--no-metrics", None, "GET /metrics is 404, as an engine whose metrics are off (LMDeploy "
     "0.9.2–0.10.x without --enable-metrics)"),
    ("--metrics-delay-s", "S", "GET /metrics waits S seconds before it reads its gauges and "
     "answers: a slow scrape, as vLLM's CPU build answered 0.12–0.3 s apart while generating "
     "(default 0)"),
    ("--error-style", None, "lmdeploy: a prompt over --max-model-len and a --fail-rate fault are "
     "HTTP 200 with finish_reason \"error\" and LMDeploy's text (v0.9.2–v0.15), not 400 / 500"),
    ("--power-w", "W", "serve a DCGM exporter's GPU gauges on /metrics: power = W + "
     "--power-per-request-w × requests in flight (DCGM_FI_DEV_POWER_USAGE) and the energy it "
     "adds up (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ); default 0 = none"),
    ("--power-per-request-w", "W", "with --power-w: watts more per request in flight (default 0)"),
    ("--no-dcgm-energy", None,
     "with --power-w: the power gauge alone, no energy counter (calibrate integrates the power)"),
    ("--memory-fraction", "F", "the memory fraction it is started with (a tune axis)"),
    ("--max-memory-fraction", "G", "with --memory-fraction F > G: exit 1 at start with a CUDA OOM "
     "message"),
)
# fmt: on
CHOICES: dict[str, tuple[object, ...]] = {
    "unknown_model_status": (400, 404),
    "on_kv_full": ON_KV_FULL,
    "metrics_style": METRICS_STYLES,
    "error_style": ERROR_STYLES,
}
TIMINGS = ("ttft", "per_token", "retry_after")  # flags of the settings named with _s
TYPES: dict[str, Callable[[str], Any]] = {"int": int, "float": float}  # else a string


def add_flags(p: argparse.ArgumentParser) -> None:
    """Every flag of ``calibrate mock``: where it listens and how it behaves."""
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (default 8000)")
    p.add_argument("--port-file", metavar="PATH", help="also write the port number to this file")
    p.add_argument("--model", action="append", metavar="NAME", help="served name (repeatable)")
    known = {f.name: f for f in fields(MockSettings)}
    for flag, metavar, text in SETTINGS:
        dest = flag[2:].replace("-", "_")
        field = known.get(dest + "_s" if dest in TIMINGS else dest) or known[dest[3:]]
        default, kind = field.default, str(field.type).split(" | ")[0]
        assert default is not MISSING, field.name
        if kind == "bool":  # a switch; --no-X clears X
            action = "store_false" if default else "store_true"
            p.add_argument(flag, dest=field.name, action=action, help=text)
        else:
            kind_of, choices = TYPES.get(kind, str), CHOICES.get(dest)
            p.add_argument(
                flag, type=kind_of, default=default, choices=choices, metavar=metavar, help=text
            )


def settings_from_args(args: argparse.Namespace) -> MockSettings:
    """The MockSettings the flags describe."""
    # every setting but the models and the three timings is the flag of the same name
    apart = ("models", "ttft_s", "per_token_s", "retry_after_s")
    names = [f.name for f in fields(MockSettings) if f.name not in apart]
    values = {name: getattr(args, name) for name in names}
    timings = {"ttft": args.ttft, "per_token": args.per_token, "retry_after": args.retry_after}
    for name, value in (*values.items(), *timings.items()):
        if isinstance(value, float) and not math.isfinite(value):  # inf, nan: no time, no rate
            flag = "--" + name.replace("_", "-")
            raise UsageError(
                f"{flag} {value}: must be a finite number", "See: calibrate mock --help"
            )
    if not 0 <= args.port <= 65535:
        raise UsageError(
            f"--port {args.port}: must be in 0–65535", "Pick another, or --port 0 for a free one."
        )
    try:
        return MockSettings(
            models=tuple(args.model or ("internlm-s2",)),
            ttft_s=args.ttft,
            per_token_s=args.per_token,
            retry_after_s=args.retry_after,
            **values,
        )
    except ValueError as exc:
        raise UsageError(f"bad mock setting: {exc}", "See: calibrate mock --help") from exc
