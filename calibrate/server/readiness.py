"""Waiting for a server: ready (``/health`` or ``GET /v1/models``), its port closed, its VRAM freed.

llama.cpp answers ``/health`` with 503 while it loads the model, vLLM and TGI refuse the
connection until they listen: every answer but 200 means "not yet". A managed server that
exits while we wait ends the wait at once, with its exit code and the tail of its log.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from calibrate.errors import RequestError
from calibrate.gpu.nvml import GpuSnapshot
from calibrate.http.client import OpenAIClient

Clock = Callable[[], float]
Sleep = Callable[[float], None]
ExitProbe = Callable[[], int | None]  # the managed process's exit code once it has exited

POLL_S = 0.2
PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Readiness:
    ready: bool
    elapsed_s: float
    exit_code: int | None = None  # set when the process died while we waited
    last_answer: str = ""  # what the server said last ("HTTP 503: loading", "connection refused")


def probe(root: str, health_path: str | None) -> tuple[bool, str]:
    """One readiness check against ``root`` (``http://host:port``)."""
    client = OpenAIClient(root + "/v1", timeout_s=PROBE_TIMEOUT_S, max_connections=1)
    try:
        if health_path:
            client.get_text(health_path, timeout_s=PROBE_TIMEOUT_S)
        else:
            client.models()
    except RequestError as exc:
        return False, exc.info.message
    finally:
        client.close()
    return True, "ready"


def wait_ready(
    root: str,
    health_path: str | None,
    timeout_s: float,
    *,
    exited: ExitProbe | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> Readiness:
    """Poll until the server answers ready, the process exits, or ``timeout_s`` passes."""
    start = clock()
    answer = ""
    while True:
        if exited is not None:
            code = exited()
            if code is not None:
                return Readiness(False, clock() - start, code, answer)
        ready, answer = probe(root, health_path)
        if ready:
            return Readiness(True, clock() - start, None, answer)
        if clock() - start >= timeout_s:
            return Readiness(False, clock() - start, None, answer)
        sleep(POLL_S)


def host_port(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    default = 443 if parts.scheme == "https" else 80
    return parts.hostname or "127.0.0.1", parts.port or default


def port_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_port_closed(
    host: str,
    port: int,
    timeout_s: float,
    *,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> bool:
    """True once nothing listens on host:port any more; False after ``timeout_s``."""
    deadline = clock() + timeout_s
    while port_open(host, port):
        if clock() >= deadline:
            return False
        sleep(POLL_S)
    return True


VramProbe = Callable[[], GpuSnapshot | None]
RELEASE_TOLERANCE_MIB = 512.0


@dataclass(frozen=True)
class VramRelease:
    ok: bool
    measured: bool
    message: str
    used_mib: float | None = None
    pid_listed: bool | None = None

    def to_json(self) -> dict[str, Any]:
        used = round(self.used_mib, 1) if self.used_mib is not None else None
        return {
            "vram_measured": self.measured,
            "vram_used_mib": used,
            "pid_listed": self.pid_listed,
        }


def used_mib(snapshot: GpuSnapshot | None) -> float | None:
    if snapshot is None or not snapshot.devices:
        return None
    return float(sum(float(d.get("used_mib") or 0.0) for d in snapshot.devices))


def wait_released(
    probe: VramProbe,
    pid: int | None,
    before_start_mib: float | None,
    before_stop: GpuSnapshot | None,
    *,
    timeout_s: float = 15.0,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
) -> VramRelease:
    """Wait until ``pid`` left NVML's process list and used memory is back near the pre-start level."""
    deadline = clock() + timeout_s
    stopped_at = used_mib(before_stop)
    while True:
        snapshot = probe()
        used = used_mib(snapshot)
        if snapshot is None or used is None:
            return VramRelease(
                True, False, "VRAM release not measured (NVML is not available here)"
            )
        listed = pid is not None and any(p == pid for p, _ in snapshot.processes)
        back = before_start_mib is None or used <= before_start_mib + RELEASE_TOLERANCE_MIB
        was = f", {stopped_at:.0f} MiB before the stop" if stopped_at is not None else ""
        start = (
            f", {before_start_mib:.0f} MiB before the server started"
            if before_start_mib is not None
            else ""
        )
        levels = f"device memory used {used:.0f} MiB{was}{start}"
        if not listed and back:
            if pid is None and before_start_mib is None:
                return VramRelease(
                    True,
                    True,
                    f"{levels}; release not proven (the server's PID and "
                    "pre-start level are unknown)",
                    used,
                    None,
                )
            where = f"PID {pid} is not in NVML's process list; " if pid is not None else ""
            return VramRelease(True, True, f"VRAM released: {where}{levels}", used, listed)
        if clock() >= deadline:
            why = (
                f"PID {pid} still holds GPU memory"
                if listed
                else (
                    f"used memory has not come back within {RELEASE_TOLERANCE_MIB:.0f} MiB of the pre-start level"
                )
            )
            return VramRelease(
                False,
                True,
                f"VRAM not released after {timeout_s:.0f} s: {why}; {levels}",
                used,
                listed,
            )
        sleep(0.25)
