"""What the ``server`` commands do and say: start from a pinned script, stop, status.

The command prints these lines; the words and the exit code are decided here, next to the
process they describe.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from calibrate.config import Config
from calibrate.engines import redaction
from calibrate.engines.builders import health_path
from calibrate.gpu.nvml import gpu_snapshot
from calibrate.server import exit_status, launch_script, pids, process, readiness
from calibrate.server.exit_status import ExitStatus, ended_words, signal_of
from calibrate.server.lifecycle import Started, local_root
from calibrate.server.lifecycle import start as start_process
from calibrate.server.process import Liveness, ServerRecord
from calibrate.server.process.start_stop import StopResult

Level = Literal["say", "warn", "ok", "fail"]


def vram_used_mib() -> float | None:
    """The GPU memory in use before a start (None without NVML)."""
    return readiness.used_mib(gpu_snapshot())


def start_script(cfg: Config, script: Path, notify: Any) -> Started:
    """Start from a script ``pin`` wrote: its header names the kind, port and setting."""
    settings = launch_script.read_settings(script)
    port = settings.port or cfg.server.port
    kind = settings.kind or cfg.server.kind
    notify(f"starting: bash {script}  (kind {kind or 'unknown'}, port {port})")
    return start_process(
        cfg.runs_dir,
        ["bash", str(script)],
        kind=kind,
        port=port,
        health_path=health_path(kind),
        ready_timeout_s=cfg.server.ready_timeout_s,
        stop_timeout_s=cfg.server.stop_timeout_s,
        batch_size=settings.batch_size,
        concurrency=settings.concurrency,
        script=str(script),
        vram_used_mib_before=vram_used_mib(),
        api_key=cfg.api_key,
    )


def ready_line(started: Started, runs_dir: Path) -> str:
    record = started.record
    return (
        f"server ready on port {record.port} (PID {record.pid}, {started.ready_s:.1f} s); "
        f"log: {process.log_path(runs_dir)}"
    )


def ready_json(started: Started) -> dict[str, Any]:
    return {"ready": True, "ready_s": round(started.ready_s, 3), **started.record.to_json()}


def stop_outcome(result: StopResult | None) -> tuple[Level, str, int, dict[str, Any]]:
    """How a stop went: (level, line, exit code, --json); exit 1 only when the PID outlived
    SIGKILL."""
    if result is None:
        line = "calibrate manages no server here (no runs/server.json): nothing to stop"
        return "say", line, 0, {"stopped": False, "managed": False}
    payload = {
        "stopped": result.gone,
        "managed": True,
        "pid": result.pid,
        "was": result.was,
        "signal": result.signal_sent,
        "exit_code": result.exit_code,
        "ended_by": signal_of(result.exit_code),
    }
    if result.was == "stranger":
        line = (
            f"PID {result.pid} now belongs to another program "
            f"({pids.cmdline(result.pid)[:80]}): not signalled; stale pidfile removed"
        )
        return "warn", line, 0, payload
    if result.was == "gone":
        line = (
            f"the managed server (PID {result.pid}) had already ended "
            f"({ended_words(result.exit_code)}); pidfile removed"
        )
        return "say", line, 0, payload
    if not result.gone:
        return "fail", f"PID {result.pid} is still alive after SIGKILL", 1, payload
    code = f", {ended_words(result.exit_code)}" if result.exit_code is not None else ""
    line = (
        f"stopped PID {result.pid} ({result.signal_sent}, {result.elapsed_s:.1f} s{code}); PID gone"
    )
    return "ok", line, 0, payload


@dataclass(frozen=True)
class ServerStatus:
    """The managed server as ``server status`` sees it: alive, ready, how it ended."""

    record: ServerRecord
    state: Liveness
    ready: bool
    ended: ExitStatus | None

    def lines(self, runs_dir: Path) -> list[str]:
        record = self.record
        starting = " (still starting: not ready yet)" if record.phase == "starting" else ""
        if record.left_starting():
            starting = " (left starting by an interrupted start: calibrate server stop ends it)"
        shown = {
            "running": f"running{starting}",
            "gone": "exited",
            "stranger": "exited (PID reused by another program)",
        }
        if self.state == "gone" and self.ended is not None:
            shown["gone"] = f"{self.ended.describe()} at {self.ended.ended_at}"
        setting = ", ".join(
            f"{name} {value}"
            for name, value in (("batch", record.batch_size), ("concurrency", record.concurrency))
            if value is not None
        )
        setting = setting or "the command's own (no batch size or concurrency given)"
        return [
            f"server PID {record.pid}: {shown[self.state]}{', ready' if self.ready else ''}; "
            f"port {record.port}; started {record.started_at}",
            f"command: {' '.join(redaction.redact_argv(record.argv))}",
            f"setting: {setting}; log: {process.log_path(runs_dir)}",
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "managed": True,
            "state": self.state,
            "ready": self.ready,
            **self.record.to_json(),
            "exit": self.ended.to_json() if self.ended else None,
        }


def server_status(runs_dir: Path) -> ServerStatus | None:
    """The recorded server's liveness, readiness and exit; None: none. Ready: its start
    confirmed it (SPEC §6: a 1-token completion answered, not only /health) and it still
    answers; an engine still "starting" is never ready, whatever its /health says."""
    record = process.load(runs_dir)
    if record is None:
        return None
    state = process.liveness(record)
    ready = False
    if state == "running" and record.phase == "ready":
        ready, _ = readiness.probe(local_root(record.port), record.health_path)
    ended = exit_status.read(Path(record.status_file), record.pid) if record.status_file else None
    return ServerStatus(record, state, ready, ended)


def status_report(runs_dir: Path) -> tuple[list[str], dict[str, Any]]:
    """``server status``: its lines and its --json."""
    status = server_status(runs_dir)
    if status is None:
        return ["no managed server (start one: calibrate server start)"], {
            "managed": False,
            "state": "none",
        }
    return status.lines(runs_dir), status.to_json()
