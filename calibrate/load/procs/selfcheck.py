"""The self-check of a load sent from several processes (``--workers``): one rule for the
ladder, the sweep and batch (SPEC §12, §5.14).

Each worker judges its own CPU and late threads on the parent's rule (``worker_check``: while
the server's processes it was told hold the cores, lateness is the server's limit, not the
client's); the parent judges its own (the stage's monitor); and all of calibrate's processes
together are judged against the machine's cores (``machine_check``: N workers each under a core
can still leave a server on the same machine nothing). A run was the client's limit when any
of them was, and says which (``merged``, ``first_reason``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from calibrate.gpu.noise import LinuxProc, ProcReader, server_cpu
from calibrate.gpu.selfload import SelfLoadMonitor, SelfLoadReport, tree_cpu, workers_advice
from calibrate.load.procs.worker_count import cores

MACHINE_SHARE = 0.85  # all of calibrate's processes at this share of the cores: the machine's limit
PARENT = "calibrate's parent process"  # who the stage's own self-check is while workers send
MORE_PROCESSES = (
    "send from more processes with --workers N (or auto), or run calibrate from a faster "
    "client machine, or one the server does not share its CPU with"
)


@dataclass(frozen=True)
class CheckLimits:
    """A worker's self-check thresholds, sent in its setup: its CPU as a share of one core, its
    threads' mean lateness, and the window it judges (a test sets 0 and a short window: every
    window is bound at once; inf: none is)."""

    cpu_limit: float = 0.85
    window_s: float = 1.0
    lag_limit_s: float = 0.015


DEFAULT_LIMITS = CheckLimits()


def worker_check(
    who: str,
    server_pids: Callable[[], Iterable[int]],
    reader: ProcReader | None = None,
    *,
    limits: CheckLimits = DEFAULT_LIMITS,
    **settings: Any,
) -> SelfLoadMonitor:
    """A worker's self-check on the parent's rule (``tier_run.measuring``): its own CPU near a
    core is the client's limit; its threads late while the server's processes (``server_pids``,
    read through ``reader``) hold half the machine's cores are the server's. ``settings``: the
    monitor's advice, or its clocks and windows (a test's virtual ones)."""
    server = server_cpu(reader or LinuxProc(), server_pids)
    settings = {
        "cpu_limit": limits.cpu_limit,
        "window_s": limits.window_s,
        "lag_limit_s": limits.lag_limit_s,
        **settings,
    }
    return SelfLoadMonitor(who=who, server_cpu=server, **settings)


def machine_check(
    pids: Callable[[], Iterable[int]],
    workers: int,
    instead: str,
    share: float = MACHINE_SHARE,
    window_s: float = DEFAULT_LIMITS.window_s,
) -> SelfLoadMonitor:
    """All of calibrate's processes together (this one, its children, the live ``pids``)
    judged against the machine's cores in windows of ``window_s``: ``share`` of them in use is
    the client's limit (each process's own monitor watches its threads' lateness)."""
    return SelfLoadMonitor(
        window_s=window_s,
        cpu_clock=tree_cpu(pids),
        cpu_limit=share * cores(),
        lag_limit_s=float("inf"),
        advice=(
            f"the parent and its {workers} --workers share this machine's cores with nothing to "
            f"spare: run calibrate on another machine than the server, or {instead}"
        ),
        who=f"calibrate's {workers + 1} processes",
        of_cores=cores(),
    )


def worker_advice(workers: int, instead: str) -> str:
    """What a worker (or the only process) that is the limit is told: more processes while
    cores are left, else ``instead``."""
    return workers_advice(workers, cores(), instead)


def parent_advice(workers: int, role: str, instead: str) -> str:
    """… and the parent, which only ``role``s (feeds, or reads and writes) for the workers."""
    return (
        f"the parent process that {role} all {workers} --workers is the limit, so more "
        f"workers will not help: {instead}"
    )


def first_reason(reasons: Iterable[str]) -> str:
    """Why a run was the client's limit: the first process that said so ("" when none did)."""
    return next((why for why in reasons if why), "")


def merged(
    own: SelfLoadReport, workers: Sequence[SelfLoadReport], machine: SelfLoadReport | None = None
) -> SelfLoadReport:
    """One self-check for a run: the busiest process's figures; a bottleneck if any process
    was one, or all of them together took the machine (``machine``: its reason only)."""
    reports = [own, *workers]
    if machine is not None and machine.bottleneck:
        reports.append(replace(machine, cpu_fraction_max=0.0, cpu_fraction_mean=0.0))
    reason = first_reason(r.reason for r in reports if r.bottleneck)
    return SelfLoadReport(
        windows=max(r.windows for r in reports),
        cpu_fraction_max=max(r.cpu_fraction_max for r in reports),
        cpu_fraction_mean=max(r.cpu_fraction_mean for r in reports),
        lag_max_s=max(r.lag_max_s for r in reports),
        bottleneck=bool(reason),
        reason=reason,
    )


def client_limit_hint(cause: str) -> str:
    """What to do when calibrate itself was the limit, by which process said so (``cause``, as
    its self-check words it): all of them together — another machine; the parent that feeds
    the workers — a faster CPU, since more workers would not help; else more processes."""
    if "of this machine's" in cause:
        return "run calibrate on another machine than the server, or on one with more cores"
    if PARENT in cause:
        return (
            "run calibrate on a faster CPU: its parent process feeds every worker, so more "
            "--workers will not help"
        )
    return MORE_PROCESSES
