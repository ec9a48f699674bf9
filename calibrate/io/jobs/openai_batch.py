"""The OpenAI Batch API's JSONL, as ``vllm run-batch`` reads and writes it too.

A request line is ``{"custom_id", "method": "POST", "url", "body"}``; calibrate sends the two
urls whose answers are text it can check, ``/v1/chat/completions`` and ``/v1/completions``, and
refuses the others by name (exit 2) — embeddings, scores, reranks and responses have no text to
check. Each body is sent as given; ``model`` is the batch's own when the body names none (a
body naming another is refused by the plan). A body that asks to stream is refused: the Batch
API answers whole bodies.

An output line is ``{"id", "custom_id", "response": {"status_code", "request_id", "body"},
"error"}``: an answer's whole JSON body with its status; ``error`` (``{"code", "message"}``) for
a request that failed without an HTTP error answer — refused, cut off, timed out — and for an
answer calibrate's checks failed (incomplete, not the JSON ``--expect json`` asked for), whose
``response`` is kept beside it. The journal keeps each result's ``response``
(``response_of``); ``output_line`` turns its last result per id into the output line.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from calibrate import json_text
from calibrate.errors import ErrorInfo, InputError
from calibrate.http.models import Completion

JobFormat = Literal["tasks", "openai_batch"]
FORMAT_NAMES: dict[JobFormat, str] = {
    "tasks": "{id, text} tasks",
    "openai_batch": "OpenAI Batch API requests (custom_id, method, url, body)",
}
MARK = "custom_id"  # a line that has it is a Batch API request line
PATHS = {"/v1/chat/completions": "/chat/completions", "/v1/completions": "/completions"}
NOT_SENT = (  # urls the Batch API or vllm run-batch take that have no text to check
    "/v1/embeddings",
    "/v1/responses",
    "/v1/moderations",
    "/v1/score",
    "/score",
    "/v1/rerank",
    "/rerank",
)
FIX = "Fix the request file and run again; nothing was done."


@dataclass(frozen=True)
class ApiRequest:
    """One request line's request: its url and body, sent as given, and the two in 64 bits
    (what the journal records as the item's ``input_fp``)."""

    url: str
    body: Mapping[str, Any]
    digest: int

    @property
    def path(self) -> str:
        """Where it goes under the base URL (which ends in /v1)."""
        return PATHS[self.url]

    @property
    def model(self) -> str | None:
        named = self.body.get("model")
        return named if isinstance(named, str) else None

    @property
    def max_tokens(self) -> int | None:
        """The answer's limit the body sets (None: the server's), for the length check."""
        for key in ("max_completion_tokens", "max_tokens"):
            value = self.body.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None

    def body_for(self, model: str) -> dict[str, Any]:
        """The body to send: as given, with ``model`` when it names none."""
        return dict(self.body) if "model" in self.body else {"model": model, **self.body}


@dataclass(frozen=True)
class RequestLine:
    """A request line read: its custom_id, the text it sends (for the length check and the
    ladder's pool), and its request."""

    custom_id: str
    text: str
    request: ApiRequest


def parse_request_line(obj: Mapping[str, Any], where: str, *, escaped: bool) -> RequestLine:
    """A request line's object (``escaped``: the line holds a ``\\u`` escape); InputError
    naming ``where`` (file and line) for anything calibrate would not send as it is."""
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise InputError(f"{where}: 'custom_id' must be a non-empty string, got {custom_id!r}", FIX)
    named = f"{where} (custom_id {custom_id!r})"
    method, url, body = obj.get("method"), obj.get("url"), obj.get("body")
    if method != "POST":
        raise InputError(f"{named}: 'method' must be \"POST\", got {method!r}", FIX)
    if url not in PATHS:
        sent = " and ".join(PATHS)
        why = "answers with no text to check" if url in NOT_SENT else "not an endpoint of the API"
        raise InputError(
            f"{named}: url {url!r} is not sent by calibrate batch ({why}); it sends {sent}",
            "Run those lines with another tool (e.g. vllm run-batch), or leave them out; "
            "nothing was done.",
        )
    if not isinstance(body, dict):
        raise InputError(f"{named}: 'body' must be an object", FIX)
    _check_body(body, url, named)
    text = _text_of(body, url)
    try:  # key order and spacing are no change of the request
        canonical = json.dumps([url, body], sort_keys=True, ensure_ascii=False)
    except RecursionError as exc:
        raise InputError(f"{named}: the body is nested too deeply", FIX) from exc
    data = canonical.encode("utf-8", "surrogatepass")
    if escaped:  # only an escape can smuggle in a lone surrogate, which cannot be sent
        try:
            canonical.encode("utf-8")
            custom_id.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InputError(f"{where}: a lone surrogate escape ({exc})", FIX) from exc
    digest = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")
    return RequestLine(custom_id, text, ApiRequest(url, body, digest))


def _check_body(body: Mapping[str, Any], url: str, named: str) -> None:
    model = body.get("model")
    if "model" in body and (not isinstance(model, str) or not model):
        raise InputError(f"{named}: body 'model' must be a non-empty string", FIX)
    if body.get("stream"):
        raise InputError(
            f"{named}: the body asks to stream; the Batch API answers whole bodies",
            'Drop "stream" from the bodies (calibrate batch reads whole answers); '
            "nothing was done.",
        )
    if url == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InputError(f"{named}: body 'messages' must be a non-empty list", FIX)
        if not all(isinstance(m, dict) for m in messages):
            raise InputError(f"{named}: each of body 'messages' must be an object", FIX)
    elif not isinstance(body.get("prompt"), str | list):
        raise InputError(f"{named}: body 'prompt' must be a string or a list", FIX)


def _text_of(body: Mapping[str, Any], url: str) -> str:
    """The text a body sends: its messages' text (chat) or its prompts (completions)."""
    if url != "/v1/chat/completions":
        prompt = body["prompt"]
        return prompt if isinstance(prompt, str) else "\n".join(p for p in prompt if type(p) is str)
    parts: list[str] = []
    for message in body["messages"]:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
    return "\n".join(parts)


def response_of(completion: Completion | None, error: ErrorInfo | None) -> dict[str, Any] | None:
    """What the journal keeps of one attempt's answer: its status, an id and its whole body —
    or None when no answer came (refused, cut, timed out)."""
    if completion is not None and completion.body is not None:
        body = completion.body
        said = body.get("id")
        request_id = said if isinstance(said, str) and said else _new_request_id()
        return {"status_code": 200, "request_id": request_id, "body": dict(body)}
    if error is None or error.status is None:
        return None
    return {
        "status_code": error.status,
        "request_id": _new_request_id(),
        "body": _error_body(error),
    }


def _new_request_id() -> str:
    return f"calibrate-{uuid.uuid4().hex}"


def _error_body(error: ErrorInfo) -> dict[str, Any]:
    """An HTTP error answer's JSON body, or one that says what it said."""
    try:
        body = json_text.loads(error.body) if error.body else None
    except ValueError:
        body = None
    if isinstance(body, dict):
        return body
    return {"error": {"message": error.message, "type": error.kind, "code": error.status}}


def output_line(record: Mapping[str, Any]) -> dict[str, Any]:
    """A journal's result line (or export's ``not_run`` line) as a Batch API output line."""
    response = record.get("response")
    if not isinstance(response, dict):
        response = None
    error: dict[str, Any] | None = None
    found = record.get("error")
    if record.get("ok") is not True and isinstance(found, dict):
        status = response.get("status_code") if response else None
        if not (isinstance(status, int) and status >= 400):  # an HTTP error: its response says
            error = {"code": str(found.get("kind")), "message": str(found.get("message", ""))}
    custom_id = record.get("id")
    return {"id": _line_id(record), "custom_id": custom_id, "response": response, "error": error}


def _line_id(record: Mapping[str, Any]) -> str:
    """The output line's own id, the same at every export of the same result."""
    response = record.get("response")
    request_id = response.get("request_id") if isinstance(response, dict) else None
    key = [record.get("id"), request_id, record.get("made"), record.get("attempts")]
    digest = hashlib.blake2b(json.dumps(key).encode("utf-8"), digest_size=12).hexdigest()
    return f"batch_req_{digest}"
