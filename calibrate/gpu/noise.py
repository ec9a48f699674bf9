"""The machine's own noise while calibrate measures (SPEC §5.14): what other processes did to it.

Three figures per ladder round, sweep run and tune level, over the same window as the
measurement itself:

- **other processes' CPU**, in cores: the machine's busy time (``/proc/stat``) less calibrate's
  own process tree and the server's (a server on this machine is what is measured, not noise);
- **steal**: the share of the machine's CPU time its hypervisor gave to other guests;
- **the client's scheduling delay**: how late calibrate's own timer thread ran (the self-check's
  figure, ``gpu.selfload``).

Everything read from ``/proc`` goes through one seam, ``ProcReader``: ``LinuxProc`` reads the
real files, a test hands ``NoiseMeter`` a fake one and drives it without a thread or a patch.
Where there is no ``/proc`` (macOS) nothing is measured and nothing is claimed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from calibrate.gpu.proc import CpuTimes, LinuxProc, ProcessCpu, ProcReader

__all__ = ["CpuTimes", "LinuxProc", "ProcReader", "ProcessCpu"]

Clock = Callable[[], float]
BUSY_CORES = 0.25  # other processes' CPU from which the machine is called busy, in cores
BUSY_SHARE = 0.10  # … or this share of its cores, whichever is more
STEAL_SHARE = 0.05  # steal from which the hypervisor is named
LAG_S = 0.015  # the client's timer this late on average: starved (the self-check's limit)


def tree(processes: Iterable[ProcessCpu], roots: Iterable[int]) -> set[int]:
    """``roots`` and every process descended from them."""
    children: dict[int, list[int]] = {}
    for p in processes:
        children.setdefault(p.ppid, []).append(p.pid)
    found: set[int] = set()
    todo = [r for r in roots if r > 0]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def server_cpu(
    reader: ProcReader, server_pids: Callable[[], Iterable[int]], own_pid: int | None = None
) -> Callable[[], float | None]:
    """The CPU seconds the server's processes (and their children) have used so far, read
    afresh each call (None: no server process on this machine is known). calibrate's own
    process is never the server's (a mock serving from inside it)."""
    own = own_pid if own_pid is not None else os.getpid()

    def read() -> float | None:
        roots = [pid for pid in server_pids() if pid != own]
        if not roots:
            return None
        processes = reader.processes()
        ours = tree(processes, roots)
        return sum(p.cpu_s for p in processes if p.pid in ours)

    return read


@dataclass(frozen=True)
class MachineNoise:
    """What the rest of the machine did during a window of ``wall_s`` seconds."""

    wall_s: float
    cores: int
    others_cpu_s: float  # CPU seconds of processes that are neither calibrate's nor the server's
    steal_s: float  # core-seconds the hypervisor gave to other guests
    total_s: float  # every core-second of the window (the steal's denominator)
    client_lag_s: float | None = None  # calibrate's timer thread: mean lateness (None: unknown)

    @property
    def others_cores(self) -> float:
        """Other processes' CPU in cores (never more than the machine has: /proc/stat and the
        clock are read a moment apart)."""
        return min(self.cores, self.others_cpu_s / self.wall_s) if self.wall_s > 0 else 0.0

    @property
    def steal_share(self) -> float:
        return self.steal_s / self.total_s if self.total_s > 0 else 0.0

    @property
    def busy(self) -> bool:
        return self.others_cores >= max(BUSY_CORES, BUSY_SHARE * self.cores)

    @property
    def stolen(self) -> bool:
        return self.steal_share >= STEAL_SHARE

    @property
    def starved(self) -> bool:
        return self.client_lag_s is not None and self.client_lag_s >= LAG_S

    def plus(self, other: MachineNoise) -> MachineNoise:
        """Both windows as one (the lag weighted by each window's length)."""
        wall = self.wall_s + other.wall_s
        lags = [(n.client_lag_s, n.wall_s) for n in (self, other) if n.client_lag_s is not None]
        weight = sum(w for _, w in lags)
        lag = sum(v * w for v, w in lags) / weight if weight > 0 else None
        return MachineNoise(
            wall,
            max(self.cores, other.cores),
            self.others_cpu_s + other.others_cpu_s,
            self.steal_s + other.steal_s,
            self.total_s + other.total_s,
            lag,
        )

    def causes(self) -> list[str]:
        """What of it could make a measurement noisy, in words (none: the machine was quiet)."""
        out: list[str] = []
        if self.busy:
            out.append(
                f"other processes used {self.others_cores:.1f} of this machine's {self.cores} "
                f"{'core' if self.cores == 1 else 'cores'}"
            )
        if self.stolen:
            out.append(f"the hypervisor took {self.steal_share:.0%} of its CPU time (steal)")
        if self.starved and self.client_lag_s is not None:
            out.append(
                f"calibrate's threads waited {self.client_lag_s * 1000:.0f} ms on average to run"
            )
        return out

    def said(self, during: str) -> str:
        """``the machine during the sweep: other processes used 0.2 of its 2 cores, steal 0 %``."""
        lag = self.client_lag_s
        late = (
            f", calibrate's threads {lag * 1000:.0f} ms late on average"
            if lag and lag >= 0.001
            else ""
        )
        return (
            f"the machine during {during}: other processes used {self.others_cores:.1f} of its "
            f"{self.cores} cores, steal {self.steal_share * 100:.0f} %{late}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "noise_other_cpu_cores": round(self.others_cores, 3),
            "noise_steal_share": round(self.steal_share, 4),
            "noise_client_lag_s": round(self.client_lag_s, 4)
            if self.client_lag_s is not None
            else None,
            "noise_cores": self.cores,
        }


