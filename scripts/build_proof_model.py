#!/usr/bin/env python3
"""Build the random-weight Llama that `make gpu-proof` serves: big enough to move VRAM, in seconds.

No hub, no training. The tokenizer is the project's own (copied from tests/engine/model, built by
scripts/build_tiny_model.py). The weights are seeded random, except for one deliberate shape that
makes every answer deterministic and *complete* (finish_reason "stop", which `calibrate single`
requires), whatever the batch:

* the residual stream starts as a random embedding E[t] (std 1, norm ~ sqrt(hidden));
* every layer is an ordinary random Llama layer (std 0.02), but its two writes back into the
  residual stream (o_proj, down_proj) are scaled down, so a layer adds a small random term;
* the LM head (untied) maps the direction of E[src] to the logit of dst for the chain
  "<generation prompt's last token> -> Count to five: 1 2 3 4 5. -> </s>" and nothing else.

So each forward pass does the full random-weight work (attention over the whole prompt, KV cache,
MLPs: the memory and the time are real), and the greedy answer to any chat prompt is the same
ten tokens and </s>, by a margin of about sqrt(hidden) logits over anything else.

Sizes (bf16):
  1b    hidden 2048, 22 layers, 32 heads / 4 KV heads of 64, MLP 5632 (TinyLlama-1.1B's shape):
        ~0.97e9 parameters, ~1.9 GB; KV per token = 22 x 2 x 4 x 64 x 2 B = 22,528 B (22 KiB)
  tiny  hidden 256, 2 layers, 4 heads / 2 KV heads of 64, MLP 512: ~1.1e6 parameters (the dry run)

Usage: python scripts/build_proof_model.py --size 1b|tiny OUTPUT_DIR [--device cuda|cpu|auto]
Needs torch + transformers (the GPU box's python3, or .venv-engine/bin/python).
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import itertools
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

SEED = 20251117
TOKENIZER_SOURCE = Path(__file__).resolve().parent.parent / "tests" / "engine" / "model"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
ANSWER = "Count to five: 1 2 3 4 5."
WRITE_SCALE = 0.05  # o_proj / down_proj std 0.02 x this: each layer adds a small random term
HEAD_GAIN = 1.0  # logit of the chained token ~ HEAD_GAIN x sqrt(hidden)

SIZES: dict[str, dict[str, int]] = {
    "1b": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "max_position_embeddings": 8192,
    },
    "tiny": {
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 4096,
    },
}


def kv_bytes_per_token(shape: dict[str, int], dtype_bytes: int = 2) -> int:
    """KV cache bytes per token: layers x (K and V) x KV heads x head_dim x bytes per value."""
    return (
        shape["num_hidden_layers"]
        * 2
        * shape["num_key_value_heads"]
        * shape["head_dim"]
        * dtype_bytes
    )


def answer_chain(tokenizer: Any) -> list[int]:
    """[last token of the generation prompt, the answer's tokens..., eos]: all distinct but eos."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True
    )
    last = tokenizer(prompt, add_special_tokens=False)["input_ids"][-1]
    answer = tokenizer(ANSWER, add_special_tokens=False)["input_ids"]
    chain = [last, *answer]
    if len(set(chain)) != len(chain) or tokenizer.eos_token_id in chain:
        raise SystemExit(f"the answer {ANSWER!r} repeats a token ({chain}): pick another")
    return [*chain, tokenizer.eos_token_id]


def build(size: str, out: Path, device: str) -> dict[str, Any]:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_SOURCE / name, out / name)
    tokenizer = AutoTokenizer.from_pretrained(out)
    chain = answer_chain(tokenizer)

    shape = SIZES[size]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.02,
        **shape,
    )
    torch.manual_seed(SEED)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.eval()
    gen = torch.Generator(device=device).manual_seed(SEED)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(WRITE_SCALE)
            layer.mlp.down_proj.weight.mul_(WRITE_SCALE)
        embed = model.model.embed_tokens.weight
        embed.copy_(torch.randn(embed.shape, generator=gen, device=device))
        head = model.lm_head.weight
        head.zero_()
        for src, dst in itertools.pairwise(chain):
            head[dst] += HEAD_GAIN * embed[src] / embed[src].norm()
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    check = greedy(model, tokenizer, "What is 2 plus 3?", len(chain) + 4)
    info = {
        "size": size,
        "seed": SEED,
        "parameters": params,
        "dtype": "bfloat16",
        "kv_bytes_per_token": kv_bytes_per_token(shape),
        "answer": ANSWER,
        "greedy_check": check,
        **shape,
    }
    (out / "proof_model.json").write_text(json.dumps(info, indent=2) + "\n", "utf-8")
    return info


def greedy(model: Any, tokenizer: Any, question: str, max_new_tokens: int) -> str:
    import torch

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt").to(model.device)
    with torch.no_grad():
        out = model.generate(**ids, do_sample=False, max_new_tokens=max_new_tokens)
    return str(tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), default="1b")
    parser.add_argument("--device", default="auto", help="where to initialise: cuda, cpu, auto")
    args = parser.parse_args(argv)

    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.monotonic()
    info = build(args.size, args.output_dir, device)
    print(
        f"built {args.output_dir} ({args.size}, {info['parameters'] / 1e9:.3f}e9 parameters, bf16, "
        f"KV {info['kv_bytes_per_token']} B/token) on {device} in {time.monotonic() - start:.1f} s"
    )
    print(f"  greedy answer: {info['greedy_check']!r}")
    if not info["greedy_check"].startswith(ANSWER):
        print(f"build_proof_model: error: the greedy answer is not {ANSWER!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
