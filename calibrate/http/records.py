"""Typed records and their disk form (SPEC §4): request records, ledger lines, server identity."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from calibrate.errors import ErrorInfo
from calibrate.http.request_times import NO_TIMES, RequestTimes
from calibrate.http.stream_timing import StreamTiming


def utc_now_iso() -> str:
    """``2026-11-29T16:41:29.123Z`` — the timestamp format of every record."""
    now = dt.datetime.now(dt.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


@dataclass(frozen=True)
class SamplingParams:
    """Every sampling parameter is sent explicitly, so server defaults cannot override them."""

    temperature: float
    max_tokens: int
    top_p: float
    seed: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "top_p": self.top_p,
        }
        if self.seed is not None:
            out["seed"] = self.seed
        return out


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int | None
    completion_tokens: int | None
    total_tokens: int | None

    @property
    def complete(self) -> bool:
        return self.prompt_tokens is not None and self.completion_tokens is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }

    @classmethod
    def from_json(cls, data: Any) -> Usage | None:
        if not isinstance(data, dict):
            return None

        def num(key: str) -> int | None:
            value = data.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        return cls(num("prompt_tokens"), num("completion_tokens"), num("total_tokens"))


@dataclass(frozen=True)
class Choice:
    index: int
    text: str
    finish_reason: str | None


@dataclass(frozen=True)
class Completion:
    """One answered request: one choice per prompt (chat and single prompts have one)."""

    choices: tuple[Choice, ...]
    usage: Usage | None
    served_model: str | None
    system_fingerprint: str | None
    elapsed_s: float
    ttft_s: float | None = None
    stream: StreamTiming | None = None  # a streamed answer's chunks and gaps (SPEC §5.13)
    times: RequestTimes | None = None  # sent, first token, finished: stamped by the client

    @property
    def text(self) -> str:
        return self.choices[0].text if self.choices else ""

    @property
    def finish_reason(self) -> str | None:
        return self.choices[0].finish_reason if self.choices else None


@dataclass(frozen=True)
class ContextLimit:
    """The most tokens (prompt + answer) one request may hold on the server, and where that
    was read: llama.cpp's per-slot context (``/props``), or ``max_model_len``."""

    tokens: int
    what: str  # "per-slot context" | "context (max_model_len)"
    hint: str  # what to change, e.g. "llama.cpp: raise --ctx-size or lower --parallel"


def _no_context() -> ContextLimit | None:
    return None


def incomplete_reason(
    choice: Choice,
    max_tokens: int | None = None,
    *,
    forced_tokens: int | None = None,
    completion_tokens: int | None = None,
    prompt_tokens: int | None = None,
    context: Callable[[], ContextLimit | None] = _no_context,
) -> str | None:
    """Why an answer is not complete (SPEC §5.5 ``incomplete``), or None when it is.

    A request that forced its answer to ``forced_tokens`` (SPEC §5.11) ends with ``length`` by
    design: at exactly that length it is complete; cut anywhere else it is not — and when the
    prompt plus the forced answer do not fit the server's context (``context()``, asked only
    for such a cut), that is named with the numbers.
    """
    if choice.finish_reason == "length" and forced_tokens is not None:
        if completion_tokens == forced_tokens and choice.text.strip():
            return None
        return _cut_short(forced_tokens, completion_tokens, prompt_tokens, context())
    if choice.finish_reason == "length":
        return _cut_at_length(max_tokens, completion_tokens)
    if choice.finish_reason != "stop":
        return f"finish_reason is {choice.finish_reason!r}, not 'stop'"
    if not choice.text.strip():
        return "the answer is empty"
    return None


def _cut_at_length(max_tokens: int | None, got: int | None) -> str:
    """finish_reason ``length``: max_tokens is blamed only when the answer reached it."""
    if max_tokens is not None and got is not None and got >= max_tokens:
        return f"cut off at max_tokens={max_tokens} (finish_reason length): raise max_tokens"
    if max_tokens is not None and got is not None:
        return (
            f"the server stopped the answer early: finish_reason length at {got} of "
            f"max_tokens={max_tokens} tokens; raising max_tokens will not help: check the "
            "server's context size and its log"
        )
    limit = f"max_tokens={max_tokens}" if max_tokens is not None else "max_tokens"
    return (
        f"cut off (finish_reason length; the server reported no completion_tokens): "
        f"{limit} or the server's context or memory stopped it"
    )


def _cut_short(forced: int, got: int | None, prompt: int | None, limit: ContextLimit | None) -> str:
    cut = f"cut off at {'an unknown number' if got is None else got} of {forced} forced tokens"
    if limit is not None and prompt is not None and prompt + forced > limit.tokens:
        return (
            f"{cut}: prompt {prompt} + {forced} exceeds the server's {limit.what} "
            f"{limit.tokens} ({limit.hint})"
        )
    said = f"{cut} (finish_reason length); the answer was forced to {forced} tokens"
    if limit is not None:
        return said  # it fits the context: something else cut it
    sized = f" ({prompt} tokens)" if prompt is not None else ""
    return f"{said}: the prompt{sized} plus the answer may exceed the server's context"


