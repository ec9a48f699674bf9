"""A chat or completions request as the mock validates it, the way vLLM would: its fields checked,
its prompts counted, and the refusal (``RequestRejected``) a request that is not valid gets.

Refusals follow vLLM's OpenAI server: ``{"object": "error", "message", "type", "param",
"code"}``; with ``strict_422`` a validation error is FastAPI's ``{"detail": [...]}``; a prompt
over llama.cpp's slot (``slot_context``) gets llama.cpp's own ``{"error": {...}}``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from calibrate.mock import text
from calibrate.mock.settings import MockSettings

Kind = Literal["chat", "completion"]
Json = dict[str, Any]
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_TOKENS_REPLY = 2


class RequestRejected(Exception):
    """The request is refused before it is admitted; carries the HTTP status and body."""

    def __init__(self, status: int, body: Json) -> None:
        super().__init__(str(body))
        self.status = status
        self.body = body


@dataclass(frozen=True)
class GenerateRequest:
    """A validated chat or completions request."""

    kind: Kind
    model: str
    prompts: tuple[str, ...]
    prompt_tokens: tuple[int, ...]
    max_tokens: int | None
    stream: bool
    include_usage: bool
    min_tokens: int = 0
    ignore_eos: bool = False
    engine_error: str = ""  # answered with LMDeploy's finish_reason "error" (error_style)
    cache_prompt: bool = True  # llama.cpp's field: false, the prompt is not looked up in its cache

    def cap(self, prompt_tokens: int, max_model_len: int) -> int | None:
        """The most tokens an answer may have: max_tokens, or the context left when EOS is off."""
        if self.max_tokens is None and self.ignore_eos:
            return max(1, max_model_len - prompt_tokens)
        return self.max_tokens


def error_body(message: str, err_type: str, code: int) -> Json:
    """vLLM's error JSON."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}


def _invalid(settings: MockSettings, message: str, param: str) -> RequestRejected:
    if settings.strict_422:
        detail = {"type": "value_error", "loc": ["body", param], "msg": message, "input": None}
        return RequestRejected(422, {"detail": [detail]})
    return RequestRejected(400, error_body(message, "BadRequestError", 400))


def _content_text(content: object, settings: MockSettings) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if all(isinstance(p.get("text"), str) for p in parts):
            return "\n".join(str(p["text"]) for p in parts)
    raise _invalid(settings, "message content must be a string or a list of text parts", "messages")


def _optional_int(body: Json, key: str, settings: MockSettings) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _invalid(settings, f"{key} must be a positive integer, got {value!r}", key)
    return value


def parse_request(kind: Kind, body: object, settings: MockSettings) -> GenerateRequest:
    """Validate a request body the way vLLM would; raise RequestRejected if it is not valid."""
    if not isinstance(body, dict):
        raise _invalid(settings, "the request body must be a JSON object", "body")
    model = body.get("model", settings.models[0])
    if not isinstance(model, str):
        raise _invalid(settings, "model must be a string", "model")
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _invalid(settings, f"{key} must be a number, got {value!r}", key)
    if body.get("n") not in (None, 1):
        raise _invalid(settings, "the mock only supports n = 1", "n")
    stream = body.get("stream", False)
    options = body.get("stream_options") or {}
    if not isinstance(stream, bool) or not isinstance(options, dict):
        raise _invalid(settings, "stream must be a boolean, stream_options an object", "stream")
    _refuse_streaming(body, stream, settings)
    max_tokens = _optional_int(body, "max_tokens", settings)
    if kind == "chat":
        max_tokens = max_tokens or _optional_int(body, "max_completion_tokens", settings)
        prompts, counts = _chat_prompt(body.get("messages"), settings)
    else:
        prompts, counts = _completion_prompts(body.get("prompt"), settings)
    if model not in settings.models and settings.any_model:
        model = settings.models[0]  # llama.cpp's habit: any name is answered by what is loaded
    elif model not in settings.models:
        status = settings.unknown_model_status
        err_type = "NotFoundError" if status == 404 else "BadRequestError"
        raise RequestRejected(
            status, error_body(f"The model `{model}` does not exist.", err_type, status)
        )
    min_tokens, ignore_eos = _forcing(body, max_tokens, settings)
    longest = max(counts) + (max_tokens or 0)
    engine_error = ""
    if longest > settings.max_model_len and settings.error_style == "lmdeploy":
        engine_error = "ResponseType.INPUT_LENGTH_ERROR"  # LMDeploy: the session cannot hold it
    elif longest > settings.max_model_len:
        message = (
            f"This model's maximum context length is {settings.max_model_len} tokens. However, "
            f"you requested {longest} tokens ({max(counts)} in the messages, {max_tokens or 0} "
            "in the completion). Please reduce the length of the messages or completion."
        )
        raise RequestRejected(400, error_body(message, "BadRequestError", 400))
    include_usage = bool(options.get("include_usage")) if stream else True
    max_tokens = _slot_room(max(counts), max_tokens, settings)
    return GenerateRequest(
        kind,
        model,
        prompts,
        counts,
        max_tokens,
        stream,
        include_usage,
        min_tokens,
        ignore_eos,
        engine_error,
        body.get("cache_prompt") is not False,
    )


