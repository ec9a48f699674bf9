"""What a ladder or sweep run needs around its tiers: samplers, incidents, the server's processes.

The command line turns its flags into a ``MeasureSpec``; everything here is testable without a
terminal. ``measuring`` starts the VRAM sampler and calibrate's own load monitor and stops them
however the run ends; ``client_bound_since`` says whether calibrate was the limit during a tier
or level. Who watches the run is ``tier_stage.watch``'s; ``tier_stage.tier_finish`` writes the
verdict once the tiers are in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from calibrate.config import Config, SloConfig
from calibrate.errors import UsageError
from calibrate.gpu.energy import check_price
from calibrate.gpu.noise import LinuxProc, NoiseMeter, server_cpu
from calibrate.gpu.nvml import NvmlSampler
from calibrate.gpu.proc import ProcReader
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.gpu.sources import MetricsEndpoint, SourceChoice, energy_reader, open_sources
from calibrate.gpu.vram import VramMonitor
from calibrate.io.tasks import TaskPool
from calibrate.io.tier_table.row import TierRow
from calibrate.load.sender import Sender
from calibrate.redact import redact_url
from calibrate.server.devices import managed_server_devices
from calibrate.server.process.target import is_target, managed_target
from calibrate.stages.context import StageContext
from calibrate.stages.measure.incidents import IncidentRecorder
from calibrate.workload import WorkloadSpec

LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")  # a server there runs on this machine
LOOK_AGAIN_S = 10.0  # a listener not found is looked for again after this long


@dataclass(frozen=True)
class MeasureSpec:
    """The measuring flags of ladder and sweep (``--vram-source``, ``--gpu``, ``--compare`` …)."""

    vram_source: SourceChoice = "auto"
    gpus: tuple[str, ...] | None = None
    gpu_metrics_url: str | None = None
    server_pid: int | None = None
    compare: Path | None = None
    baseline: tuple[TierRow, ...] | None = None  # --compare's rows, read up front
    tolerance: float = 0.2
    save_baseline: bool = False
    gpu_price_per_hour: float | None = None  # None: [cost] gpu_price_per_hour (SPEC §13)

    def __post_init__(self) -> None:
        if (self.compare is None) != (self.baseline is None):  # a caller's mistake, not a user's
            raise ValueError("--compare's path and its rows go together (cli.flags.measure_spec)")

    def devices(self, cfg: Config) -> Sequence[str] | None:
        """``--gpu``, else the managed server's CUDA_VISIBLE_DEVICES (a MIG instance) when it
        is the target, else all."""
        return list(self.gpus) if self.gpus else managed_server_devices(cfg)


@dataclass(frozen=True)
class TierSpec:
    """The flags ladder and sweep share, checked (a mistake is exit 2 before anything is sent)."""

    measure: MeasureSpec = field(default_factory=MeasureSpec)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    pool: TaskPool | None = None  # --tasks, read and checked before the run starts
    streaming: bool = True  # False: --no-stream
    slo: SloConfig | None = None  # --slo NAME:S … over [slo], parsed; None: [slo] as it is
    workers: int | None = 1  # --workers: processes that send the load (None: auto; 1: this one)
    conservative: bool = False  # --conservative: take the smaller setting when noise leaves doubt


def preflight(spec: MeasureSpec) -> None:
    """Mistakes found before anything is sent (exit 2)."""
    check_price(spec.gpu_price_per_hour)
    if not 0 <= spec.tolerance <= 100:  # NaN and inf fail this too
        raise UsageError(f"--tolerance must be in [0, 100], got {spec.tolerance}")
    if spec.vram_source == "nvml" and NvmlSampler.open(list(spec.gpus or ())) is None:
        # asked for by name: measuring nothing would silently switch the VRAM rule off
        raise UsageError(
            "--vram-source nvml: NVML is not available here (no NVIDIA driver, or no GPU)",
            "Use --vram-source auto (measures what it can and says what it could not).",
        )


def start_monitor(
    spec: MeasureSpec, ctx: StageContext, devices: Sequence[str] | None
) -> VramMonitor:
    """NVML and the server's /metrics (and a DCGM URL) as the spec asks, on ``devices``; started."""
    client, url = ctx.client, spec.gpu_metrics_url
    endpoints = [
        MetricsEndpoint(
            "the server's /metrics",
            redact_url(client.server_root + "/metrics"),
            lambda: client.get_text("/metrics"),
        )
    ]
    if url:
        gpu_url: str = url
        endpoints.append(
            MetricsEndpoint(
                "--gpu-metrics-url",
                redact_url(url),
                lambda: client.get_text(gpu_url),
                explicit=True,
            )
        )
    sources = open_sources(spec.vram_source, endpoints, devices=devices)
    if spec.vram_source == "metrics" and all(s.source == "none" for s in sources.samplers):
        tried = "; ".join(p.text() for p in sources.problems)
        raise UsageError(
            "--vram-source metrics: no usable memory or KV-cache figure"
            + (f" ({tried})" if tried else " in the server's /metrics"),
            "Use --vram-source auto (measures what it can, says what it could not).",
        )
    energy = energy_reader(sources.samplers, devices)
    monitor = VramMonitor(
        sources.samplers,
        ctx.config.ladder.sample_interval_s,
        server_kind=ctx.server_kind,
        problems=sources.problems,
        energy=energy,
        price_per_hour=spec.gpu_price_per_hour
        if spec.gpu_price_per_hour is not None
        else ctx.config.cost.gpu_price_per_hour,
    )
    return monitor.start()


