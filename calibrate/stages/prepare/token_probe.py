"""Sizing synthetic prompts against the server's own token count, and forcing answer lengths.

One probe request of about the target size is sent before the stage (``max_tokens`` 1) and its
``usage.prompt_tokens`` read back — no tokenizer dependency. When it is off by more than 5 % a
second probe, sized from the first, fixes the line through both points. The probe also carries
the fields that force an answer's length; an engine that refuses them (HTTP 4xx) is probed again
without them, and its answers are measured as they come ("output length not controlled").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from calibrate.config import LadderMode
from calibrate.engines import find
from calibrate.engines.args import ServerKind
from calibrate.engines.base import Forcing as Forcing  # workload_plan reads it here
from calibrate.errors import RequestError, StageFailed
from calibrate.http.client import OpenAIClient
from calibrate.http.models import SamplingParams
from calibrate.load.request import CHAT_PATH, COMPLETIONS_PATH
from calibrate.stages.prepare.synthetic import TokenModel, synthetic_prompt
from calibrate.stages.single import unreachable

FIRST_PROBE_WORDS = 64  # small enough for any server; enough words for a stable ratio
TOLERANCE = 0.05
PROBE_KEY = -1  # the probe's own marker: it shares no prefix with a measured request
NOT_CONTROLLED = "output length not controlled on this engine: answers are measured as they come"


def forcing_for(kind: ServerKind | None) -> Forcing:
    """What the engine honours: ``ignore_eos`` + ``min_tokens`` (vLLM, SGLang, the mock and
    unknown servers), ``ignore_eos`` with ``max_tokens`` only (llama.cpp, LMDeploy), or nothing
    (Ollama, TGI: the answer stops where the model stops): ``Engine.forcing``."""
    found = find(kind)
    return found.forcing if found is not None else "full"


def forcing_fields(forcing: Forcing, output_tokens: int) -> dict[str, Any]:
    """The body fields that make an answer exactly ``output_tokens`` long where honoured."""
    fields: dict[str, Any] = {"max_tokens": output_tokens}
    if forcing != "none":
        fields["ignore_eos"] = True
    if forcing == "full":
        fields["min_tokens"] = output_tokens
    return fields


@dataclass(frozen=True)
class Calibration:
    """What the probes found: the token line, the forcing the engine accepted, what was sent."""

    tokens: TokenModel
    forcing: Forcing
    probes: tuple[tuple[int, int], ...]  # (words, prompt_tokens) per probe

    def to_json(self) -> dict[str, Any]:
        return {
            **self.tokens.to_json(),
            "forcing": self.forcing,
            "probes": [{"words": w, "prompt_tokens": t} for w, t in self.probes],
        }


@dataclass(frozen=True)
class Prober:
    """Sends one probe of ``words`` words and returns the server's ``prompt_tokens``."""

    client: OpenAIClient
    model: str
    params: SamplingParams
    mode: LadderMode
    base_url: str
    seed: int

    def body(self, words: int, extra: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        prompt = synthetic_prompt(words, PROBE_KEY, seed=self.seed)
        params = replace(self.params, max_tokens=1)
        if self.mode == "prompt-list":
            body = self.client.completions_body(self.model, [prompt], params)
            return COMPLETIONS_PATH, {**body, **extra}
        return CHAT_PATH, {**self.client.chat_body(self.model, prompt, params), **extra}

    def prompt_tokens(self, words: int, extra: dict[str, Any]) -> int:
        path, body = self.body(words, extra)
        try:
            completion = self.client.post_completion(path, body)
        except RequestError as exc:
            if exc.kind == "connect":
                raise unreachable(exc.info, self.base_url) from exc
            raise
        tokens = completion.usage.prompt_tokens if completion.usage else None
        if not tokens:
            raise StageFailed(
                "the server did not report usage.prompt_tokens for the token probe: synthetic "
                "prompts cannot be sized without it",
                "Use --tasks FILE (real inputs need no sizing), or a server that reports usage.",
            )
        return tokens


def calibrate_tokens(
    send: Callable[[int, dict[str, Any]], int], target_tokens: int, forcing: Forcing
) -> Calibration:
    """Learn the server's tokens per word from a small probe first (a prompt many times the
    target — a tokenizer that splits words finely — must never be the first thing a capped
    server sees), then probe at the workload's size and fit a line through the two."""
    words = max(1, min(target_tokens, FIRST_PROBE_WORDS))
    extra = forcing_fields(forcing, 1) if forcing != "none" else {}
    try:
        tokens = send(words, extra)
    except RequestError as exc:
        if forcing == "none" or exc.kind != "http_4xx":
            raise _probe_failed(exc) from exc
        forcing, extra = "none", {}  # the engine refuses ignore_eos / min_tokens
        try:
            tokens = send(words, extra)
        except RequestError as again:
            raise _probe_failed(again) from again
    probes = [(words, tokens)]
    model = TokenModel(0.0, tokens / words)
    if abs(tokens - target_tokens) > TOLERANCE * target_tokens:
        words2 = model.words_for(target_tokens)
        if words2 != words:
            try:
                tokens2 = send(words2, extra)
            except RequestError as exc:
                raise _probe_failed(exc) from exc
            probes.append((words2, tokens2))
            slope = (tokens2 - tokens) / (words2 - words)
            if slope > 0:
                model = TokenModel(tokens - slope * words, slope)
    return Calibration(model, forcing, tuple(probes))


def _probe_failed(exc: RequestError) -> StageFailed:
    return StageFailed(
        f"the token probe (one request sized like the workload) failed: {exc.info.message}",
        "Check the server answers a prompt of that size (calibrate single), or lower "
        "--input-tokens.",
    )
