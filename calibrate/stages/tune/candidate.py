"""One candidate's life: stop the managed server → start this one → ready → warm-up → measure →
stop → prove its PID gone and its VRAM released.

Only the server calibrate started (its own pidfile) is ever stopped; one runs at a time. A
start that fails (an OOM at load, a bad flag) or a server that dies mid-measurement is a
recorded result with its exit code, log tail and an incident bundle — tune moves on. Ctrl-C
stops the current server before it propagates.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from calibrate.engines.args import ServerKind
from calibrate.errors import (
    ErrorInfo,
    ErrorKind,
    RequestError,
    ServerDied,
    ServerUnreachable,
    StageFailed,
)
from calibrate.gpu.nvml import gpu_snapshot
from calibrate.io.store import RunDir
from calibrate.server import lifecycle as server
from calibrate.server import process, readiness
from calibrate.server.exit_status import ended_words, signal_of
from calibrate.server.process import start_lock
from calibrate.server.readiness import VramProbe, used_mib, wait_released
from calibrate.stages.context import StageContext
from calibrate.stages.measure.incidents import Incident, write_incident
from calibrate.stages.tune.grid import Candidate
from calibrate.stages.tune.measure import (
    MeasureSettings,
    Notify,
    candidate_run,
    measure_candidate,
)
from calibrate.stages.tune.result import CandidateResult, Measurement, MemoryProbe

TAIL_LINES = 20
RELEASE_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Stopped:
    """How the previous server ended: was it still running, its exit code, the VRAM proof."""

    pid: int | None = None
    was_running: bool = False
    exit_code: int | None = None
    release: str = "no server was running"


@dataclass(frozen=True)
class StartFailure:
    exit_code: int | None
    error: str
    log_tail: tuple[str, ...]


def _set_aside(folder: RunDir) -> None:
    """A folder left by a run killed mid-candidate is kept aside, not appended to: its records
    would count twice."""
    if not folder.path.exists():
        return
    n = 1
    while folder.path.with_name(f"{folder.path.name}.aborted-{n}").exists():
        n += 1
    folder.path.rename(folder.path.with_name(f"{folder.path.name}.aborted-{n}"))


def _why(message: str, tail: tuple[str, ...]) -> str:
    """The start failure in one line: what happened, and the log's last words on it."""
    first = message.split("; last lines", 1)[0]
    said = next((line.strip() for line in reversed(tail) if "error" in line.lower()), "")
    return f"{first}: {said}" if said else first


def _oom(lines: tuple[str, ...]) -> bool:
    return any("out of memory" in line.lower() for line in lines)


