"""A request as the load engine sends it: one HTTP body carrying one prompt (chat) or several
(a completions prompt list), built from a wave of prompts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from calibrate.config import LadderMode
from calibrate.http.client import OpenAIClient
from calibrate.http.models import SamplingParams
from calibrate.load.items import ItemRole

CHAT_PATH = "/chat/completions"
COMPLETIONS_PATH = "/completions"


@dataclass(frozen=True)
class Request:
    """One HTTP request carrying one prompt (chat) or several (a completions prompt list)."""

    path: str
    body: dict[str, Any]
    prompts: tuple[str, ...]
    first_index: int
    role: ItemRole = "fixed"
    input_tokens_target: tuple[int | None, ...] = ()  # per prompt, when the workload sized it
    forced_tokens: int | None = None  # the answer length the body forces (SPEC §5.11)

    def target(self, n: int) -> int | None:
        return self.input_tokens_target[n] if n < len(self.input_tokens_target) else None


def build_requests(
    client: OpenAIClient,
    model: str,
    params: SamplingParams,
    waves: Sequence[Sequence[str]],
    mode: LadderMode,
    *,
    stream: bool = False,
    stream_options: bool = True,
    first_index: int = 1,
    role: ItemRole = "fixed",
    targets: Sequence[int | None] = (),
    extra: Mapping[str, Any] | None = None,
    forced_tokens: int | None = None,
) -> list[Request]:
    """wave: one chat request per prompt; prompt-list: one completions request per wave.

    ``extra`` fields are added to every body (a forced answer length); ``targets`` are the
    input lengths the workload sized each prompt to, in prompt order; ``stream_options`` off
    leaves that field out of streamed bodies (a server that refuses it).
    """
    out: list[Request] = []
    index = first_index
    fields = dict(extra or {})

    def sized(count: int) -> tuple[int | None, ...]:
        start = index - first_index
        return tuple(targets[start : start + count]) if targets else ()

    for prompts in waves:
        if mode == "prompt-list":
            body = client.completions_body(
                model, prompts, params, stream=stream, stream_options=stream_options
            )
            body = {**body, **fields}
            out.append(
                Request(
                    COMPLETIONS_PATH,
                    body,
                    tuple(prompts),
                    index,
                    role,
                    sized(len(prompts)),
                    forced_tokens,
                )
            )
            index += len(prompts)
            continue
        for prompt in prompts:
            body = client.chat_body(
                model, prompt, params, stream=stream, stream_options=stream_options
            )
            body = {**body, **fields}
            out.append(Request(CHAT_PATH, body, (prompt,), index, role, sized(1), forced_tokens))
            index += 1
    return out
