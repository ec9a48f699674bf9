"""What the parent and a worker process say to each other, over the load engine's ``Channel``
(length-prefixed pickles on a pipe, ``calibrate.load.procs.channel``). A frame cut short (the
writer was killed mid-write) reads as the end of the stream: nothing in it is used, and its
items run again.
"""

from __future__ import annotations

from dataclasses import dataclass

from calibrate.gpu.selfload import SelfLoadReport
from calibrate.load.procs.channel import Channel, Outbox
from calibrate.load.procs.recipe import ClientRecipe
from calibrate.stages.batch.outage import OutagePolicy
from calibrate.stages.batch.plan import BatchSpec
from calibrate.state.setting import Endpoint

__all__ = ["Channel", "ClientRecipe", "LaneStats", "WorkerDone", "WorkerSetup"]


@dataclass(frozen=True)
class WorkerSetup:
    """The first message to a worker: its share of each endpoint's slots and the run's spec."""

    index: int
    endpoints: tuple[Endpoint, ...]  # its own share: concurrency already split
    client: ClientRecipe  # how it builds its clients
    spec: BatchSpec
    outage: OutagePolicy
    advice: str  # the self-check's advice when this worker is the bottleneck
    cpu_limit: float = 0.85  # the self-check's threshold (a test sets 0: every window is bound)
    answered: bool = False  # a server answered already (the endpoints' check, another worker)

    def serve(self, inbox: Channel, outbox: Outbox) -> None:
        """What the worker process runs (``load.procs.proc.Job``): child.py's ``run_worker``."""
        from calibrate.stages.batch.procs.child import run_worker  # the child's side only

        run_worker(self, inbox, outbox)


@dataclass(frozen=True)
class LaneStats:
    """What one worker's breaker saw of one endpoint (merged into the summary)."""

    label: str
    state: str
    incidents: int
    down_total_s: float
    restarts: int


@dataclass(frozen=True)
class WorkerDone:
    """A worker's last message: every item it took has been answered or left."""

    selfload: SelfLoadReport
    lanes: tuple[LaneStats, ...]
