"""How a batch talks back to its user (``BatchEnv``): every line it shows on the way — the plan,
the endpoints' check, --final, its progress (a ``ProgressSink``), --junit — goes through one;
``QuietEnv`` shows nothing but its warnings, in the log."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import TracebackType
from typing import Protocol

from calibrate.io.store import RunDir
from calibrate.stages.batch.endpoints import EndpointCheck
from calibrate.stages.batch.plan import BatchPlan
from calibrate.stages.batch.result import BatchProgress, BatchResult
from calibrate.stages.batch.summary import BatchVerdict
from calibrate.stages.export import ExportResult
from calibrate.stages.measure.format_check import ShapeCheck

log = logging.getLogger("calibrate")


class ProgressSink(Protocol):
    """Receives progress snapshots every ``every_s`` while the batch runs (a bar, a line…)."""

    every_s: float

    def update(self, p: BatchProgress) -> None: ...

    def __enter__(self) -> object: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class BatchEnv(Protocol):
    """How a batch tells its user what happens: every line it shows goes through one of these."""

    def warn(self, text: str) -> None: ...

    def on_plan(self, plan: BatchPlan, source: str) -> None:
        """The plan, before anything is sent; ``source``: where the concurrency came from."""

    def on_check(self, check: EndpointCheck) -> None:
        """Several endpoints: what the fixed prompt said on each."""

    def on_export(self, final: ExportResult) -> None:
        """--final was written."""

    def progress(self, to_run: int, endpoints: int) -> ProgressSink:
        """What receives the progress while the items run."""
        ...

    def write_junit(
        self,
        run: RunDir,
        target: str,
        result: BatchResult,
        checks: Sequence[ShapeCheck],
        verdict: BatchVerdict,
    ) -> None:
        """--junit, if asked for: written before the verdict is shown (an OSError is exit 1)."""


class QuietEnv:
    """A ``BatchEnv`` that shows nothing but its warnings, in the log."""

    every_s = 5.0  # also its own ``ProgressSink``

    def warn(self, text: str) -> None:
        log.warning("%s", text)

    def on_plan(self, plan: BatchPlan, source: str) -> None:
        return None

    def on_check(self, check: EndpointCheck) -> None:
        return None

    def on_export(self, final: ExportResult) -> None:
        return None

    def progress(self, to_run: int, endpoints: int) -> QuietEnv:
        return self

    def update(self, p: BatchProgress) -> None:
        return None

    def write_junit(
        self,
        run: RunDir,
        target: str,
        result: BatchResult,
        checks: Sequence[ShapeCheck],
        verdict: BatchVerdict,
    ) -> None:
        return None

    def __enter__(self) -> QuietEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