@dataclass(frozen=True)
class ModelInfo:
    id: str
    root: str | None = None
    max_model_len: int | None = None


@dataclass(frozen=True)
class ServerIdentity:
    """What the server says about itself (``GET /v1/models`` and the response fields)."""

    models: tuple[ModelInfo, ...] = ()
    served_model: str | None = None
    system_fingerprint: str | None = None
    more_models: int = 0  # listed by the server beyond ``models`` (kept to a few: the client)

    @property
    def model_ids(self) -> tuple[str, ...]:
        return tuple(m.id for m in self.models)

    @property
    def models_text(self) -> str:
        """``a, b, c`` — and how many more, when the list was cut."""
        text = ", ".join(self.model_ids)
        return f"{text} (and {self.more_models:,} more)" if self.more_models else text

    def to_json(self) -> dict[str, Any]:
        return {
            "models": [
                {"id": m.id, "root": m.root, "max_model_len": m.max_model_len} for m in self.models
            ],
            **({"more_models": self.more_models} if self.more_models else {}),
            "served_model": self.served_model,
            "system_fingerprint": self.system_fingerprint,
        }


@dataclass(frozen=True)
class RequestRecord:
    """One request, as written to ``records.jsonl`` (SPEC §4.1)."""

    run_id: str
    ts: str
    stage: str
    target: str
    prompt: str
    params: SamplingParams
    text: str | None
    finish_reason: str | None
    usage: Usage | None
    elapsed_s: float
    ttft_s: float | None
    served_model: str | None
    system_fingerprint: str | None
    batch_size: int = 1
    concurrency: int = 1
    round: int | None = None
    ok: bool = True
    error: ErrorInfo | None = None
    input_tokens_target: int | None = None  # the length a synthetic prompt was sized to
    canary: bool = False  # the fixed prompt riding along a workload's wave (SPEC §5.11)
    times: RequestTimes | None = None  # when it was sent, answered, finished (SPEC §4.1)

    def to_json(self) -> dict[str, Any]:
        out = self._base_json()
        out.update(self.times.to_json() if self.times is not None else NO_TIMES)
        if self.input_tokens_target is not None:
            out["input_tokens_target"] = self.input_tokens_target
        if self.canary:
            out["canary"] = True
        return out

    def _base_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "ts": self.ts,
            "stage": self.stage,
            "target": self.target,
            "prompt": self.prompt,
            "params": self.params.to_json(),
            "text": self.text,
            "finish_reason": self.finish_reason,
            "usage": self.usage.to_json() if self.usage else None,
            "elapsed_s": round(self.elapsed_s, 6),
            "ttft_s": round(self.ttft_s, 6) if self.ttft_s is not None else None,
            "served_model": self.served_model,
            "system_fingerprint": self.system_fingerprint,
            "batch_size": self.batch_size,
            "concurrency": self.concurrency,
            "round": self.round,
            "ok": self.ok,
            "error": self.error.to_json() if self.error else None,
        }


@dataclass(frozen=True)
class LedgerEntry:
    """One stage result in ``runs/ledger.jsonl`` (SPEC §4.2); the gates read these.

    ``identity`` (what the fingerprint hashes) lets a closed gate say which part changed;
    ``weights`` (model path, served root) guard against other weights behind the same name.
    """

    stage: str
    run_id: str
    target: str
    passed: bool
    summary: dict[str, Any] = field(default_factory=dict)
    forced: bool = False
    ts: str = field(default_factory=utc_now_iso)
    interrupted: bool = False
    identity: dict[str, Any] | None = None
    weights: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ts": self.ts,
            "stage": self.stage,
            "run_id": self.run_id,
            "target": self.target,
            "passed": self.passed,
            "interrupted": self.interrupted,
            "summary": self.summary,
        }
        if self.forced:
            out["forced"] = True
        if self.identity is not None:
            out["identity"] = self.identity
        if self.weights is not None:
            out["weights"] = self.weights
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LedgerEntry:
        """Raises ValueError when the line is not a ledger entry (the ledger skips it)."""
        stage, summary = data.get("stage"), data.get("summary", {})
        if not isinstance(stage, str) or not isinstance(summary, dict | None):
            raise ValueError("not a ledger entry (no 'stage', or 'summary' is not an object)")
        identity, weights = data.get("identity"), data.get("weights")
        return cls(
            stage=stage,
            run_id=str(data.get("run_id", "")),
            target=str(data.get("target", "")),
            passed=data.get("passed") is True,
            summary=dict(summary or {}),
            forced=data.get("forced") is True,
            ts=str(data.get("ts", "")),
            interrupted=data.get("interrupted") is True,
            identity=identity if isinstance(identity, dict) else None,
            weights=weights if isinstance(weights, dict) else None,
        )