def llamacpp_context_error(prompt_tokens: int, n_ctx: int) -> Json:
    """llama.cpp's refusal of a prompt its slot cannot hold, as llama-server sends it: the
    OpenAI envelope ``{"error": {...}}`` with the counts beside the message
    (ggml-org/llama.cpp tools/server/server-context.cpp, ``send_error`` with
    ERROR_TYPE_EXCEED_CONTEXT_SIZE; server-task.cpp ``server_task_result_error::to_json``;
    server-common.cpp ``format_error_response``)."""
    message = (
        f"request ({prompt_tokens} tokens) exceeds the available context size ({n_ctx} tokens), "
        "try increasing it"
    )
    error = {"code": 400, "message": message, "type": "exceed_context_size_error"}
    return {"error": error | {"n_prompt_tokens": prompt_tokens, "n_ctx": n_ctx}}


def _slot_room(prompt_tokens: int, max_tokens: int | None, settings: MockSettings) -> int | None:
    """llama.cpp's slot: a prompt that fills it is refused (its own body, HTTP 400); an answer
    stops where it is full."""
    if not settings.slot_context:
        return max_tokens
    room = settings.slot_context - prompt_tokens
    if room < 1:
        raise RequestRejected(400, llamacpp_context_error(prompt_tokens, settings.slot_context))
    return room if max_tokens is None else min(max_tokens, room)


def _refuse_streaming(body: Json, stream: bool, settings: MockSettings) -> None:
    """A server (or a proxy in front of it) that cannot stream, or does not know the
    ``stream_options`` field: HTTP 400 (422 with ``strict_422``) before anything is admitted."""
    if settings.refuse_stream and stream:
        raise _invalid(settings, "streaming is not supported by this server", "stream")
    if settings.refuse_stream_options and "stream_options" in body:
        message = "Unrecognized request argument supplied: stream_options"
        raise _invalid(settings, message, "stream_options")


def _forcing(body: Json, max_tokens: int | None, settings: MockSettings) -> tuple[int, bool]:
    """vLLM's extra sampling fields that force an answer's length: min_tokens, ignore_eos."""
    min_tokens = body.get("min_tokens") or 0
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
        raise _invalid(
            settings, f"min_tokens must be an integer ≥ 0, got {min_tokens!r}", "min_tokens"
        )
    if max_tokens is not None and min_tokens > max_tokens:
        message = (
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}."
        )
        raise _invalid(settings, message, "min_tokens")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise _invalid(settings, f"ignore_eos must be a boolean, got {ignore_eos!r}", "ignore_eos")
    return min_tokens, ignore_eos


def _chat_prompt(
    messages: object, settings: MockSettings
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if not isinstance(messages, list) or not messages:
        raise _invalid(settings, "messages must be a non-empty list", "messages")
    contents: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _invalid(settings, "each message must be an object with a role", "messages")
        contents.append(_content_text(message.get("content"), settings))
    prompt = "\n".join(contents)
    if settings.chat_template:  # what the answer is derived from, as an engine's template does
        prompt = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
    tokens = sum(text.count_tokens(c) + CHAT_TOKENS_PER_MESSAGE for c in contents)
    return (prompt,), (tokens + CHAT_TOKENS_REPLY,)


def _completion_prompts(
    prompt: object, settings: MockSettings
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt or not all(isinstance(p, str) for p in prompt):
        raise _invalid(settings, "prompt must be a string or a non-empty list of strings", "prompt")
    return tuple(prompt), tuple(max(1, text.count_tokens(p)) for p in prompt)


_LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def lone_surrogate(raw: bytes, body: object) -> str | None:
    """Why a parsed body is not valid Unicode text (a ``\\ud800`` escape alone), else None."""
    if not _LONE_SURROGATE_ESCAPE.search(raw):  # the common case: no escape, no check
        return None
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return "the request body holds a lone surrogate (\\ud800…): not valid Unicode"
    return None
