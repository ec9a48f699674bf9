"""The http models (SPEC §4): what is sent (sampling), what came back (Completion, Usage), whether
it is complete, and what the server says about itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from calibrate.http.request_times import RequestTimes
from calibrate.http.stream_timing import StreamTiming
from calibrate.redact import one_line


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
    # a whole (not streamed) answer's JSON as it came: batch's Batch API output keeps it
    body: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

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
    source: str = ""  # where the server said it: "GET /props" | "GET /v1/models"


def _no_context() -> ContextLimit | None:
    return None


ERROR_TEXT_CHARS = 200  # of an answer that is an error report, the most a message quotes


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
    if choice.finish_reason == "error":  # LMDeploy: HTTP 200, the engine's failure as the text
        said = " ".join(choice.text.split())[:ERROR_TEXT_CHARS]
        return f"the server reported an error (finish_reason 'error'): {said or 'no text'}"
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
        """``a, b, c`` — and how many more, when the list was cut (each id on this one line)."""
        text = ", ".join(one_line(i) for i in self.model_ids)
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


def chat_request(
    model: str,
    prompt: str,
    params: SamplingParams,
    *,
    stream: bool = False,
    stream_options: bool = True,
) -> dict[str, Any]:
    """A chat completion's body. ``stream_options`` (usage in the stream) goes with ``stream``
    unless turned off: some proxies refuse the field (``stages.stream_probe``)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        **params.to_json(),
        "stream": stream,
    }
    if stream and stream_options:
        body["stream_options"] = {"include_usage": True}
    return body


def completions_request(
    model: str,
    prompts: Sequence[str],
    params: SamplingParams,
    *,
    stream: bool = False,
    stream_options: bool = True,
) -> dict[str, Any]:
    """A completions body: one prompt, or a prompt list (one request, many answers)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompts[0] if len(prompts) == 1 else list(prompts),
        **params.to_json(),
        "stream": stream,
    }
    if stream and stream_options:
        body["stream_options"] = {"include_usage": True}
    return body