def combined(noises: Iterable[MachineNoise | None]) -> MachineNoise | None:
    """Several windows as one (None when none was measured)."""
    out: MachineNoise | None = None
    for noise in noises:
        if noise is not None:
            out = noise if out is None else out.plus(noise)
    return out


@dataclass(frozen=True)
class NoiseMark:
    """Where a measured window starts: the clock, the machine's times, each process's CPU."""

    at_s: float
    machine: CpuTimes | None
    cpu_s: Mapping[int, float]
    own_reaped_s: float
    lag_mark: int


def _reaped_children_s() -> float:
    t = os.times()
    return t.children_user + t.children_system


class NoiseMeter:
    """Marks a window's start, then says what the rest of the machine did since (``since``).

    ``server_pids`` names the server's processes on this machine when it runs here (the managed
    server's, ``--server-pid``, the listener of the target's port); they and calibrate's own
    process tree (its ``--workers`` too) are left out of "other processes". ``lag`` gives the
    client's mean timer lateness in the self-check's windows after a mark.
    """

    def __init__(
        self,
        reader: ProcReader | None = None,
        *,
        clock: Clock = time.monotonic,
        own_pid: int | None = None,
        server_pids: Callable[[], Iterable[int]] = lambda: (),
        lag: tuple[Callable[[], int], Callable[[int], float | None]] | None = None,
        reaped: Callable[[], float] = _reaped_children_s,
    ) -> None:
        self.reader: ProcReader = reader if reader is not None else LinuxProc()
        self._clock = clock
        self._own = own_pid if own_pid is not None else os.getpid()
        self._server_pids = server_pids
        self._lag = lag
        self._reaped = reaped

    def mark(self) -> NoiseMark:
        machine = self.reader.cpu_times()
        cpu = {p.pid: p.cpu_s for p in self.reader.processes()} if machine else {}
        lag_mark = self._lag[0]() if self._lag else 0
        return NoiseMark(self._clock(), machine, cpu, self._reaped(), lag_mark)

    def since(self, mark: NoiseMark) -> MachineNoise | None:
        """The rest of the machine since ``mark`` (None: nothing could be read)."""
        wall_s = self._clock() - mark.at_s
        lag = self._lag[1](mark.lag_mark) if self._lag else None
        machine = self.reader.cpu_times()
        if machine is None or mark.machine is None or wall_s <= 0:
            return None
        processes = self.reader.processes()
        ours = tree(processes, [self._own, *self._server_pids()])
        before = mark.cpu_s
        excluded = sum(
            max(0.0, p.cpu_s - before.get(p.pid, 0.0)) for p in processes if p.pid in ours
        )
        excluded += max(0.0, self._reaped() - mark.own_reaped_s)
        busy = machine.busy_s - mark.machine.busy_s
        return MachineNoise(
            wall_s,
            machine.cores,
            max(0.0, busy - excluded),
            max(0.0, machine.steal_s - mark.machine.steal_s),
            max(0.0, machine.total_s - mark.machine.total_s),
            lag,
        )
