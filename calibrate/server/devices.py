"""Which GPUs a managed server runs on: ``CUDA_VISIBLE_DEVICES`` in its own environment (SPEC §8).

Used when ``--gpu`` is not given, so a server started on one MIG instance (or one GPU of
several) is sampled there, not across the whole machine.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from calibrate.server import process

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


def managed_server_devices(runs_dir: Path) -> tuple[str, ...] | None:
    """The devices of the server calibrate manages, when it is running and says."""
    record = process.load(runs_dir)
    if record is None or process.liveness(record) != "running":
        return None
    environ = read_environ(record.pid)
    return visible_devices(environ) if environ is not None else None
