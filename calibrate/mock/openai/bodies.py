"""The JSON bodies the mock answers with, as vLLM's OpenAI server writes them: a whole answer
(``full_response``, its ``envelope`` and ``usage``), the model list, and the info pages of
llama.cpp (``props``) and SGLang (``sglang_server_info``). A streamed answer's chunks are
``mock.openai.stream``; a refusal's body, ``mock.openai.request``.
"""

from __future__ import annotations

from calibrate.mock.answer import Generation
from calibrate.mock.openai.request import GenerateRequest, Json
from calibrate.mock.settings import MockSettings


def usage(req: GenerateRequest, gens: list[Generation]) -> Json:
    """The OpenAI usage object for a whole request."""
    prompt = sum(req.prompt_tokens)
    completion = sum(g.completion_tokens for g in gens)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def envelope(
    req: GenerateRequest, rid: str, created: int, settings: MockSettings, chunk: bool
) -> Json:
    """The fields every response and chunk shares."""
    obj = "chat.completion" if req.kind == "chat" else "text_completion"
    return {
        "id": rid,
        "object": obj + ".chunk" if chunk and req.kind == "chat" else obj,
        "created": created,
        "model": req.model,
        "system_fingerprint": settings.fingerprint,
    }


def full_response(
    req: GenerateRequest, gens: list[Generation], rid: str, created: int, settings: MockSettings
) -> Json:
    """A non-streaming chat.completion or text_completion body."""
    choices: list[Json] = []
    for i, gen in enumerate(gens):
        choice: Json = {"index": i, "logprobs": None, "finish_reason": gen.finish_reason}
        if req.kind == "chat":
            choice["message"] = {"role": "assistant", "content": gen.text}
        else:
            choice["text"] = gen.text
        choice["stop_reason"] = None
        choices.append(choice)
    body = envelope(req, rid, created, settings, chunk=False) | {"choices": choices}
    if not settings.no_usage:
        body["usage"] = usage(req, gens)
    return body


def models_list(settings: MockSettings, created: int) -> Json:
    """The GET /v1/models body, as vLLM writes it."""
    data = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "calibrate-mock",
            "root": f"/models/{name}",
            "parent": None,
            "max_model_len": settings.max_model_len,
        }
        for name in settings.models
    ]
    return {"object": "list", "data": data}


def props(settings: MockSettings) -> Json:
    """llama.cpp's GET /props body (only served with expose_props)."""
    return {
        "total_slots": settings.slots or 1,
        "model_path": f"/models/{settings.models[0]}",
        "default_generation_settings": {
            "n_ctx": settings.slot_context or settings.max_model_len,
            "model": settings.models[0],
        },
        "build_info": "calibrate-mock",
    }


def sglang_server_info(settings: MockSettings) -> Json:
    """SGLang's GET /get_server_info: its launch arguments, max_running_requests null unless
    it was started with --max-running-requests."""
    return {
        "model_path": f"/models/{settings.models[0]}",
        "max_running_requests": settings.max_running_requests or None,
        "max_total_num_tokens": settings.kv_capacity_tokens or None,
        "version": "calibrate-mock",
    }
