#!/usr/bin/env python3
"""Write the tiny chat model of tests/engine/model as one GGUF file (F32) for llama.cpp.

The same weights and tokenizer as the safetensors fixture built by scripts/build_tiny_model.py,
converted the way llama.cpp's own convert_hf_to_gguf.py converts a Llama: tensor names mapped
to GGUF's, Q and K rows permuted from Hugging Face's rotate-half RoPE layout to llama.cpp's
interleaved one, the tied output head left out (llama.cpp reuses token_embd), and the byte-level
BPE tokenizer stored as tokenizer.ggml.model "gpt2" (tokens, token types, merges) with the
special ids, add_bos_token false (the chat template writes <s> itself) and the chat template.

Only the `gguf` package (and its numpy) is needed: safetensors and tokenizer.json are read by
hand. Nothing depends on the clock or the machine, so two builds are byte-identical.

Usage: python scripts/build_tiny_gguf.py [MODEL_DIR] [OUTPUT]
       (defaults: tests/engine/model tests/engine/model.gguf; scripts/engine_llamacpp.sh
       build-model runs it in .venv-gguf)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np

ARCH = "llama"
NAME = "calibrate-tiny-llama"

# Hugging Face tensor name (per layer: "model.layers.{i}.") -> GGUF tensor name ("blk.{i}.")
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file (F32 only: the fixture is float32)."""
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    base = 8 + header_len
    out: dict[str, np.ndarray] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] != "F32":
            raise SystemExit(f"{path}: tensor {name} is {meta['dtype']}, expected F32")
        start, end = meta["data_offsets"]
        array = np.frombuffer(data[base + start : base + end], dtype="<f4")
        out[name] = array.reshape(meta["shape"]).copy()
    return out


def permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotate-half Q/K rows -> llama.cpp's interleaved pairs (as convert_hf_to_gguf.py)."""
    rows = weights.shape[0]
    return (
        weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def gguf_tensors(config: dict[str, Any], hf: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    out: list[tuple[str, np.ndarray]] = [
        (GLOBAL_TENSORS["model.embed_tokens.weight"], hf["model.embed_tokens.weight"])
    ]
    for layer in range(config["num_hidden_layers"]):
        for hf_suffix, gguf_suffix in LAYER_TENSORS.items():
            tensor = hf[f"model.layers.{layer}.{hf_suffix}"]
            if hf_suffix == "self_attn.q_proj.weight":
                tensor = permute(tensor, n_head)
            elif hf_suffix == "self_attn.k_proj.weight":
                tensor = permute(tensor, n_kv)
            out.append((f"blk.{layer}.{gguf_suffix}", tensor))
    out.append((GLOBAL_TENSORS["model.norm.weight"], hf["model.norm.weight"]))
    used = {"model.embed_tokens.weight", "model.norm.weight"} | {
        f"model.layers.{i}.{s}" for i in range(config["num_hidden_layers"]) for s in LAYER_TENSORS
    }
    left = sorted(set(hf) - used)
    if left:
        raise SystemExit(f"unexpected tensors in the fixture (not converted): {left}")
    return [(name, np.ascontiguousarray(t, dtype=np.float32)) for name, t in out]


def vocab(tokenizer: dict[str, Any]) -> tuple[list[str], list[int], list[str]]:
    """Tokens in id order, their GGUF token types, and the merges as "a b" strings."""
    model = tokenizer["model"]
    if model.get("type") != "BPE":
        raise SystemExit(f"tokenizer model is {model.get('type')}, expected BPE")
    by_id = {index: token for token, index in model["vocab"].items()}
    special = {t["id"] for t in tokenizer["added_tokens"] if t.get("special")}
    for added in tokenizer["added_tokens"]:
        by_id[added["id"]] = added["content"]
    if sorted(by_id) != list(range(len(by_id))):
        raise SystemExit("token ids are not contiguous")
    tokens = [by_id[i] for i in range(len(by_id))]
    types = [
        int(gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL)
        for i in range(len(tokens))
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, types, merges


def write_gguf(model_dir: Path, output: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text("utf-8"))
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text("utf-8"))
    template = (model_dir / "chat_template.jinja").read_text("utf-8")
    tok_config = json.loads((model_dir / "tokenizer_config.json").read_text("utf-8"))
    tokens, types, merges = vocab(tokenizer)
    token_id = {t: i for i, t in enumerate(tokens)}
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    rope = config.get("rope_parameters") or {}

    tmp = output.with_name(output.name + ".tmp")
    writer = gguf.GGUFWriter(tmp, ARCH)
    writer.add_name(NAME)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(len(tokens))
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # ByteLevel(use_regex=True): GPT-2's split regex
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(token_id[tok_config["bos_token"]])
    writer.add_eos_token_id(token_id[tok_config["eos_token"]])
    writer.add_unk_token_id(token_id[tok_config["unk_token"]])
    writer.add_pad_token_id(token_id[tok_config["pad_token"]])
    writer.add_add_bos_token(False)  # the chat template starts with {{ bos_token }}
    writer.add_add_eos_token(False)
    writer.add_chat_template(template)
    for name, tensor in gguf_tensors(config, read_safetensors(model_dir / "model.safetensors")):
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.chmod(0o644)
    tmp.replace(output)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        allow_abbrev=False, description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("model_dir", nargs="?", default="tests/engine/model")
    parser.add_argument("output", nargs="?", default="tests/engine/model.gguf")
    args = parser.parse_args(argv)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(Path(args.model_dir), output)
    digest = hashlib.sha256(output.read_bytes()).hexdigest()[:16]
    print(f"built {output}: {output.stat().st_size} B, sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
