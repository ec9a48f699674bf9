"""Incident bundles (SPEC §5.4): everything needed to understand one failed request.

Written to ``runs/<id>/incidents/<tier>-<round>-<n>.json``. Headers are redacted here, once:
any Authorization, cookie or key-looking header value never reaches disk.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from calibrate.errors import ErrorInfo
from calibrate.records import utc_now_iso
from calibrate.store import RunDir

_SECRET_HEADER = re.compile(r"authorization|api[-_]?key|token|cookie|secret", re.IGNORECASE)


def redact_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers safe to write: secret-bearing values replaced by ``[REDACTED]``."""
    return {k: ("[REDACTED]" if _SECRET_HEADER.search(k) else v) for k, v in headers.items()}


def incident_name(tier: int | str, round_no: int | str | None, n: int) -> str:
    return f"{tier}-{round_no if round_no is not None else 0}-{n}.json"


@dataclass(frozen=True)
class Incident:
    """One failed request with its context; optional parts are None when not known."""

    stage: str
    batch_size: int | None
    concurrency: int | None
    round: int | None
    request_body: dict[str, Any] | None
    request_headers: Mapping[str, str]
    error: ErrorInfo
    exception_type: str | None = None
    traceback: str | None = None
    server_pid: int | None = None
    server_exit_code: int | None = None
    server_signal: str | None = None  # "SIGKILL" when a signal ended the managed server
    vram: dict[str, Any] | None = None
    log_tail: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    ts: str = field(default_factory=utc_now_iso)

    def to_json(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "stage": self.stage,
            "batch_size": self.batch_size,
            "concurrency": self.concurrency,
            "round": self.round,
            "request": {"body": self.request_body, "headers": redact_headers(self.request_headers)},
            "error": {
                "kind": self.error.kind,
                "message": self.error.message,
                "status": self.error.status,
                "body": self.error.body,
                "exception_type": self.exception_type,
                "traceback": self.traceback,
            },
            "server": {
                "pid": self.server_pid,
                "exit_code": self.server_exit_code,
                "signal": self.server_signal,
                "log_tail": self.log_tail,
            },
            "vram": self.vram,
            **self.extra,
        }


def format_traceback(exc: BaseException | None) -> str | None:
    if exc is None or exc.__traceback__ is None:
        return None
    return "".join(traceback.format_exception(exc))


def write_incident(run: RunDir, name: str, incident: Incident) -> Path:
    """Write one bundle under ``incidents/`` atomically and return its path."""
    return run.write_json(f"incidents/{name}", incident.to_json())
