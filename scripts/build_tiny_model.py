#!/usr/bin/env python3
"""Build the tiny chat model that the engine tests serve with `transformers serve`.

No model hub is reachable from the project's machines, so the project makes its own model:

* a byte-level BPE tokenizer trained with `tokenizers` on a synthetic corpus drawn from a seeded
  RNG (special tokens <s> </s> <unk> <pad> and the role markers <|system|> <|user|> <|assistant|>),
  wrapped in PreTrainedTokenizerFast with a chat template;
* a 2-layer Llama (4 heads of HEAD_DIM, 2 KV heads, hidden 4 x HEAD_DIM, intermediate twice that,
  512 positions), seeded init,
  trained for a few hundred AdamW steps on chat-formatted Q/A pairs ("What is 2 plus 3?" ->
  "2 plus 3 is 5.") so that it ends its answers with </s> (finish_reason "stop" is reachable;
  a small max_tokens gives "length");
* generation_config with do_sample=True, temperature=1, so a server's temperature-0 path has to
  turn sampling off for real.

Everything is seeded, single-threaded and deterministic: two builds give bit-identical files.

The head size: 16 by default (tests/engine/model, served by transformers and, as a GGUF, by
llama.cpp; hidden 64). vLLM's CPU attention refuses it ("Unsupported CPU attention configuration:
head_dim=16"; it accepts 32-512), so vLLM serves a build with --head-dim 32 (hidden 128,
tests/engine/model-vllm). The training data and steps are the same.

Usage: python scripts/build_tiny_model.py [--head-dim N] [OUTPUT_DIR]   (default: 16, tests/engine/model)
Needs torch + transformers + tokenizers: run it with .venv-engine/bin/python
(scripts/engine.sh install; scripts/engine.sh build-model), or for --head-dim 32 with vLLM's venv
(scripts/engine_vllm.sh build-model).
"""

from __future__ import annotations

import os

# Before torch/tokenizers start their thread pools.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import argparse
import hashlib
import random
import sys
import time
from pathlib import Path

SEED = 20240601
VOCAB_SIZE = 512
STEPS = 400
BATCH = 32
LR = 3e-3

SPECIAL_TOKENS = ["<s>", "</s>", "<unk>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]

# One turn per message, each closed by </s>; the generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

NUM_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

# Fixed pairs so a few everyday prompts (and the SPEC's default fixed prompt) get a sensible answer.
FIXED_PAIRS = [
    ("Hello", "Hello! I am a tiny test model."),
    ("Hi", "Hello! I am a tiny test model."),
    ("Who are you?", "I am a tiny test model."),
    ("Say OK.", "OK."),
    ("Count to five.", "1 2 3 4 5."),
    ("What color is the sky?", "The sky is blue."),
    ("用一句话说明什么是定长数组。", "定长数组是长度固定、不能改变的数组。"),
]

# One long answer (about 200 tokens) so that tests can make the engine generate for a while:
# batching/timing checks and finish_reason "length" with a large-ish max_tokens.
LONG_QUESTION = "Count to 100."
LONG_ANSWER = " ".join(str(i) for i in range(1, 101)) + "."


def make_pairs(rng: random.Random, n: int) -> list[tuple[str, str]]:
    """Seeded synthetic Q/A pairs, mostly small-number arithmetic."""
    pairs: list[tuple[str, str]] = []
    for _ in range(n):
        kind = rng.random()
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        if kind < 0.55:
            pairs.append((f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."))
        elif kind < 0.75:
            hi, lo = max(a, b), min(a, b)
            pairs.append((f"What is {hi} minus {lo}?", f"{hi} minus {lo} is {hi - lo}."))
        elif kind < 0.83:
            pairs.append((f"Spell the number {a}.", f"{a} is spelled {NUM_WORDS[a]}."))
        elif kind < 0.87:
            pairs.append((LONG_QUESTION, LONG_ANSWER))
        else:
            pairs.append(rng.choice(FIXED_PAIRS))
    return pairs


def corpus_text(pairs: list[tuple[str, str]]) -> list[str]:
    return [f"<|user|>\n{q}</s>\n<|assistant|>\n{a}</s>\n" for q, a in pairs]


def build_tokenizer(rng: random.Random):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = corpus_text(make_pairs(rng, 4000)) + [q + " " + a for q, a in FIXED_PAIRS] * 20
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>"],
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def encode_example(tokenizer, question: str, answer: str) -> tuple[list[int], list[int]]:
    """Token ids of one chat exchange and labels that train only the assistant's answer + </s>."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer + "</s>", add_special_tokens=False)["input_ids"]
    ids = prompt_ids + answer_ids
    labels = [-100] * len(prompt_ids) + answer_ids
    return ids, labels


def train(tokenizer, rng: random.Random, head_dim: int = 16):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=4 * head_dim,
        intermediate_size=8 * head_dim,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / STEPS)
    )
    pad = tokenizer.pad_token_id
    loss_value = float("nan")
    for step in range(STEPS):
        batch = [encode_example(tokenizer, q, a) for q, a in make_pairs(rng, BATCH)]
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((BATCH, width), pad, dtype=torch.long)
        labels = torch.full((BATCH, width), -100, dtype=torch.long)
        mask = torch.zeros((BATCH, width), dtype=torch.long)
        for i, (ids, lab) in enumerate(batch):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            labels[i, : len(lab)] = torch.tensor(lab)
            mask[i, : len(ids)] = 1
        out = model(input_ids=input_ids, attention_mask=mask, labels=labels)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_value = out.loss.item()
        if step % 100 == 0 or step == STEPS - 1:
            print(f"step {step:4d} loss {loss_value:.4f}", file=sys.stderr)
    model.eval()
    return model, loss_value


def greedy_answer(model, tokenizer, question: str, max_new_tokens: int = 32) -> str:
    import torch

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **ids,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
    return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("output_dir", nargs="?", default="tests/engine/model")
    parser.add_argument(
        "--head-dim", type=int, default=16, help="attention head size (vLLM's CPU build: 32-512)"
    )
    args = parser.parse_args(argv)

    import torch
    from transformers import GenerationConfig

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    t0 = time.monotonic()
    rng = random.Random(SEED)

    tokenizer = build_tokenizer(rng)
    model, loss = train(tokenizer, rng, args.head_dim)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
    )

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    for path in out.iterdir():
        if path.is_file():
            path.chmod(0o644)  # safetensors writes 0600; keep the fixture's modes uniform

    print(
        f"built {out} in {time.monotonic() - t0:.1f}s (final loss {loss:.4f}, "
        f"{sum(p.numel() for p in model.parameters())} parameters, vocab {len(tokenizer)})"
    )
    for path in sorted(out.iterdir()):
        if path.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            print(f"  {path.name:28s} {path.stat().st_size:9d} B  sha256 {digest}")
    for question in ("What is 2 plus 3?", "What is 7 minus 4?", "Hello", LONG_QUESTION):
        print(f"  greedy: {question!r} -> {greedy_answer(model, tokenizer, question, 320)!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
