"""Incident bundles (SPEC §5.4): everything needed to understand one failed request.

Written to ``runs/<id>/incidents/<tier>-<round>-<n>.json`` by the ladder and the sweep (one per
failed request, through ``IncidentRecorder``) and by rollback (one per failed step). Headers are
redacted here, once: any Authorization, cookie or key-looking header value never reaches disk.
The server's PID, liveness and log tail come from ``server.process``, the one place that knows
the managed server.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from calibrate import json_text
from calibrate.errors import ErrorInfo
from calibrate.gpu.nvml import GpuSnapshot, gpu_snapshot
from calibrate.gpu.vram import VramMonitor
from calibrate.gpu.vram.peaks import WindowPeak
from calibrate.io.atomic import pid_lives
from calibrate.io.bounded import TooLong, read_text
from calibrate.io.records import utc_now_iso
from calibrate.io.store import RunDir
from calibrate.load.items import ItemResult
from calibrate.server import exit_status, process
from calibrate.server.process import ServerRecord

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


def write_incident(run: RunDir, name: str, incident: Incident) -> Path:
    """Write one bundle under ``incidents/`` atomically and return its path."""
    return run.write_json(f"incidents/{name}", incident.to_json())


LOG_TAIL_LINES = 200


@dataclass(frozen=True)
class ServerProcess:
    """Which process serves the model, and how we know (``record``: calibrate manages it)."""

    pid: int | None
    found_by: str  # "--server-pid", "runs/server.pid", "nvml", "unknown"
    record: ServerRecord | None = None


def resolve_server(
    explicit_pid: int | None,
    runs_dir: Path,
    snapshot: GpuSnapshot | None,
    targets: Callable[[ServerRecord], bool] = lambda record: True,
) -> ServerProcess:
    """``--server-pid``, else the server calibrate manages when ``targets`` says it is the
    target's (a managed server beside the target: neither its log nor its death is the
    target's), else NVML's biggest GPU process."""
    if explicit_pid is not None:
        return ServerProcess(explicit_pid, "--server-pid")
    record = process.load(runs_dir)
    if record is not None and targets(record):
        return ServerProcess(record.pid, str(process.pid_path(runs_dir)), record)
    if snapshot is not None and snapshot.processes:
        pid, _ = max(snapshot.processes, key=lambda p: p[1])
        return ServerProcess(pid, "nvml")
    return ServerProcess(None, "unknown")


def alive(server: ServerProcess) -> bool | None:
    """Whether the server still runs; a managed one is checked by its start time (PID reuse)."""
    if server.record is not None:
        return process.liveness(server.record) == "running"
    return pid_lives(server.pid) if server.pid is not None else None


def first_error(folder: Path) -> str | None:
    """The error message of the earliest bundle in ``folder`` (the server's own words)."""
    try:
        bundles = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        error = json_text.loads(read_text(bundles[0]))["error"] if bundles else None
    except (OSError, ValueError, KeyError, TypeError, TooLong):
        return None
    return str(error["message"]) if isinstance(error, dict) and error.get("message") else None


class IncidentRecorder:
    """Writes ``incidents/<tier>-<round>-<n>.json``; one VRAM snapshot per failing round."""

    def __init__(
        self,
        run: RunDir,
        headers: Mapping[str, str],
        monitor: VramMonitor,
        *,
        runs_dir: Path,
        server_pid: int | None = None,
        devices: Sequence[str] | None = None,
        snapshot: Callable[[Sequence[str] | None], GpuSnapshot | None] = gpu_snapshot,
        targets: Callable[[ServerRecord], bool] = lambda record: True,
    ) -> None:
        self.run = run
        self.targets = targets  # whether the managed server's record is the target's
        self.headers = dict(headers)
        self.monitor = monitor
        self.runs_dir = runs_dir
        self.server_pid = server_pid
        self.devices = devices
        self.snapshot = snapshot
        self.written: list[Path] = []
        self._ended: dict[int, exit_status.ExitStatus | None] = {}

    def record(
        self,
        items: Sequence[ItemResult],
        *,
        batch_size: int,
        concurrency: int,
        round_no: int,
        label: str | None = None,
        peak: WindowPeak | None = None,
    ) -> list[Path]:
        """One bundle per failed item; ``label`` names the tier in the file (default: batch)."""
        failed = [i for i in items if i.error is not None]
        if not failed:
            return []
        snap = self.snapshot(self.devices)
        server = resolve_server(self.server_pid, self.runs_dir, snap, self.targets)
        vram = self._vram(snap, peak)
        running = alive(server)
        tail = None
        if server.record is not None:  # this start's output only
            tail = process.log_tail(self.runs_dir, LOG_TAIL_LINES, server.record.log_offset)
        death = self._death(server, running)
        ended = death[1] if death else None
        paths: list[Path] = []
        for item in failed:
            assert item.error is not None
            error = _as_died(item.error, death)
            incident = Incident(
                stage=self.run.stage,
                batch_size=batch_size,
                concurrency=concurrency,
                round=round_no,
                request_body=item.body,
                request_headers=self.headers,
                error=error,
                exception_type=item.exception_type,
                traceback=item.traceback,
                server_pid=server.pid,
                vram=vram,
                log_tail=tail,
                server_exit_code=ended.exit_code if ended else None,
                server_signal=ended.signal if ended else None,
                extra={
                    "item": item.index,
                    "path": item.path,
                    "elapsed_s": round(item.elapsed_s, 6),
                    "server_found_by": server.found_by,
                    "server_alive": running,
                },
            )
            name = incident_name(label or batch_size, round_no, item.index)
            paths.append(write_incident(self.run, name, incident))
        self.written.extend(paths)
        return paths

    def classify(self, items: Sequence[ItemResult]) -> list[ItemResult]:
        """``items`` with each failure the managed server's death caused (a dropped or refused
        connection while its process had exited) re-kinded ``server_died``: the records, the
        tier's error kinds and the incidents then all say the same."""
        if all(i.error is None for i in items):
            return list(items)
        server = resolve_server(self.server_pid, self.runs_dir, None, self.targets)
        death = self._death(server, alive(server))
        if death is None:
            return list(items)
        return [replace(i, error=_as_died(i.error, death)) if i.error else i for i in items]

    def _death(
        self, server: ServerProcess, running: bool | None
    ) -> tuple[int, exit_status.ExitStatus | None] | None:
        """(PID, how it ended) when the server calibrate manages has exited; None otherwise.
        Its exit status is waited for once per PID (the supervisor writes it as it reaps)."""
        if server.record is None or running is not False or server.pid is None:
            return None
        if server.pid not in self._ended:
            path = str(exit_status.status_path(self.runs_dir))  # where a record names none
            record = replace(server.record, status_file=server.record.status_file or path)
            self._ended[server.pid] = process.recorded_end(record)
        return server.pid, self._ended[server.pid]

    def _vram(self, snap: GpuSnapshot | None, peak: WindowPeak | None) -> dict[str, Any] | None:
        last = self.monitor.last
        out: dict[str, Any] = {}
        if peak is not None and peak.samples:
            out["round_peak"] = {
                "used_mib": peak.peak_used_mib,
                "total_mib": peak.total_mib,
                "kv_usage": peak.peak_kv_usage,
                "pressure": peak.peak_pressure.value,
                "pressure_source": peak.peak_pressure.source,
                "pressure_metric": peak.peak_pressure.text,
                "devices": [d.to_json() for d in peak.devices],
                "server_queue_max": peak.server_queue_max,
            }
        if snap is not None:
            out.update(snap.to_json())
        if last is not None:
            out["sampler"] = {"source": self.monitor.source, **last.to_json()}
        return out or None


def _as_died(
    error: ErrorInfo, death: tuple[int, exit_status.ExitStatus | None] | None
) -> ErrorInfo:
    """``error`` as ``server_died`` when the managed server had exited and the error is one a
    death causes; unchanged otherwise (an OOM answer, a 4xx, or a live server)."""
    if death is None or error.kind not in exit_status.DEATH_KINDS:
        return error
    return exit_status.died_error(error, *death)
