"""What the noise meter reads from the machine (``gpu.noise``): ``/proc/stat``'s CPU times, each
process's parent and CPU time, and which process listens on a port — behind one seam,
``ProcReader``; ``LinuxProc`` reads a real (or a test's) ``/proc``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

from calibrate.errors import InputError
from calibrate.gpu import sockdiag
from calibrate.io.bounded import read_bounded

PROC = Path("/proc")  # this machine's: sock_diag answers for its sockets


@dataclass(frozen=True)
class CpuTimes:
    """``/proc/stat``'s first line in core-seconds: busy (user, nice, system, irq, softirq),
    stolen, and every field together (idle and iowait too)."""

    busy_s: float
    steal_s: float
    total_s: float
    cores: int


class ProcessCpu(NamedTuple):
    """One process: its parent and the CPU it has used (user + system), in seconds (a tuple:
    a sample makes one per process on the machine)."""

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
        """The processes that listen on TCP ``port`` of this machine (none when unknown); asked
        again, cheap while they still do (a restarted server's new processes are found)."""
        ...


@dataclass(frozen=True)
class Listener:
    """Who was found listening on a port: the sockets (inodes) and the processes holding them."""

    inodes: frozenset[int]
    pids: tuple[int, ...]


class LinuxProc:
    """``ProcReader`` over Linux's ``/proc`` (and, for the listening sockets of this machine's
    ``/proc``, sock_diag: ``gpu.sockdiag``)."""

    def __init__(self, root: Path = PROC) -> None:
        self.root = root
        self._found: dict[int, Listener] = {}  # by port: what ``listening`` found last
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
        """Every readable process, from its ``stat``: one ``read`` call each (a sample reads
        every process of the machine, hundreds on a busy one)."""
        out: list[ProcessCpu] = []
        try:
            names = os.listdir(self.root)
        except OSError:
            return out
        root, tick_s = str(self.root), self.tick_s
        for name in names:
            if not name.isdigit():
                continue
            try:
                raw = _read_stat(f"{root}/{name}/stat")
                # after the name: state, ppid, …; utime and stime are the 14th and 15th fields
                fields = raw[raw.rindex(b")") + 2 :].split(None, 13)
                out.append(
                    ProcessCpu(
                        int(name), int(fields[1]), (int(fields[11]) + int(fields[12])) * tick_s
                    )
                )
            except (OSError, IndexError, ValueError):
                continue  # gone, or not ours to read
        return out

    def listening(self, port: int) -> Sequence[int]:
        """Found once, then kept while its processes live and — where sock_diag answers — the
        sockets listening on the port are the ones found (a restarted server's are new, even
        while an old process lives on): a re-check is one netlink dump of the listening
        sockets, not the socket table and every process's open files."""
        quick = sockdiag.listening_inodes(port) if self.root == PROC else None
        known = self._found.get(port)
        if known and quick in (None, known.inodes) and all(map(self.alive, known.pids)):
            return list(known.pids)
        inodes = quick if quick is not None else socket_inodes(port, self.root)
        owners = sorted(owners_of(inodes, self.root)) if inodes else []
        if owners:
            self._found[port] = Listener(frozenset(inodes or ()), tuple(owners))
        else:
            self._found.pop(port, None)
        return owners

    def alive(self, pid: int) -> bool:
        return os.path.exists(f"{self.root}/{pid}")


LISTEN = "0A"  # a TCP socket's state in /proc/net/tcp: listening
STAT_BYTES = 4096  # a read of /proc/PID/stat


def _read_stat(path: str) -> bytes:
    """A process's ``stat``: one read of at most ``STAT_BYTES`` (the line is under 1.5 KiB: a
    name of at most 64 bytes and 52 numbers), no buffer, no size asked first."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, STAT_BYTES)
    finally:
        os.close(fd)


def _read(path: Path | str) -> bytes:
    """A /proc file read with the bound every read has (a device or FIFO is never read whole)."""
    try:
        return read_bounded(path)
    except InputError as exc:
        raise OSError(str(exc)) from exc


def listening_owners(port: int, root: Path = PROC) -> set[int] | None:
    """The PIDs holding a listening TCP socket on ``port`` (IPv4 or IPv6): the sockets from
    sock_diag (this machine's ``/proc``) or the socket table, their holders from each process's
    open files; None where neither can tell (no Linux). Processes whose file descriptors cannot
    be read are left out: an empty set means "not seen", not "nobody"."""
    inodes = sockdiag.listening_inodes(port) if root == PROC else None
    if inodes is None:
        inodes = socket_inodes(port, root)
    return None if inodes is None else owners_of(inodes, root)


def socket_inodes(port: int, root: Path = PROC) -> set[int] | None:
    """The inodes of the sockets listening on ``port``, from ``/proc/net/tcp`` and ``tcp6``: the
    whole socket table, written out by the kernel on each read (None: neither readable)."""
    inodes: set[int] = set()
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
                inodes.add(int(cols[9]))
    return inodes if readable else None


def owners_of(inodes: Iterable[int], root: Path = PROC) -> set[int]:
    """The processes holding any of the sockets ``inodes`` among their open files."""
    wanted = {f"socket:[{inode}]" for inode in inodes if inode}
    owners: set[int] = set()
    with contextlib.suppress(OSError), os.scandir(root) as entries:
        for entry in entries if wanted else ():
            if entry.name.isdigit() and _holds(entry.path, wanted):
                owners.add(int(entry.name))
    return owners


def _holds(process: str, wanted: set[str]) -> bool:
    try:
        with os.scandir(f"{process}/fd") as fds:
            for fd in fds:
                with contextlib.suppress(OSError):
                    if os.readlink(fd.path) in wanted:
                        return True
    except OSError:
        pass
    return False