@dataclass
class Lifecycle:
    """Starts, measures and stops candidates of one tune, one server at a time."""

    ctx: StageContext
    kind: ServerKind
    settings: MeasureSettings
    notify: Notify
    probe: VramProbe = gpu_snapshot
    clock: Callable[[], float] = time.monotonic

    def stop_managed(self) -> Stopped:
        """Stop the server calibrate started (by its own pidfile), if any; prove it gone."""
        cfg = self.ctx.config
        record = process.load(cfg.runs_dir)
        if record is None:
            return Stopped()
        before_stop = self.probe()
        result = server.stop(cfg.runs_dir, cfg.server.stop_timeout_s)
        if result is None:
            return Stopped()
        if result.was == "running" and not result.gone:
            raise StageFailed(
                f"the managed server (PID {result.pid}) is still alive after SIGKILL",
                "Look at it (calibrate server status), then run calibrate tune again.",
            )
        if not readiness.wait_port_closed("127.0.0.1", cfg.server.port, 5.0):
            raise StageFailed(
                f"port {cfg.server.port} is still open after the server (PID {result.pid}) stopped",
                "Something else listens there: stop it, then run calibrate tune again.",
            )
        release = wait_released(
            self.probe,
            result.pid,
            record.vram_used_mib_before,
            before_stop,
            timeout_s=RELEASE_TIMEOUT_S,
        )
        return Stopped(result.pid, result.was == "running", result.exit_code, release.message)

    def _log_offset(self) -> int:
        path = process.log_path(self.ctx.config.runs_dir)
        return path.stat().st_size if path.is_file() else 0

    def _tail(self, offset: int) -> tuple[str, ...]:
        lines = process.log_tail(self.ctx.config.runs_dir, TAIL_LINES + 1, offset)
        return tuple(line for line in lines if not line.startswith("=== "))[-TAIL_LINES:]

    def start(self, candidate: Candidate) -> StartFailure | None:
        """Start the candidate and wait until ready; a failure is returned, not raised."""
        offset = self._log_offset()
        cap = candidate.cap
        try:
            server.start_engine(
                self.ctx.config,
                self.kind,
                cap,
                cap,
                notify=self.notify,
                vram_used_mib_before=used_mib(self.probe()),
                tuned=candidate.flags,
            )
        except ServerDied as exc:
            tail = self._tail(offset)
            return StartFailure(exc.server_exit_code, _why(exc.message, tail), tail)
        except ServerUnreachable as exc:  # not ready in time (stopped), or not startable at all
            tail = self._tail(offset)
            return StartFailure(None, _why(exc.message, tail), tail)
        return None

    def restart(self, candidate: Candidate) -> StartFailure | None:
        """Stop the server running, then start the candidate: the restart lock held across both
        (another process's start refuses tune, exit 2)."""
        with start_lock.refusing(self.ctx.config.runs_dir, f"candidate {candidate.id} not started"):
            self.stop_managed()
            return self.start(candidate)

    def warm_up(self) -> str:
        """One request before measuring ("" when it was answered, else why not)."""
        ctx = self.ctx
        try:
            ctx.client.chat(ctx.config.target.model, ctx.config.prompt.text, ctx.params)
        except RequestError as exc:
            return f"the warm-up request failed ({exc.kind}: {exc.message})"
        return ""

    def probe_memory(self, candidate: Candidate, fraction: str) -> MemoryProbe:
        """Start at ``fraction`` and serve one request: the memory step's one try."""
        failed = self.restart(candidate)
        if failed is not None:
            self.stop_managed()
            return MemoryProbe(
                fraction, False, False, failed.exit_code, failed.error, failed.log_tail
            )
        offset = self._log_offset()
        try:
            problem = self.warm_up()
        finally:
            self.stop_managed()
        tail = self._tail(offset) if problem else ()
        return MemoryProbe(fraction, True, not problem, None, problem, tail)

    def run(
        self, candidate: Candidate, rung: int, window: float, tune_run: RunDir, again: bool = False
    ) -> CandidateResult:
        """The whole life of one candidate (``again``: its second measurement, in a folder of
        its own); the server is stopped however it ends."""
        began = self.clock()
        folder = candidate_run(tune_run, candidate, rung, again)
        _set_aside(folder)
        offset = self._log_offset()
        failed = self.restart(candidate)
        if failed is not None:
            self.stop_managed()
            self._incident(folder, candidate, failed.error, failed.exit_code, failed.log_tail)
            return CandidateResult(
                candidate,
                rung,
                window,
                False,
                failed.exit_code,
                failed.error,
                failed.log_tail,
                elapsed_s=self.clock() - began,
            )
        measurement: Measurement | None = None
        problem = ""
        try:
            problem = self.warm_up()
            if not problem:
                measurement = measure_candidate(
                    replace(self.ctx, server_kind=self.kind),  # the candidate runs
                    self.settings,
                    candidate,
                    folder,
                    window=window,
                    notify=self.notify,
                )
        except ServerUnreachable as exc:  # nothing answered the first level: the server is gone
            problem = exc.message
        finally:
            stopped = self.stop_managed()
        crashed = stopped.pid is not None and not stopped.was_running
        tail = self._tail(offset) if (problem or crashed) else ()
        if crashed:
            why = (
                problem
                or f"the server ended while it was measured ({ended_words(stopped.exit_code)})"
            )
            self._incident(folder, candidate, why, stopped.exit_code, tail)
        return CandidateResult(
            candidate,
            rung,
            window,
            True,
            None,
            problem,
            tail,
            served=not problem,
            crashed=crashed,
            exit_code=stopped.exit_code if crashed else None,
            measurement=measurement,
            vram_release=stopped.release,
            elapsed_s=self.clock() - began,
        )

    def _incident(
        self,
        folder: RunDir,
        candidate: Candidate,
        message: str,
        exit_code: int | None,
        tail: tuple[str, ...],
    ) -> None:
        kind: ErrorKind = "server_died"
        if _oom(tail) or "out of memory" in message.lower():
            kind = "oom"
        snapshot = self.probe()
        incident = Incident(
            stage="tune",
            batch_size=candidate.cap,
            concurrency=None,
            round=None,
            request_body=None,
            request_headers={},
            error=ErrorInfo(kind, message),
            server_exit_code=exit_code,
            server_signal=signal_of(exit_code),
            vram=snapshot.to_json() if snapshot else None,
            log_tail=list(tail),
            extra={"candidate": candidate.to_json()},
        )
        write_incident(folder, "server.json", incident)
