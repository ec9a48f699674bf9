"""The mock command's flags and the MockSettings they describe (``calibrate mock``, tests)."""

from __future__ import annotations

import argparse
import math
from dataclasses import fields

from calibrate.errors import UsageError
from calibrate.mock.settings import METRICS_STYLES, ON_KV_FULL, MockSettings


def add_flags(p: argparse.ArgumentParser) -> None:
    """Every flag of ``calibrate mock``: where it listens and how it behaves."""
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one (default 8000)")
    p.add_argument("--port-file", metavar="PATH", help="also write the port number to this file")
    p.add_argument("--model", action="append", metavar="NAME", help="served name (repeatable)")
    p.add_argument("--text-seed", type=int, default=0, help="changes every generated text")
    p.add_argument("--seed", type=int, default=0, help="seed of the fault draws")
    p.add_argument("--ttft", type=float, default=0.05, metavar="S", help="time to first token")
    p.add_argument("--per-token", type=float, default=0.01, metavar="S", help="time per token")
    p.add_argument("--slots", type=int, default=0, help="requests decoding at once (0 = no limit)")
    p.add_argument("--slow-above", type=int, metavar="N", help="in flight above N: slower tokens")
    p.add_argument("--slow-factor", type=float, default=1.0, help="per-token factor, --slow-above")
    p.add_argument("--vram-total-mib", type=int, default=81920)
    p.add_argument("--vram-base-mib", type=int, default=40960)
    p.add_argument("--vram-per-request-mib", type=int, default=2048)
    p.add_argument("--oom-at", type=int, metavar="N", help="in flight above N: CUDA OOM (500)")
    p.add_argument("--nondeterministic-above", type=int, metavar="N", help="above N: text varies")
    p.add_argument(
        "--diverge-at-token",
        type=int,
        metavar="T",
        help="with --nondeterministic-above: answers differ from token T on (seeded), not one word",
    )
    p.add_argument("--fail-rate", type=float, default=0.0, metavar="P", help="HTTP 500")
    p.add_argument("--reset-rate", type=float, default=0.0, metavar="P", help="drop connection")
    p.add_argument("--truncate-rate", type=float, default=0.0, metavar="P", help="cut, 'length'")
    p.add_argument("--slow-rate", type=float, default=0.0, metavar="P", help="add --slow-s")
    p.add_argument("--slow-s", type=float, default=1.0, metavar="S")
    p.add_argument("--overload-rate", type=float, default=0.0, metavar="P", help="HTTP 429")
    p.add_argument("--retry-after", type=float, default=1.0, metavar="S", help="429 Retry-After")
    p.add_argument("--whitespace-variant", action="store_true", help="append ' \\n' to outputs")
    p.add_argument("--no-done", action="store_true", help="streams end without data: [DONE]")
    p.add_argument("--no-usage", action="store_true", help="never send usage")
    p.add_argument("--usage-in-last-chunk", action="store_true", help="usage on the finish chunk")
    p.add_argument("--unknown-model-status", type=int, choices=(400, 404), default=404)
    p.add_argument(
        "--any-model",
        action="store_true",
        help="accept any model name and answer as the first --model (llama.cpp's habit)",
    )
    p.add_argument("--strict-422", action="store_true", help="invalid bodies get 422, not 400")
    p.add_argument(
        "--refuse-stream",
        action="store_true",
        help='answer any "stream": true request with HTTP 400 (a server or proxy that cannot stream)',
    )
    p.add_argument(
        "--refuse-stream-options",
        action="store_true",
        help="answer any request carrying stream_options with HTTP 400 (an unknown field to it)",
    )
    p.add_argument("--expose-props", action="store_true", help="serve llama.cpp's GET /props")
    p.add_argument("--log-requests", action="store_true", help="access log on stderr")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument(
        "--slot-context",
        type=int,
        default=0,
        metavar="N",
        help="llama.cpp's per-slot context (/props n_ctx): answers stop when prompt + answer "
        "reach N, finish_reason length (0: off)",
    )
    p.add_argument(
        "--malformed-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="replies of a wrong shape (choices [null] or [1], bad message or content, no choices)",
    )
    p.add_argument(
        "--echo-headers-rate",
        type=float,
        default=0.0,
        metavar="P",
        help="HTTP 500 whose message repeats the request headers (the key too)",
    )
    p.add_argument(
        "--lone-surrogate",
        action="store_true",
        help='answers end with a lone surrogate, the JSON escape "\\ud800"',
    )
    p.add_argument(
        "--drip-s",
        type=float,
        default=0.0,
        metavar="S",
        help="send answers one byte every S seconds (0 = at once)",
    )
    p.add_argument(
        "--keepalive-only",
        action="store_true",
        help='answer with an SSE stream of ": ping" comments and nothing else',
    )
    p.add_argument(
        "--keepalive-limit-s",
        type=float,
        default=60.0,
        metavar="S",
        help="--keepalive-only streams end after S seconds (default 60)",
    )
    p.add_argument(
        "--huge-mib",
        type=float,
        default=0.0,
        metavar="N",
        help="pad every answer's text to about N MiB",
    )
    p.add_argument(
        "--kv-mib-per-1k-tokens",
        type=float,
        default=0.0,
        metavar="F",
        help="simulated VRAM = base + F MiB per 1,000 KV tokens held (prompt + generated "
        "so far, per active request) instead of --vram-per-request-mib (0 = off)",
    )
    p.add_argument(
        "--kv-capacity-tokens",
        type=int,
        default=0,
        metavar="N",
        help="KV cache size in tokens; the KV-usage metric is tokens held / N (0 = unlimited)",
    )
    p.add_argument(
        "--on-kv-full",
        choices=ON_KV_FULL,
        default="oom",
        help="when a request's KV does not fit: oom = it fails with HTTP 500 'CUDA out "
        "of memory'; preempt = no error, every decode step takes (1 + k)× as long, k = "
        "the newest sequences that do not fit (recomputed, counted as waiting); queue = it waits for room "
        "for its prompt and answer, counted as queued (default oom)",
    )
    p.add_argument(
        "--preallocate",
        action="store_true",
        help="used VRAM flat at base + the whole KV capacity from the start (as vLLM "
        "and SGLang reserve it) while the KV-usage metric still rises",
    )
    p.add_argument(
        "--prefix-cache",
        action="store_true",
        help="prompts sharing a prefix hold its whole 16-token KV blocks once",
    )
    p.add_argument(
        "--step-ms-per-1k-tokens",
        type=float,
        default=0.0,
        metavar="F",
        help="each decode step costs F ms more per 1,000 tokens held by the batch: "
        "per-token time = --per-token + F/1000 × tokens/1000 (default 0)",
    )
    p.add_argument(
        "--jitter",
        type=float,
        default=0.0,
        metavar="F",
        help="multiply each request's ttft and per-token time by a seeded uniform draw "
        "in [1-F, 1+F] (--seed; default 0)",
    )
    p.add_argument(
        "--metrics-style",
        choices=METRICS_STYLES,
        default="mock",
        help="/metrics names as vllm, sglang, llamacpp or tgi export them, queue gauge "
        "included; mock = the mock's own plus vLLM's (default); the mock_vram_* "
        "gauges are always there",
    )
    p.add_argument(
        "--power-w",
        type=float,
        default=0.0,
        metavar="W",
        help="serve a DCGM exporter's GPU gauges on /metrics: power = W + --power-per-request-w "
        "× requests in flight (DCGM_FI_DEV_POWER_USAGE) and the energy it adds up "
        "(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ); default 0 = none",
    )
    p.add_argument(
        "--power-per-request-w",
        type=float,
        default=0.0,
        metavar="W",
        help="with --power-w: watts more per request in flight (default 0)",
    )
    p.add_argument(
        "--no-dcgm-energy",
        dest="dcgm_energy",
        action="store_false",
        help="with --power-w: the power gauge alone, no energy counter (calibrate integrates "
        "the power)",
    )
    p.add_argument(
        "--memory-fraction",
        type=float,
        metavar="F",
        help="the memory fraction it is started with (a tune axis)",
    )
    p.add_argument(
        "--max-memory-fraction",
        type=float,
        metavar="G",
        help="with --memory-fraction F > G: exit 1 at start with a CUDA OOM message",
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
