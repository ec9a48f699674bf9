#!/usr/bin/env python3
"""Serve a model with `transformers serve --continuous-batching` under a CUDA memory cap.

The `make gpu-proof` engine: calibrate starts it as its `[server] kind = "custom"` command, so
calibrate owns its PID, stops it and restarts it (rollback). In one process:

1. before anything touches CUDA, `torch.cuda.set_per_process_memory_fraction(F0)`: a generous
   start-up cap computed from the model (the arithmetic is printed and written to --cap-file);
2. runs the `transformers serve` entry point in-process (`Serve(...)`, no CLI: the CLI would ask
   PyPI for updates) with continuous batching, a paged KV cache sized explicitly (--cb-num-blocks,
   so it is *not* sized from the device's free memory, which ignores the cap), a fixed
   max_batch_tokens, no CUDA graphs, and the engine's cap on requests per batch = --batch-size;
3. a helper thread waits for /health, sends one short greedy request (the paged cache and its
   IO buffers are allocated lazily, at the first request) and then one request of
   --input-tokens, and measures what that one prefill adds to the allocated memory (act). It then
   tightens the cap to F = (memory reserved now + (HEADROOM_REQUESTS - 1) x act) / device total:
   room for HEADROOM_REQUESTS prefills of that length in one engine step.

Why activations, not KV: transformers' continuous batching allocates the whole paged KV cache at
the first request and queues (never OOMs) when it is full, so KV bytes per token size the cache,
not the failure. What grows with the batch is the prefill: a wave of B requests of L tokens lands
in one or two engine steps of up to B x L tokens (max_batch_tokens = MAX_STEP_REQUESTS x L), and
each step's activations scale with its tokens. With HEADROOM_REQUESTS = 5: batch 1, 2 and 4 always
fit (a step holds at most 4 x L tokens); batch 8 runs out of memory unless its wave splits 4 + 4
or in three; batch 16 cannot fit (its steps hold 8 x L tokens). The CUDA out-of-memory error kills
the engine's worker, every request in flight gets HTTP 503 with the error text, and /health
answers 503 from then on — the ladder records `oom` and stops there.

Without CUDA (the dry run) nothing is capped: the warm-up and the cap file still happen.

The KV arithmetic (1b proof model, bf16): 22 layers x 2 (K, V) x 4 KV heads x 64 x 2 B = 22,528 B
per token. The cache holds BATCH_CEILING x (L + OUTPUT) tokens: 16 x (4096 + 64) tokens = 70,656
tokens = 1.48 GiB, so the cache never queues a wave of up to 16; the weights are 1.94 GB.
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import json
import math
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
GIB = 1024 * MIB
PAGE_SIZE = 256  # transformers' default page_size: tokens per cache block
HEADROOM_REQUESTS = 5.0  # the tightened cap leaves room for this many L-token prefills at once
MAX_STEP_REQUESTS = 8  # max_batch_tokens = this x L: up to 8 prefills in one engine step
START_SLACK_BYTES = 8 * GIB  # CUDA context, cuBLAS workspaces, allocator rounding (start-up cap)
HEALTH_TIMEOUT_S = 600.0
REQUEST_TIMEOUT_S = 300.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--model", required=True, help="model directory (the served model name)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="the engine's cap on requests per batch (calibrate's verified batch)",
    )
    parser.add_argument(
        "--batch-ceiling",
        type=int,
        default=16,
        help="the ladder's top tier: the KV cache holds this many requests",
    )
    parser.add_argument(
        "--input-tokens", type=int, default=4096, help="L: the ladder's input length"
    )
    parser.add_argument("--output-tokens", type=int, default=64, help="output budget per request")
    parser.add_argument("--cap-file", type=Path, help="where to write the cap arithmetic (JSON)")
    parser.add_argument("--no-cap", action="store_true", help="serve without the memory cap")
    return parser.parse_args(argv)


def model_shape(model_dir: Path) -> dict[str, Any]:
    config = json.loads((model_dir / "config.json").read_text("utf-8"))
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    return {
        "layers": layers,
        "hidden": hidden,
        "intermediate": int(config["intermediate_size"]),
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab": int(config["vocab_size"]),
        # layers x (K and V) x KV heads x head_dim x 2 bytes (bf16)
        "kv_bytes_per_token": layers * 2 * kv_heads * head_dim * 2,
        "weights_bytes": weights,
    }


def plan(args: argparse.Namespace, shape: dict[str, Any]) -> dict[str, Any]:
    """Cache blocks, max_batch_tokens and the start-up cap's byte budget, all written down."""
    seq_tokens = args.input_tokens + args.output_tokens
    num_blocks = args.batch_ceiling * math.ceil(seq_tokens / PAGE_SIZE) + 4
    cache_tokens = num_blocks * PAGE_SIZE
    max_batch_tokens = MAX_STEP_REQUESTS * args.input_tokens
    cache_bytes = cache_tokens * shape["kv_bytes_per_token"]
    # The SDPA path keeps an attention mask [max_batch_tokens, cache + max_batch_tokens] in bf16,
    # twice when async batching double-buffers its inputs.
    mask_bytes = 2 * 2 * max_batch_tokens * (cache_tokens + max_batch_tokens)
    # A generous per-token activation estimate (bf16): the MLP's gate, up and product (3 x
    # intermediate) and a handful of hidden-sized tensors (residual, norm, q, o, repeated K/V).
    act_bytes_per_token = 2 * (3 * shape["intermediate"] + 8 * shape["hidden"])
    act_bytes = args.batch_ceiling * args.input_tokens * act_bytes_per_token
    start_bytes = shape["weights_bytes"] + cache_bytes + mask_bytes + act_bytes + START_SLACK_BYTES
    return {
        "input_tokens": args.input_tokens,
        "output_tokens": args.output_tokens,
        "batch_ceiling": args.batch_ceiling,
        "page_size": PAGE_SIZE,
        "num_blocks": num_blocks,
        "cache_tokens": cache_tokens,
        "max_batch_tokens": max_batch_tokens,
        "kv_bytes_per_token": shape["kv_bytes_per_token"],
        "cache_mib": round(cache_bytes / MIB, 1),
        "weights_mib": round(shape["weights_bytes"] / MIB, 1),
        "mask_mib_estimate": round(mask_bytes / MIB, 1),
        "activation_mib_estimate_at_ceiling": round(act_bytes / MIB, 1),
        "start_cap_mib": round(start_bytes / MIB, 1),
    }


