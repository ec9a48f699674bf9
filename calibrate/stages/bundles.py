"""Incident bundles for the ladder and the sweep (SPEC §5.4): one file per failed request."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibrate.gpu import GpuSnapshot, gpu_snapshot
from calibrate.incidents import Incident, incident_name, write_incident
from calibrate.stages.tiers import ItemResult
from calibrate.store import RunDir
from calibrate.vram import VramMonitor, WindowPeak

LOG_TAIL_LINES = 200


@dataclass(frozen=True)
class ServerProcess:
    """Which process serves the model, and how we know."""

    pid: int | None
    found_by: str  # "--server-pid", "runs/server.pid", "nvml", "unknown"
    managed: bool = False


def resolve_server(
    explicit_pid: int | None, runs_dir: Path, snapshot: GpuSnapshot | None
) -> ServerProcess:
    """``--server-pid``, else the managed server's PID file, else NVML's biggest GPU process."""
    if explicit_pid is not None:
        return ServerProcess(explicit_pid, "--server-pid")
    pid_file = runs_dir / "server.pid"
    try:
        return ServerProcess(int(pid_file.read_text("utf-8").split()[0]), str(pid_file), True)
    except (OSError, ValueError, IndexError):
        pass
    if snapshot is not None and snapshot.processes:
        pid, _ = max(snapshot.processes, key=lambda p: p[1])
        return ServerProcess(pid, "nvml")
    return ServerProcess(None, "unknown")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str] | None:
    try:
        with path.open("r", encoding="utf-8", errors="replace") as handle:
            return [line.rstrip("\n") for line in handle.readlines()[-lines:]]
    except OSError:
        return None


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
    ) -> None:
        self.run = run
        self.headers = dict(headers)
        self.monitor = monitor
        self.runs_dir = runs_dir
        self.server_pid = server_pid
        self.devices = devices
        self.snapshot = snapshot
        self.written: list[Path] = []

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
        server = resolve_server(self.server_pid, self.runs_dir, snap)
        vram = self._vram(snap, peak)
        alive = pid_alive(server.pid) if server.pid is not None else None
        tail = log_tail(self.runs_dir / "server.log") if server.managed else None
        paths: list[Path] = []
        for item in failed:
            assert item.error is not None
            incident = Incident(
                stage=self.run.stage, batch_size=batch_size, concurrency=concurrency, round=round_no,
                request_body=item.body, request_headers=self.headers, error=item.error,
                exception_type=item.exception_type, traceback=item.traceback,
                server_pid=server.pid, vram=vram, log_tail=tail,
                extra={"item": item.index, "path": item.path, "elapsed_s": round(item.elapsed_s, 6),
                       "server_found_by": server.found_by, "server_alive": alive},
            )  # fmt: skip
            name = incident_name(label or batch_size, round_no, item.index)
            paths.append(write_incident(self.run, name, incident))
        self.written.extend(paths)
        return paths

    def _vram(self, snap: GpuSnapshot | None, peak: WindowPeak | None) -> dict[str, Any] | None:
        last = self.monitor.last
        out: dict[str, Any] = {}
        if peak is not None and peak.samples:
            out["round_peak"] = {"used_mib": peak.peak_used_mib, "total_mib": peak.total_mib,
                                 "kv_usage": peak.peak_kv_usage,
                                 "pressure": peak.peak_pressure.value,
                                 "pressure_source": peak.peak_pressure.source,
                                 "pressure_metric": peak.peak_pressure.text,
                                 "devices": [d.to_json() for d in peak.devices],
                                 "server_queue_max": peak.server_queue_max}  # fmt: skip
        if snap is not None:
            out.update(snap.to_json())
        if last is not None:
            out["sampler"] = {"source": self.monitor.source, **last.to_json()}
        return out or None
