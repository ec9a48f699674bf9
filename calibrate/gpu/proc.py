"""What the noise meter reads from the machine (``gpu.noise``): ``/proc/stat``'s CPU times, each
process's parent and CPU time, and which process listens on a port — behind one seam,
``ProcReader``; ``LinuxProc`` reads a real (or a test's) ``/proc``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from calibrate.errors import InputError
from calibrate.io.bounded import read_bounded


@dataclass(frozen=True)
class CpuTimes:
    """``/proc/stat``'s first line in core-seconds: busy (user, nice, system, irq, softirq),
    stolen, and every field together (idle and iowait too)."""

    busy_s: float
    steal_s: float
    total_s: float
    cores: int


@dataclass(frozen=True)
class ProcessCpu:
    """One process: its parent and the CPU it has used (user + system), in seconds."""

    pid: int
    ppid: int
    cpu_s: float


class ProcReader(Protocol):
    """What the noise meter reads from the machine (``LinuxProc``; a fake in tests)."""

    def cpu_times(self) -> CpuTimes | None:
        """The machine's CPU times (None: not readable here)."""
        ...

    def processes(self) -> Sequence[ProcessCpu]:
        """Every process that can be read, with its parent and CPU time."""
        ...

    def listening(self, port: int) -> Sequence[int]:
        """The processes that listen on TCP ``port`` of this machine (none when unknown)."""
        ...

    def alive(self, pid: int) -> bool:
        """Whether process ``pid`` is still there."""
        ...


class LinuxProc:
    """``ProcReader`` over Linux's ``/proc``."""

    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = root
        ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.tick_s = 1.0 / ticks

    def cpu_times(self) -> CpuTimes | None:
        try:
            lines = _read(self.root / "stat").decode("ascii", "replace").splitlines()
        except OSError:
            return None
        head = next((ln.split() for ln in lines if ln.startswith("cpu ")), None)
        cores = sum(1 for ln in lines if ln.startswith("cpu") and ln[3:4].isdigit())
        if head is None or len(head) < 9:
            return None
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in head[1:9])
        t = self.tick_s
        busy = (user + nice + system + irq + softirq) * t
        total = (user + nice + system + idle + iowait + irq + softirq + steal) * t
        return CpuTimes(busy, steal * t, total, max(1, cores))

    def processes(self) -> Sequence[ProcessCpu]:
        out: list[ProcessCpu] = []
        with contextlib.suppress(OSError), os.scandir(self.root) as entries:
            for entry in entries:
                if entry.name.isdigit():
                    found = self._process(int(entry.name), f"{entry.path}/stat")
                    if found is not None:
                        out.append(found)
        return out

    def _process(self, pid: int, stat_path: str) -> ProcessCpu | None:
        try:
            raw = _read(stat_path)  # a str: a Path per process was a sixth of the scan
            fields = raw.rsplit(b")", 1)[1].split()
            # after the name: state, ppid, …; utime and stime are the 14th and 15th fields
            return ProcessCpu(
                pid, int(fields[1]), (int(fields[11]) + int(fields[12])) * self.tick_s
            )
        except (OSError, IndexError, ValueError):
            return None  # gone, or not ours to read

    def listening(self, port: int) -> Sequence[int]:
        return sorted(listening_owners(port, self.root) or ())

    def alive(self, pid: int) -> bool:
        return os.path.exists(f"{self.root}/{pid}")


LISTEN = "0A"  # a TCP socket's state in /proc/net/tcp: listening


def _read(path: Path | str) -> bytes:
    """A /proc file read with the bound every read has (a device or FIFO is never read whole)."""
    try:
        return read_bounded(path)
    except InputError as exc:
        raise OSError(str(exc)) from exc


def listening_owners(port: int, root: Path = Path("/proc")) -> set[int] | None:
    """The PIDs holding a listening TCP socket on ``port`` (IPv4 or IPv6), read from ``/proc``;
    None where ``/proc`` cannot tell (no Linux, or no socket table). Processes whose file
    descriptors cannot be read are left out: an empty set means "not seen", not "nobody"."""
    inodes: set[str] = set()
    readable = False
    for table in ("tcp", "tcp6"):
        try:
            lines = _read(root / "net" / table).decode("ascii", "replace").splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == LISTEN and cols[1].endswith(f":{port:04X}"):
                inodes.add(cols[9])
    if not readable:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes if inode != "0"}
    owners: set[int] = set()
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries if wanted else ():
            if entry.name.isdigit() and _holds(root / entry.name, wanted):
                owners.add(int(entry.name))
    return owners


def _holds(process: Path, wanted: set[str]) -> bool:
    try:
        with os.scandir(process / "fd") as fds:
            for fd in fds:
                with contextlib.suppress(OSError):
                    if os.readlink(fd.path) in wanted:
                        return True
    except OSError:
        pass
    return False
