"""The OpenAI response formats, parsed and validated in one place: a completion, or SSE chunks.

Every shape a server may get wrong is checked here (choices a non-empty list of objects,
``message``/``delta`` an object, ``content``/``text`` a string or null, ``finish_reason`` a string
or null, ``index`` and usage counts integers in range: never negative, never so large that a rate
computed from them overflows); anything else is ``invalid_response`` with a short message saying
what was wrong — never a TypeError further down. Texts are made valid Unicode here too: a lone
surrogate (JSON ``"\\ud800"``) becomes U+FFFD, so every writer can encode it.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from calibrate.errors import RequestError
from calibrate.http.error_kinds import error_in_answer, invalid
from calibrate.http.models import Choice, Completion, ModelInfo, Usage
from calibrate.http.request_times import RequestTimes

_SURROGATE = re.compile("[\ud800-\udfff]")
_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")
MAX_TOKENS = 10**9  # no answer counts more tokens than this; a bigger count is a broken server
MAX_INDEX = 2**31 - 1  # a choice's index


def valid_text(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD (JSON pairs are already joined)."""
    return text if text.isascii() or not _SURROGATE.search(text) else _SURROGATE.sub("\ufffd", text)


_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
}


def _describe(value: object) -> str:
    """What a JSON value is, in words: ``null``, ``an integer``, ``a list``…"""
    return "null" if value is None else _NAMES.get(type(value), type(value).__name__)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _wrong(what: str, value: object, expected: str) -> RequestError:
    return invalid(f"{what} is {_describe(value)}, not {expected}")


def in_range(value: object, low: int, high: int) -> int | None:
    """``value`` when it is an integer in ``[low, high]``, else None (a server's number that
    would overflow a float, or is negative, or is a boolean, is no count)."""
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return value
    return None


def parse_usage(value: object) -> Usage | None:
    """The usage object (absent or null → None); a count that is not an integer in
    [0, MAX_TOKENS] is invalid (10**330 would overflow every rate computed from it)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _wrong("'usage'", value, "an object")
    counts: list[int | None] = []  # each read once, not checked again by Usage.from_json
    for name in _USAGE_FIELDS:
        count = value.get(name)
        if count is not None:
            if type(count) is not int and not _is_int(count):  # JSON's own ints: no call
                raise _wrong(f"usage.{name}", count, "an integer")
            if not 0 <= count <= MAX_TOKENS:
                digits = len(str(count))
                shown = str(count) if digits <= 24 else f"an integer of {digits} digits"
                raise invalid(
                    f"usage.{name} is {shown}, not a token count in [0, {MAX_TOKENS:.0e}]"
                )
        counts.append(count)
    return Usage(*counts)


class Delta(NamedTuple):
    """One choice's part of an answer (a whole choice, or a stream chunk's piece of one)."""

    choice: int  # the choice's index (``index`` would shadow tuple.index)
    text: str
    finish_reason: str | None


def parse_choice(raw: object, position: int, *, chat: bool, delta: bool) -> Delta:
    """One choice of a completion (``delta``: of a stream chunk), its shape checked."""
    # Written for the streaming hot path: one call per chunk, plain type checks inline.
    if type(raw) is not dict:
        raise _wrong(f"choices[{position}]", raw, "an object")
    index = raw.get("index", position)
    if type(index) is not int:
        raise _wrong(f"choices[{position}].index", index, "an integer")
    if not 0 <= index <= MAX_INDEX:
        raise invalid(f"choices[{position}].index is out of range (negative or huge)")
    if chat:
        key = "delta" if delta else "message"
        holder = raw.get(key)
        if holder is None and delta:
            holder = {}  # a finish chunk may carry no delta at all
        if type(holder) is not dict:
            raise _wrong(f"choices[{position}].{key}", holder, "an object")
        text, where = holder.get("content"), f"{key}.content"
    else:
        text, where = raw.get("text"), "text"
    if text is None:
        text = ""
    elif type(text) is not str:
        raise _wrong(f"choices[{position}].{where}", text, "a string or null")
    elif not text.isascii():
        text = valid_text(text)
    finish = raw.get("finish_reason")
    if finish is not None:
        if type(finish) is not str:
            raise _wrong(f"choices[{position}].finish_reason", finish, "a string or null")
        finish = valid_text(finish)
    return Delta(index, text, finish)


def _choices(payload: dict[str, Any], *, allow_empty: bool) -> list[Any]:
    raw = payload.get("choices")
    if raw is None and allow_empty:
        return []
    if not isinstance(raw, list):
        what = "no 'choices'" if raw is None else f"'choices' that is {_describe(raw)}"
        raise invalid(f"the response has {what}, not a list")
    if not raw and not allow_empty:
        raise invalid("the response has an empty 'choices' list")
    return raw


def _optional_name(value: object) -> str | None:
    return value if type(value) is str and value.isascii() else _name(value)


def _name(value: object) -> str | None:
    return valid_text(value) if isinstance(value, str) else None


def parse_completion(
    payload: dict[str, Any],
    elapsed_s: float,
    ttft_s: float | None,
    *,
    chat: bool,
    times: RequestTimes | None = None,
) -> Completion:
    """A non-streamed chat or completions answer (``times``: its stamps, when known)."""
    if "error" in payload and not payload.get("choices"):
        raise RequestError(error_in_answer(payload))
    raw = _choices(payload, allow_empty=False)
    if len(raw) == 1:  # a chat answer, a single prompt's: nothing to sort
        deltas: list[Delta] = [parse_choice(raw[0], 0, chat=chat, delta=False)]
    else:
        deltas = sorted(
            (parse_choice(c, i, chat=chat, delta=False) for i, c in enumerate(raw)),
            key=lambda d: d.choice,
        )
    return Completion(
        choices=tuple([Choice(d.choice, d.text, d.finish_reason) for d in deltas]),
        usage=parse_usage(payload.get("usage")),
        served_model=_optional_name(payload.get("model")),
        system_fingerprint=_optional_name(payload.get("system_fingerprint")),
        elapsed_s=elapsed_s,
        ttft_s=ttft_s,
        times=times,
        body=payload,
    )


class StreamChunk(NamedTuple):
    """One ``data:`` object of a stream: its choices' pieces, and what else it carried."""

    choices: list[Delta]
    usage: Usage | None
    served_model: str | None
    system_fingerprint: str | None


