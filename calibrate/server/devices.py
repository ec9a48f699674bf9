"""Which GPUs a managed server runs on: ``CUDA_VISIBLE_DEVICES`` in its own environment (SPEC §8);
and whether a stopped server's memory on them was released (``wait_released``, SPEC §5.7).

Used when ``--gpu`` is not given, so a server started on one MIG instance (or one GPU of
several) is sampled there, not across the whole machine.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibrate.config import Config
from calibrate.gpu.nvml import GpuSnapshot
from calibrate.server.process.target import managed_target

Clock = Callable[[], float]
Sleep = Callable[[float], None]

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_FULL_UUID = re.compile(rf"(GPU|MIG)-{_UUID}")


def visible_devices(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """NVML selectors for ``CUDA_VISIBLE_DEVICES``; None when it cannot be mapped safely.

    Full GPU-/MIG- UUIDs always map. Indices are CUDA's order, which is NVML's only with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; UUID prefixes and the legacy ``MIG-GPU-…/gi/ci`` form are
    not looked up (then every device is sampled, as without the variable).
    """
    entries = [e.strip() for e in environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if not entries or entries == [""]:
        return None
    pci_order = environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
    for entry in entries:
        if not (_FULL_UUID.fullmatch(entry) or (pci_order and entry.isdigit())):
            return None
    return tuple(entries)


def read_environ(pid: int) -> dict[str, str] | None:
    """A process's environment from /proc (None where it cannot be read)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # no /proc (macOS), or not ours to read
        return None
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, _, value in pairs}


def managed_server_devices(cfg: Config) -> tuple[str, ...] | None:
    """The devices of the server calibrate manages, when it is running, is the target and
    says (a managed server beside the target runs on devices that are not the target's)."""
    record = managed_target(cfg)
    if record is None:
        return None
    environ = read_environ(record.pid)
    return visible_devices(environ) if environ is not None else None


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
