"""Request records as written to ``records.jsonl`` (SPEC §4.1), and the timestamp of every record."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from calibrate.errors import ErrorInfo
from calibrate.http.models import SamplingParams, Usage
from calibrate.http.request_times import NO_TIMES, RequestTimes


def utc_now_iso() -> str:
    """``2026-11-29T16:41:29.123Z`` — the timestamp format of every record."""
    now = dt.datetime.now(dt.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


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
