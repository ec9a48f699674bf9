"""How many tokens one request may hold on the server, as the server says it.

llama.cpp splits its ``--ctx-size`` over ``--parallel`` slots: ``GET /props`` reports the
per-slot context (``default_generation_settings.n_ctx``); a forced answer that runs into it is
cut short with finish_reason ``length``. vLLM (and the mock) report ``max_model_len`` in
``GET /v1/models``. Asked when an answer was cut short (``waves.Sender``) and by the ladder's
context axis for the longest input to step to: one reader, so both agree.
"""

from __future__ import annotations

from typing import Any

from calibrate import json_text
from calibrate.engines import engine
from calibrate.errors import RequestError
from calibrate.http.client import OpenAIClient
from calibrate.http.models import ContextLimit
from calibrate.http.responses import MAX_MODEL_LEN, in_range

LLAMACPP_HINT = engine("llamacpp").context_hint  # /props: the per-slot context
MAX_MODEL_LEN_HINT = engine("vllm").context_hint  # /v1/models: max_model_len


def _int(value: Any) -> int | None:
    """A context or slot count the server said, in range (10**330 tokens is no context)."""
    return in_range(value, 1, MAX_MODEL_LEN)


def props_context(props: Any) -> int | None:
    """The per-slot context in a llama.cpp ``/props`` body: ``default_generation_settings
    .n_ctx``, else a top-level ``n_ctx`` shared by ``total_slots``."""
    if not isinstance(props, dict):
        return None
    settings = props.get("default_generation_settings")
    if isinstance(settings, dict) and (n_ctx := _int(settings.get("n_ctx"))):
        return n_ctx
    total, slots = _int(props.get("n_ctx")), _int(props.get("total_slots")) or 1
    return total // slots if total else None


def read_context(client: OpenAIClient, model: str) -> ContextLimit | None:
    """The server's context for one request; None when it says nothing we can read."""
    try:
        per_slot = props_context(json_text.loads(client.get_text("/props")))
    except (RequestError, ValueError):
        per_slot = None
    if per_slot is not None:
        return ContextLimit(per_slot, "per-slot context", LLAMACPP_HINT, "GET /props")
    try:
        models = client.models(keep=model)  # among the first listed even behind 300,000 others
    except RequestError:
        return None
    found = [m.max_model_len for m in models if m.id == model and m.max_model_len]
    if not found:
        return None
    return ContextLimit(found[0], "context (max_model_len)", MAX_MODEL_LEN_HINT, "GET /v1/models")


def props_model_path(client: OpenAIClient) -> str:
    """The weights a llama.cpp loaded, as its ``GET /props`` says (``model_path``): what vLLM's
    ``/v1/models`` root says for it ("" when the server has no /props or says none)."""
    try:
        props = json_text.loads(client.get_text("/props"))
    except (RequestError, ValueError):
        return ""
    path = props.get("model_path") if isinstance(props, dict) else None
    return path if isinstance(path, str) else ""