def parse_chunk(payload: object, *, chat: bool) -> StreamChunk:
    """One streamed chunk (``choices`` may be empty: the usage chunk has none)."""
    if type(payload) is not dict:
        raise _wrong("a stream chunk", payload, "a JSON object")
    if "error" in payload:
        raise RequestError(error_in_answer(payload))
    raw = _choices(payload, allow_empty=True)
    return StreamChunk(
        choices=[parse_choice(c, i, chat=chat, delta=True) for i, c in enumerate(raw)],
        usage=parse_usage(payload.get("usage")),
        served_model=_optional_name(payload.get("model")),
        system_fingerprint=_optional_name(payload.get("system_fingerprint")),
    )


def plain_piece(payload: object, chat: bool) -> str | None:
    """The text of a stream chunk of the common shape, else None (``parse_chunk`` reads it).

    That shape: an object with no ``error``, no usage (or null), one choice at index 0 (or no
    index) with no finish_reason, its ``delta`` an object (chat) and its text a string or null;
    ``model`` and ``system_fingerprint`` absent, null or ASCII strings. Of such a chunk,
    ``parse_chunk`` would say exactly this text as choice 0's piece and nothing else — without
    the tuples it builds (this runs once per streamed event)."""
    if type(payload) is not dict or "error" in payload or payload.get("usage") is not None:
        return None
    choices = payload.get("choices")
    if type(choices) is not list or len(choices) != 1:
        return None
    choice = choices[0]
    if type(choice) is not dict or choice.get("finish_reason") is not None:
        return None
    index = choice.get("index", 0)
    if type(index) is not int or index != 0:
        return None
    if chat:
        delta = choice.get("delta")
        if type(delta) is not dict:
            return None
        text = delta.get("content")
    else:
        text = choice.get("text")
    if text is None:
        text = ""
    elif type(text) is not str:
        return None
    elif not text.isascii():
        text = valid_text(text)
    model, fingerprint = payload.get("model"), payload.get("system_fingerprint")
    if model is not None and (type(model) is not str or not model.isascii()):
        return None
    if fingerprint is not None and (type(fingerprint) is not str or not fingerprint.isascii()):
        return None
    return text


MAX_MODELS_KEPT = 32  # of GET /v1/models, this many are kept (the rest counted)
MAX_ID_CHARS = 512  # of a model's id or root
MAX_MODEL_LEN = 2**31 - 1  # a context length past this is no length (ignored, as when absent)


def parse_model_list(
    payload: dict[str, Any], keep: str | None = None
) -> tuple[tuple[ModelInfo, ...], int]:
    """``GET /v1/models``'s answer: the first ``MAX_MODELS_KEPT`` models listed (``keep`` among
    them whenever it is listed at all), and how many more the server listed."""
    data = payload.get("data")
    if not isinstance(data, list):
        raise invalid("GET /models answered without a 'data' list")
    out: list[ModelInfo] = []
    more = 0
    kept = False  # ``keep`` is among ``out``
    for item in data:
        if not (isinstance(item, dict) and isinstance(item.get("id"), str)):
            continue
        name: str = item["id"]
        wanted = name == keep and not kept
        if len(out) >= MAX_MODELS_KEPT:
            more += 1
            if not wanted:
                continue
            out.pop()  # ``keep`` takes the last place
        kept = kept or wanted
        root = item.get("root")
        out.append(
            ModelInfo(
                id=valid_text(name if wanted else name[:MAX_ID_CHARS]),
                root=valid_text(root[:MAX_ID_CHARS]) if isinstance(root, str) else None,
                max_model_len=in_range(item.get("max_model_len"), 1, MAX_MODEL_LEN),
            )
        )
    return tuple(out), more