def write_cap(path: Path | None, data: dict[str, Any]) -> None:
    print(f"gpu_proof_launcher: {json.dumps(data, sort_keys=True)}", flush=True)
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", "utf-8")
    tmp.replace(path)


def post_chat(root: str, model: str, text: str, max_tokens: int) -> dict[str, Any]:
    body = json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "temperature": 0,
            "max_tokens": max_tokens,
            "stream": False,
        }
    ).encode()
    request = urllib.request.Request(
        f"{root}/v1/chat/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def wait_health(root: str) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{root}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{root}/health did not answer 200 within {HEALTH_TIMEOUT_S:.0f} s")


def long_prompt(model_dir: Path, tokens: int) -> str:
    """Text whose chat-formatted prompt is about ``tokens`` tokens long."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    unit = " 1 2 3 4 5 6 7 8 9"
    per_unit = max(1, len(tokenizer(unit, add_special_tokens=False)["input_ids"]))
    return "Count:" + unit * max(1, (tokens - 12) // per_unit)


def tighten(args: argparse.Namespace, cuda: bool, record: dict[str, Any]) -> None:
    """Warm up through HTTP, measure one L-token prefill, then set the real cap."""
    import torch

    root = f"http://{args.host}:{args.port}"
    try:
        wait_health(root)
        start = time.monotonic()
        post_chat(root, args.model, "Say OK.", 64)  # allocates the paged cache and its buffers
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        answer = post_chat(root, args.model, long_prompt(Path(args.model), args.input_tokens), 64)
        record["warmup_prompt_tokens"] = answer.get("usage", {}).get("prompt_tokens")
        record["warmup_s"] = round(time.monotonic() - start, 2)
        if cuda:
            torch.cuda.synchronize()
            act = max(torch.cuda.max_memory_allocated() - base, MIB)
            reserved = torch.cuda.memory_reserved()
            total = torch.cuda.mem_get_info()[1]
            limit = reserved + (HEADROOM_REQUESTS - 1) * act
            fraction = min(0.95, limit / total)
            if not args.no_cap:
                torch.cuda.set_per_process_memory_fraction(fraction)
            record.update(
                {
                    "state": "capped" if not args.no_cap else "measured (--no-cap)",
                    "allocated_before_mib": round(base / MIB, 1),
                    "prefill_activation_mib": round(act / MIB, 1),
                    "reserved_mib": round(reserved / MIB, 1),
                    "headroom_requests": HEADROOM_REQUESTS,
                    "limit_mib": round(limit / MIB, 1),
                    "fraction": round(fraction, 5),
                    "device_total_mib": round(total / MIB, 1),
                    "expected_fit_batch": 4,
                    "expected_oom_batch": "8 (unless its wave splits 4+4 or in three), else 16",
                }
            )
        else:
            record["state"] = "no CUDA: not capped"
    except Exception as exc:  # the helper must never take the server down; say what went wrong
        record["state"] = f"error: {type(exc).__name__}: {exc}"
    write_cap(args.cap_file, record)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    cuda = torch.cuda.is_available() and args.device != "cpu"
    device = args.device if args.device != "auto" else ("cuda" if cuda else "cpu")
    shape = model_shape(Path(args.model))
    record: dict[str, Any] = {
        "pid": os.getpid(),
        "device": device,
        "batch_size": args.batch_size,
        "torch": torch.__version__,
        "state": "starting",
        **plan(args, shape),
    }
    if cuda and not args.no_cap:
        total = torch.cuda.mem_get_info()[1]
        start_fraction = min(0.95, record["start_cap_mib"] * MIB / total)
        torch.cuda.set_per_process_memory_fraction(start_fraction)
        record["start_fraction"] = round(start_fraction, 5)
        record["device_total_mib"] = round(total / MIB, 1)
    write_cap(args.cap_file, record)

    import transformers
    from transformers.cli.serve import Serve

    record["transformers"] = transformers.__version__
    original = transformers.ContinuousBatchingConfig

    def capped_config(**kwargs: Any) -> Any:
        # Serve builds its config from the CLI flags alone; the engine's cap is calibrate's B.
        kwargs.setdefault("max_requests_per_batch", args.batch_size)
        return original(**kwargs)

    transformers.ContinuousBatchingConfig = capped_config  # type: ignore[misc,assignment]
    threading.Thread(target=tighten, args=(args, cuda, record), daemon=True).start()
    Serve(
        force_model=args.model,
        continuous_batching=True,
        device=device,
        host=args.host,
        port=args.port,
        cb_num_blocks=record["num_blocks"],
        cb_max_batch_tokens=record["max_batch_tokens"],
        cb_use_cuda_graph=False if cuda else None,
        log_level="info",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