@dataclass(frozen=True)
class Measuring:
    """What watches a ladder or sweep while it runs: VRAM, calibrate's own load, incidents,
    and the rest of the machine (SPEC §5.14)."""

    monitor: VramMonitor
    selfload: SelfLoadMonitor
    incidents: IncidentRecorder
    noise: NoiseMeter | None = None
    server_pids: Callable[[], Iterable[int]] = tuple  # the server's processes, found afresh


@dataclass(frozen=True)
class ClientMark:
    """Where the self-checks' windows (this process's) and runs (the workers') so far end."""

    own: int = 0
    workers: int = 0


def client_mark(selfload: SelfLoadMonitor | None, sender: Sender) -> ClientMark:
    """A mark before a tier or level: ``client_bound_since`` looks only after it."""
    return ClientMark(selfload.mark() if selfload is not None else 0, sender.workers_mark())


def client_bound_since(selfload: SelfLoadMonitor | None, sender: Sender, mark: ClientMark) -> str:
    """Whether calibrate itself was the limit after ``mark`` (SPEC §5.14, §12), one rule for the
    ladder's tiers and the sweep's levels: why — this process, a worker process, or all of them
    on the machine's cores (``load.procs.selfcheck``) — or "" when it kept up (no self-check:
    nothing is known). A reading so taken is marked, never a server's boundary."""
    if selfload is None:
        return ""
    return selfload.bound_since(mark.own) or sender.workers_bound_since(mark.workers)


def server_finder(
    server_pid: int | None,
    ctx: StageContext,
    reader: ProcReader,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[], list[int]]:
    """The server's processes on this machine, asked for again each time: the one calibrate
    manages, ``--server-pid``, or whatever listens on the target's port of this machine.

    The listener is found once and re-checked by the reader (cheap: ``LinuxProc.listening``
    keeps it while it holds the port; a restarted server's new processes are found); none found
    is looked for again after ``LOOK_AGAIN_S``, not on every call: finding none reads, where
    sock_diag is refused, the whole socket table and, where the server runs as another user
    (Ollama's service does), every process's open files — calibrate's own load on the machine
    it measures, once a window."""
    target = urlsplit(ctx.config.target.base_url)
    local = (target.hostname or "") in LOOPBACK
    port = target.port or (443 if target.scheme == "https" else 80)

    listeners: list[int] = []
    looked_at_s: list[float] = []  # when none was found, last

    def server_pids() -> list[int]:
        found = [server_pid] if server_pid else []
        record = managed_target(ctx.config)  # the managed server, if it is the target
        if record is not None:
            found.append(record.pid)
        if found or not local:
            return found
        if not listeners and looked_at_s and clock() - looked_at_s[0] < LOOK_AGAIN_S:
            return []
        listeners[:] = reader.listening(port)
        looked_at_s[:] = [] if listeners else [clock()]
        return list(listeners)

    return server_pids


def server_cpu_of(server_pid: int | None, ctx: StageContext) -> Callable[[], float | None]:
    """The CPU seconds the target's server processes on this machine have used so far
    (``SelfLoadMonitor``'s ``server_cpu``: threads late while the server holds the cores are
    not the client's limit), found as ``server_finder`` finds them."""
    reader = LinuxProc()
    return server_cpu(reader, server_finder(server_pid, ctx, reader))


def noise_meter(server_pid: int | None, ctx: StageContext, selfload: SelfLoadMonitor) -> NoiseMeter:
    """The machine's noise, less calibrate's own processes and the server's (``server_finder``),
    with ``selfload``'s lateness as the client's scheduling delay."""
    reader = LinuxProc()
    pids = server_finder(server_pid, ctx, reader)
    return NoiseMeter(reader, server_pids=pids, lag=(selfload.mark, selfload.lag_since))


@contextmanager
def measuring(spec: MeasureSpec, ctx: StageContext) -> Iterator[Measuring]:
    """Start the samplers for the run; stop them and close the client however it ends."""
    devices = spec.devices(ctx.config)  # the managed server's own: read once
    monitor = start_monitor(spec, ctx, devices)
    reader = LinuxProc()
    server_pids = server_finder(spec.server_pid, ctx, reader)
    selfload = SelfLoadMonitor(server_cpu=server_cpu(reader, server_pids)).start()
    noise = NoiseMeter(reader, server_pids=server_pids, lag=(selfload.mark, selfload.lag_since))
    incidents = IncidentRecorder(
        ctx.run,
        ctx.client.redacted_headers(),
        monitor,
        runs_dir=ctx.config.runs_dir,
        server_pid=spec.server_pid,
        devices=devices,
        targets=lambda record: is_target(ctx.config, record),
    )
    try:
        yield Measuring(monitor, selfload, incidents, noise, server_pids)
    finally:
        monitor.stop()
        selfload.stop()
        ctx.client.close()
