"""Deterministic text: what the mock "generates" for a prompt, and how it counts tokens.

A token is one CJK character or one run of other non-space characters (the mock's tokenizer:
prompts are counted the same way for ``usage.prompt_tokens``); whitespace belongs to the
token after it, and trailing whitespace to the last token. So ``count_tokens(text)`` always
equals ``len(pieces(text))`` and joining the pieces gives the text back.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re

_CJK = "\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef"
_TOKEN = re.compile(rf"\s*(?:[{_CJK}]|[^\s{_CJK}]+)")
_HAS_CJK = re.compile(rf"[{_CJK}]")

MIN_WORDS = 12
MAX_WORDS = 48

PREAMBLE = "Sure, here is the summary:\n"
ZH_PREAMBLE = "好的，以下是总结：\n"

_WORDS = [
    "array",
    "fixed",
    "length",
    "memory",
    "element",
    "index",
    "buffer",
    "value",
    "type",
    "size",
    "static",
    "compile",
    "time",
    "contiguous",
    "block",
    "store",
    "read",
    "write",
    "bound",
    "layout",
    "stack",
    "heap",
    "vector",
    "slot",
    "offset",
    "pointer",
    "model",
    "server",
    "batch",
    "token",
    "request",
    "stream",
    "cache",
    "kernel",
    "layer",
    "weight",
    "result",
    "answer",
    "simple",
    "clear",
    "short",
    "direct",
    "example",
    "means",
    "holds",
    "keeps",
    "uses",
    "each",
    "every",
    "same",
    "known",
    "given",
]
_ZH_WORDS = [
    "定长",
    "数组",
    "是",
    "一种",
    "长度",
    "固定",
    "的",
    "数据",
    "结构",
    "元素",
    "类型",
    "相同",
    "内存",
    "连续",
    "存放",
    "下标",
    "访问",
    "编译",
    "时",
    "确定",
    "大小",
    "不能",
    "改变",
    "适合",
    "存储",
    "已知",
    "数量",
    "值",
    "高效",
    "简单",
    "常用",
]


def pieces(text: str) -> list[str]:
    """Split text into tokens that join back into it exactly."""
    found = _TOKEN.findall(text)
    if not found:
        return [text] if text else []
    rest = text[sum(len(p) for p in found) :]
    if rest:
        found[-1] += rest
    return found


MEMO_CHARS = 4096  # texts up to this long are remembered (4,096 of them: ~20 MiB at most)


def count_tokens(text: str) -> int:
    """How many tokens the mock says ``text`` has."""
    return _count_memo(text) if len(text) <= MEMO_CHARS else _count(text)


def _count(text: str) -> int:
    return len(_TOKEN.findall(text))


_count_memo = functools.lru_cache(maxsize=4096)(_count)


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("\x00".join(str(p) for p in parts).encode("utf-8")).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _plain(rng: random.Random, n_tokens: int, chinese: bool) -> str:
    if chinese:
        chars = "".join(rng.choice(_ZH_WORDS) for _ in range(n_tokens))
        return chars[: n_tokens - 1] + "。"
    words = [rng.choice(_WORDS) for _ in range(n_tokens)]
    words[0] = words[0].capitalize()
    return " ".join(words) + "."


def natural_text(prompt: str, text_seed: int) -> str:
    """The full answer to ``prompt`` before any max_tokens cut; same inputs, same text. Made
    once for a prompt asked again (every wave of the fixed prompt), unless the prompt is long
    (a context ladder's): the memo would hold it."""
    if len(prompt) <= MEMO_CHARS:
        return _natural_memo(prompt, text_seed)
    return _natural_text(prompt, text_seed)


def _natural_text(prompt: str, text_seed: int) -> str:
    rng = _rng("text", text_seed, prompt)
    chinese = bool(_HAS_CJK.search(prompt))
    n_tokens = rng.randint(MIN_WORDS, MAX_WORDS)
    prefix = ""
    if "[preamble]" in prompt:
        prefix = PREAMBLE
    elif "[zh-preamble]" in prompt:
        prefix = ZH_PREAMBLE
    if "[json]" in prompt or "[badjson]" in prompt:
        summary = _plain(rng, rng.randint(6, 12), chinese)
        body = json.dumps({"summary": summary, "n": rng.randint(1, 9)}, ensure_ascii=False)
        if "[badjson]" in prompt:
            body = body[:-1] + ",}"  # a trailing comma: looks like JSON, json.loads rejects it
        return f"{prefix}```json\n{body}\n```"
    return prefix + _plain(rng, n_tokens, chinese)


_natural_memo = functools.lru_cache(maxsize=4096)(_natural_text)


def perturb(text: str, prompt: str, in_flight: int) -> str:
    """Change one word of ``text``, chosen by (prompt, in-flight count): batch nondeterminism."""
    parts = pieces(text)
    candidates = [i for i, p in enumerate(parts) if p.strip().isalpha()]
    if not candidates:
        return text + " again"
    rng = _rng("perturb", prompt, in_flight)
    index = candidates[rng.randrange(len(candidates))]
    old = parts[index]
    core = old.strip()
    if _HAS_CJK.search(core):
        pool = sorted(set("".join(_ZH_WORDS)) - {core})
    else:
        pool = [w for w in _WORDS if w != core.lower()]
    new_core = rng.choice(pool)
    lead = old[: len(old) - len(old.lstrip())]
    tail = old[len(lead) + len(core) :]
    parts[index] = lead + new_core + tail
    return "".join(parts)


def diverge(text: str, prompt: str, in_flight: int, at: int, seed: int) -> str:
    """``text`` kept up to token ``at`` (1-based), then seeded words of its own from there on,
    as many tokens as before: one variant per (seed, prompt, in-flight count). The token at
    ``at`` always differs from the original one; past the end, one word is added there."""
    parts = pieces(text)
    rng = _rng("diverge", seed, prompt, in_flight)
    chinese = bool(_HAS_CJK.search(prompt))
    keep = parts[: at - 1]
    old = [p.strip() for p in parts[at - 1 :]] or [""]
    new: list[str] = []
    for n, core in enumerate(old):
        if chinese:
            pool = sorted(set("".join(_ZH_WORDS)) - {core.rstrip("。")})
        else:
            pool = [w for w in _WORDS if w != core.rstrip(".").lower()] if n == 0 else _WORDS
        word = rng.choice(pool)
        new.append(word if chinese else " " + word)
    end = "。" if chinese else "."
    return ("".join(keep) + "".join(new)).rstrip() + end


def cut(text: str, max_tokens: int) -> str:
    """The first ``max_tokens`` tokens of ``text``."""
    return "".join(pieces(text)[:max_tokens])


def extend(text: str, prompt: str, text_seed: int, n_tokens: int) -> str:
    """``text`` continued with seeded words to exactly ``n_tokens`` tokens (an answer past EOS)."""
    have = count_tokens(text)
    if have >= n_tokens:
        return cut(text, n_tokens)
    rng = _rng("more", text_seed, prompt)
    chinese = bool(_HAS_CJK.search(prompt))
    parts = [text]
    while have < n_tokens:
        if chinese:
            word = rng.choice(_ZH_WORDS)
            parts.append(word)
            have += len(word)
        else:
            parts.append(" " + rng.choice(_WORDS))
            have += 1
    return cut("".join(parts), n_tokens)
