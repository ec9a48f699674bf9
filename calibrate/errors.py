"""The one error tree. Library code raises these; only ``calibrate.cli`` catches them.

    CalibrateError                 exit 1 unless a subclass says otherwise
    ├── UsageError                 exit 2  bad flag, config or input; nothing sent, nothing written
    │   ├── ConfigError                     unreadable config, unknown key, wrong type
    │   └── InputError                      malformed tasks file, bad jq program, bad path
    ├── GateClosed                 exit 3  an earlier stage has not passed for this target
    ├── ServerUnreachable          exit 4  no server at the URL, or it never became ready
    │   └── ServerDied                      a managed server's process exited (its exit code)
    ├── StageFailed                exit 1  the stage ran and failed its check
    │   └── StepFailed                      one rollback step's check failed (its error kind)
    ├── RequestError               exit 1  one request failed; carries the SPEC §5.5 kind
    ├── WorkerDied                 exit 1  a load worker process (--workers) ended mid-run
    └── Interrupted                exit 130 Ctrl-C / SIGTERM; completed work is on disk

Every message is one or two lines: what happened, then what to do next.
"""

from __future__ import annotations

import enum
import errno
import traceback
from dataclasses import dataclass
from typing import Literal


class ExitCode(enum.IntEnum):
    """The exit-code contract shared by every command (SPEC §2)."""

    OK = 0
    FAILED = 1
    USAGE = 2
    GATE_CLOSED = 3
    UNREACHABLE = 4
    INTERRUPTED = 130


ErrorKind = Literal[
    "connect",
    "timeout",
    "reset",
    "oom",
    "overloaded",
    "http_4xx",
    "http_5xx",
    "invalid_response",
    "incomplete",
    "server_died",
    "format",
    "internal",
]

TRANSIENT_KINDS: frozenset[str] = frozenset(
    {"connect", "reset", "timeout", "overloaded", "http_5xx"}
)


class CalibrateError(Exception):
    """Base of every error calibrate reports to a user."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        """The one- or two-line text shown to the user."""
        if self.hint:
            return f"error: {self.message}\n{self.hint}"
        return f"error: {self.message}"


class UsageError(CalibrateError):
    exit_code = ExitCode.USAGE


class ConfigError(UsageError):
    pass


class InputError(UsageError):
    pass


class GateClosed(CalibrateError):
    exit_code = ExitCode.GATE_CLOSED


class ServerUnreachable(CalibrateError):
    exit_code = ExitCode.UNREACHABLE


class ServerDied(ServerUnreachable):
    """The managed server's process exited; ``server_exit_code`` is its status when known."""

    def __init__(
        self, message: str, hint: str | None = None, *, server_exit_code: int | None
    ) -> None:
        super().__init__(message, hint)
        self.server_exit_code = server_exit_code


class StageFailed(CalibrateError):
    exit_code = ExitCode.FAILED


class WorkerDied(CalibrateError):
    """A load worker process (``--workers N``) ended or failed in the middle of a run: the run
    lacks its share, so it is not measured (never a hang, never a traceback)."""

    exit_code = ExitCode.FAILED


class Interrupted(CalibrateError):
    exit_code = ExitCode.INTERRUPTED


@dataclass(frozen=True)
class ErrorInfo:
    """The disk form of a failed request (SPEC §4.1 ``error``)."""

    kind: ErrorKind
    message: str
    status: int | None = None
    retry_after_s: float | None = None
    body: str | None = None

    @property
    def transient(self) -> bool:
        return self.kind in TRANSIENT_KINDS

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "message": self.message, "status": self.status}


class RequestError(CalibrateError):
    """One request failed; ``info.kind`` is one of SPEC §5.5."""

    def __init__(self, info: ErrorInfo, exc_type: str | None = None) -> None:
        super().__init__(info.message)
        self.info = info
        self.exc_type = exc_type

    @property
    def kind(self) -> ErrorKind:
        return self.info.kind


class StepFailed(StageFailed):
    """A rollback step's check failed; ``kind`` names it for the incident bundle."""

    def __init__(self, message: str, kind: ErrorKind, code: int = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.code = code


# A write that failed for want of room (or of a working disk): the path was right, the result
# could not be kept. Any other errno of a write (permissions, a folder, a path gone) is the path's.
OUT_OF_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def os_error_text(exc: OSError) -> str:
    """``runs/x/plot.png: No space left on device``: the file first, when the error names one."""
    what = exc.strerror or str(exc)
    return f"{exc.filename}: {what}" if exc.filename is not None else what


class Unwritten(CalibrateError):
    """A command's result could not be written (``unwritten``): exit 1 or 2 by the cause."""

    def __init__(self, message: str, hint: str, exit_code: ExitCode) -> None:
        super().__init__(message, hint)
        self.exit_code = exit_code


def unwritten(exc: OSError, kept: str) -> Unwritten:
    """The error a command ends with when writing its result failed (``kept``: what is on disk).

    One exit code per cause, whatever the command: a full disk (quota, file size, I/O error)
    is exit 1 — the command did its work and its result was lost; a path that cannot be written
    (permissions, a folder, gone) is exit 2, the usage error every command reports up front."""
    message = f"cannot write {os_error_text(exc)}; {kept}"
    if exc.errno in OUT_OF_ROOM:
        hint = "Free space there (or write elsewhere), then run it again."
        return Unwritten(message, hint, ExitCode.FAILED)
    hint = "Fix the path (permissions, a folder in its way), then run it again."
    return Unwritten(message, hint, ExitCode.USAGE)


def format_traceback(exc: BaseException | None) -> str | None:
    """The whole traceback of ``exc`` as text (kept in records and incidents), or None."""
    if exc is None or exc.__traceback__ is None:
        return None
    return "".join(traceback.format_exception(exc))
