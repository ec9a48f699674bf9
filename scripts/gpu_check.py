"""GPU smoke check (make gpu-check): NVML devices, memory v1/v2, processes, energy, and a sampled
spike.

On a machine with an NVIDIA GPU it proves calibrate's VRAM sampler sees a one-second allocation
spike (made with torch or cupy, whichever is importable), and reads the energy calibrate would
record over that window (NVML's total-energy counter, else its power draw integrated): the
``energy:`` line the GPU proof's summary repeats. Energy NVML does not offer (a MIG instance) is
said, not a failure. Without a GPU it says so and exits 0. Finishes well under 60 s.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from calibrate.gpu.energy import EnergyWindow
from calibrate.gpu.nvml import NvmlSampler
from calibrate.gpu.reading import MIB
from calibrate.gpu.sources import energy_reader
from calibrate.gpu.vram import VramMonitor

SPIKE_S = 1.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def describe(sampler: NvmlSampler) -> None:
    nvml = sampler.nvml
    print(
        f"driver {_text(nvml.nvmlSystemGetDriverVersion())}, NVML {_text(nvml.nvmlSystemGetNVMLVersion())}"
    )
    for index, (_device, handle) in enumerate(sampler.devices):
        name = _text(nvml.nvmlDeviceGetName(handle))
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        v1 = nvml.nvmlDeviceGetMemoryInfo(handle)
        print(f"gpu {index}: {name} {uuid}")
        print(
            f"  memory v1: used {v1.used / MIB:.0f} MiB, free {v1.free / MIB:.0f}, total {v1.total / MIB:.0f}"
        )
        v2_version = getattr(nvml, "nvmlMemory_v2", None)
        if v2_version is None:
            print("  memory v2: not offered by this nvidia-ml-py")
        else:
            try:
                v2 = nvml.nvmlDeviceGetMemoryInfo(handle, version=v2_version)
                print(
                    f"  memory v2: used {v2.used / MIB:.0f} MiB, reserved {v2.reserved / MIB:.0f}, total {v2.total / MIB:.0f}"
                )
            except sampler.errors as exc:
                print(f"  memory v2: not supported by this driver ({exc})")
        procs = sampler.processes(handle)
        listing = ", ".join(f"pid {pid} {used:.0f} MiB" for pid, used in procs) or "none"
        print(f"  compute processes: {listing}")
        print(f"  energy: {device_energy(sampler, handle)}")


def device_energy(sampler: NvmlSampler, handle: Any) -> str:
    """``total-energy counter 51234.5 J since the driver loaded; power 71 W`` (or why not)."""
    nvml, parts = sampler.nvml, []
    try:
        parts.append(
            f"total-energy counter {nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000:.1f} J "
            "since the driver loaded"
        )
    except sampler.errors as exc:
        parts.append(f"total-energy counter not supported ({exc})")
    try:
        parts.append(f"power {nvml.nvmlDeviceGetPowerUsage(handle) / 1000:.0f} W")
    except sampler.errors as exc:
        parts.append(f"power not supported ({exc})")
    return "; ".join(parts)


def energy_line(window: EnergyWindow | None) -> str:
    """The ``energy:`` line: what calibrate recorded over the spike's window, all devices."""
    if window is None:
        return (
            "energy: NVML gave neither the total-energy counter nor the power draw over the "
            "window: tiers and levels carry no J/output token on this card"
        )
    watts = window.joules / window.seconds if window.seconds > 0 else 0.0
    return (
        f"energy: {window.source}, {window.joules:.1f} J over {window.seconds:.1f} s "
        f"(mean {watts:.0f} W) across the spike window, all devices"
    )


def allocator() -> tuple[str, Callable[[int], Any]] | None:
    """A way to put ``n`` bytes on GPU 0 with a tool already on such machines."""
    try:
        import torch

        if torch.cuda.is_available():

            def alloc_torch(n: int) -> Any:
                block = torch.empty(n, dtype=torch.uint8, device="cuda:0")
                block.fill_(1)
                torch.cuda.synchronize()
                return block

            return "torch", alloc_torch
    except ImportError:
        pass
    try:
        import cupy

        def alloc_cupy(n: int) -> Any:
            block = cupy.ones(n, dtype=cupy.uint8)
            cupy.cuda.runtime.deviceSynchronize()
            return block

        return "cupy", alloc_cupy
    except ImportError:
        return None


def idle_energy(sampler: NvmlSampler) -> EnergyWindow | None:
    """The energy over SPIKE_S of nothing (no allocator to make a spike with)."""
    monitor = VramMonitor([sampler], interval_s=0.05, energy=energy_reader([sampler])).start()
    try:
        idle = monitor.open_window()
        time.sleep(SPIKE_S)
        return monitor.close_window(idle).energy
    finally:
        monitor.stop()


def spike(sampler: NvmlSampler, found: tuple[str, Callable[[int], Any]] | None = None) -> bool:
    """Allocate on the first GPU for SPIKE_S and check the sampler saw that device rise by it
    (that device's own figures: the window's peak is the fullest device's, maybe another)."""
    found = found or allocator()
    if found is None:
        print("spike: neither torch (with CUDA) nor cupy is importable: spike not checked")
        print(energy_line(idle_energy(sampler)))
        return True
    tool, alloc = found
    v1 = sampler.nvml.nvmlDeviceGetMemoryInfo(sampler.devices[0][1])
    size = int(min(4 * 1024 * MIB, v1.free * 0.25))
    monitor = VramMonitor([sampler], interval_s=0.05, energy=energy_reader([sampler])).start()
    try:
        idle = monitor.open_window()
        time.sleep(0.2)
        holder: dict[str, Any] = {}

        def hold() -> None:
            holder["block"] = alloc(size)
            time.sleep(SPIKE_S)
            holder.clear()

        worker = threading.Thread(target=hold)
        worker.start()
        worker.join(timeout=30)
        time.sleep(0.3)
        peak = monitor.close_window(idle)
    finally:
        monitor.stop()
    idle_mib = idle.devices[0].used_mib if idle and idle.devices else 0.0
    peak_mib = peak.devices[0].used_mib if peak.devices else 0.0
    rise_mib = peak_mib - idle_mib
    wanted_mib = size / MIB
    caught = rise_mib >= 0.9 * wanted_mib
    print(
        f"spike: {tool} allocated {wanted_mib:.0f} MiB for {SPIKE_S:.0f} s; sampler saw idle "
        f"{idle_mib:.0f} MiB, peak {peak_mib:.0f} MiB (+{rise_mib:.0f}) on the first device "
        f"over {peak.samples} samples: {'CAUGHT' if caught else 'MISSED'}"
    )
    print(energy_line(peak.energy))
    return caught


def main() -> int:
    start = time.monotonic()
    sampler = NvmlSampler.open()
    if sampler is None:
        print(
            "gpu-check: no NVIDIA GPU visible (NVML library, driver or device missing): nothing to check"
        )
        return 0
    try:
        describe(sampler)
        ok = spike(sampler)
    finally:
        sampler.close()
    print(
        f"gpu-check: {'ok' if ok else 'FAILED: the sampler missed the spike'} in {time.monotonic() - start:.1f} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
