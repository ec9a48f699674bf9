"""Fakes for ladder and sweep logic in milliseconds: scripted senders, a fake KV source, a
simulated server behind a closed loop on a fake clock. No HTTP, no real time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from calibrate.config import Config
from calibrate.errors import ErrorInfo, RequestError
from calibrate.gpu.noise import CpuTimes, NoiseMeter, ProcessCpu
from calibrate.gpu.nvml import GpuSnapshot
from calibrate.gpu.reading import VramReading
from calibrate.gpu.vram import VramMonitor
from calibrate.http.client import OpenAIClient
from calibrate.http.models import Choice, Completion, Usage
from calibrate.io.store import RunDir
from calibrate.load.items import ItemResult
from calibrate.load.request import Request
from calibrate.load.sender import Sender
from calibrate.load.sim.clock import VirtualClock
from calibrate.load.sim.server import SimServer
from calibrate.load.transport import Exchange
from calibrate.load.window import LevelWindow, LoopRun
from calibrate.mock import MockSettings
from calibrate.stages.context import StageContext
from calibrate.stages.measure.incidents import IncidentRecorder
from calibrate.stages.measure.tiers import Stats
from calibrate.state.ledger import Ledger, target_fingerprint

# (batch, requests in the wave) -> (per-request latency s, wave wall s, error kind or None)
Script = Callable[[int, int], tuple[float, float, str | None]]


def item(request: Request, latency_s: float, started_s: float, kind: str | None) -> ItemResult:
    """The answer (or the failure) of a chat request, with scripted timings."""
    error = ErrorInfo(kind, f"HTTP 500: {kind}", 500) if kind else None
    return ItemResult(
        index=request.first_index,
        prompt=request.prompts[0],
        path=request.path,
        body=request.body,
        text=None if error else "答案。",
        finish_reason=None if error else "stop",
        usage=None if error else Usage(10, 5, 15),
        completion_tokens=0 if error else 5,
        elapsed_s=latency_s,
        ttft_s=None if error or not request.body.get("stream") else latency_s / 4,
        started_s=started_s,
        done_s=started_s + latency_s,
        error=error,
    )


class ScriptedSender(Sender):
    """Answers every wave at once with scripted timings; records what it was asked."""

    def __init__(self, script: Script) -> None:
        clock = VirtualClock()
        super().__init__(SimServer(MockSettings(any_model=True), clock), clock)
        self.script = script
        self.calls: list[tuple[int, int]] = []  # (requests, workers)
        self.bodies: list[dict[str, object]] = []

    def send(
        self, requests: Sequence[Request], workers: int, max_tokens: int | None = None
    ) -> tuple[list[ItemResult], float]:
        self.calls.append((len(requests), workers))
        self.bodies += [r.body for r in requests]
        latency, wall, kind = self.script(len(requests), len(requests))
        return [item(r, latency, 0.0, kind) for r in requests], wall


# (concurrency, repeat) -> seconds one request takes; the server below queues beyond its slots
Service = Callable[[int, int], float]


class SimulatedLoop(Sender):
    """The real engine and closed-loop policy against the simulated server (``load.sim``) with
    ``slots`` decode slots, on a virtual clock.

    Each request takes ``service(C, repeat)`` once it holds a slot, its first token a quarter of
    that in (the server restarted with that speed before each run); more than ``slots`` in
    flight queue, first come first served.
    At ``fail_at`` every request is out of memory (the mock's ``oom_at``).
    """

    def __init__(self, service: Service, slots: int = 4, fail_at: int | None = None) -> None:
        clock = VirtualClock()
        self.server = SimServer(_speed(slots, 0.0), clock)
        super().__init__(self.server, clock)
        self.service = service
        self.slots = slots
        self.fail_at = fail_at
        self.runs: list[tuple[int, LevelWindow, LoopRun]] = []
        self._repeat: dict[int, int] = {}

    def closed_loop(
        self,
        supply: Callable[[], Request],
        concurrency: int,
        window: LevelWindow,
        max_tokens: int | None = None,
    ) -> LoopRun:
        repeat = self._repeat[concurrency] = self._repeat.get(concurrency, 0) + 1
        cost = self.service(concurrency, repeat)
        self.server.restart(_speed(self.slots, cost, oom=concurrency == self.fail_at))
        run = super().closed_loop(supply, concurrency, window, max_tokens)
        self.runs.append((concurrency, window, run))
        return run


def chat_body(prompt: str, *, stream: bool = False) -> dict[str, object]:
    """A chat request's body the simulated server answers (any model, room for its answer)."""
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1024}
    return {**body, "stream": True} if stream else body


def _speed(slots: int, seconds: float, *, oom: bool = False) -> MockSettings:
    """A server whose every request takes ``seconds`` once it holds one of ``slots``: its
    first token a quarter of the way in, then three more."""
    return MockSettings(
        slots=slots,
        ttft_s=seconds / 4,
        per_token_s=seconds / 4,
        answer_tokens=3,
        any_model=True,
        oom_at=0 if oom else None,
    )


class Scripted:
    """Answers request n ``answer_s`` virtual seconds after it was sent with ``script[n]`` (a
    failure, a completion, or ``None``: never); counts the most ever in flight."""

    timeout_s = 30.0

    def __init__(self, answer_s: float = 0.01, script: dict[int, Any] | None = None) -> None:
        self.answer_s, self.script = answer_s, script or {}
        self.in_flight = self.most = 0
        self.sent: list[int] = []

    async def send(self, request: Request) -> Exchange:
        number = request.first_index
        self.sent.append(number)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            outcome = self.script.get(number, scripted_answer())
            if isinstance(outcome, Exception) and not isinstance(outcome, RequestError):
                raise outcome  # a transport's own bug
            await asyncio.sleep(self.answer_s if outcome is not None else 10**6)
        finally:
            self.in_flight -= 1
        if isinstance(outcome, RequestError):
            return Exchange(None, outcome)
        return Exchange(outcome)


def scripted_answer(finish: str = "stop", tokens: int = 5) -> Completion:
    return Completion((Choice(0, "答案。", finish),), Usage(3, tokens, 3 + tokens), "m", None, 0.01)


REFUSED = RequestError(ErrorInfo("overloaded", "429 too many requests"))


@dataclass
class FakeKv:
    """A metrics-like source whose KV usage is set by the test before each tier."""

    usage: float = 0.1
    source: str = "metrics"

    def read(self) -> VramReading:
        return VramReading("metrics", kv_usage=self.usage, preallocated=True)

    def close(self) -> None:
        pass


_OPEN: list[RunDir] = []


@pytest.fixture(autouse=True)
def close_runs() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def open_run(runs: Path, stage: str, run_id: str | None = None) -> RunDir:
    """A run folder that ``close_runs`` closes after the test."""
    run = RunDir(runs, stage, run_id=run_id)
    _OPEN.append(run)
    return run


def stage_ctx(tmp_path: Path, cfg: Config, stage: str) -> StageContext:
    runs = tmp_path / "runs"
    client = OpenAIClient("http://127.0.0.1:9/v1")  # builds bodies only; nothing is sent
    run = open_run(runs, stage)
    return StageContext(cfg, client, run, Ledger(runs), target_fingerprint(cfg), cfg.server.kind)


def recorder(ctx: StageContext, monitor: VramMonitor, tmp_path: Path) -> IncidentRecorder:
    return IncidentRecorder(
        ctx.run,
        {},
        monitor,
        runs_dir=tmp_path / "runs",
        snapshot=lambda devices: GpuSnapshot((), ()),
    )


# a clean tier's stats (batch 2, 0.2 s an item, no errors): the stop rules' tests vary it
CLEAN = Stats(
    batch_size=2,
    concurrency=1,
    round=None,
    items=4,
    waves=1,
    total_s=0.8,
    per_item_s=0.2,
    latency_mean_s=0.2,
    latency_p50_s=0.2,
    latency_p90_s=0.2,
    latency_p99_s=0.2,
    latency_max_s=0.2,
    ttft_p50_s=None,
    ttft_p99_s=None,
    tpot_p50_s=None,
    tpot_p99_s=None,
    items_per_s=4.0,
    output_tokens_per_s=100.0,
    peak_vram_mib=1000.0,
    vram_idle_mib=900.0,
    vram_total_mib=2000.0,
    pressure=0.5,
    pressure_source="nvml",
    peak_kv_usage=None,
    errors=0,
    error_kinds={},
    first_done_s=0.2,
    last_done_s=0.2,
    baseline_match=4,
    baseline_items=4,
)


@dataclass
class FakeProc:
    """A ``ProcReader`` whose machine and processes a test scripts: each read of the machine
    advances it by ``busy_per_read`` core-seconds of busy time (and ``steal_per_read``) over
    ``wall_per_read`` seconds on every core; ``ours`` / ``server`` processes use their share."""

    cores: int = 2
    busy_per_read: float = 3.2  # core-seconds busy per reading (e.g. 1.6 cores over 2 s)
    steal_per_read: float = 0.0
    wall_per_read: float = 2.0
    ours_per_read: float = 0.0  # CPU s of calibrate's own process per reading
    server_per_read: float = 0.0  # CPU s of the server's process per reading
    own_pid: int = 100
    server_pid: int = 200
    reads: int = 0

    def cpu_times(self) -> CpuTimes:
        self.reads += 1
        n = self.reads
        busy = n * (self.busy_per_read + self.ours_per_read + self.server_per_read)
        steal = n * self.steal_per_read
        return CpuTimes(busy, steal, n * self.wall_per_read * self.cores, self.cores)

    def processes(self) -> list[ProcessCpu]:
        n = self.reads
        return [
            ProcessCpu(1, 0, 0.0),
            ProcessCpu(self.own_pid, 1, n * self.ours_per_read),
            ProcessCpu(self.server_pid, 1, n * self.server_per_read * 0.5),
            ProcessCpu(self.server_pid + 1, self.server_pid, n * self.server_per_read * 0.5),
        ]

    def listening(self, port: int) -> list[int]:
        return [self.server_pid]


def fake_meter(proc: FakeProc) -> NoiseMeter:
    """A noise meter over ``proc``, its clock one reading's wall time per mark or look."""
    ticks = iter(range(1, 1_000_000))
    return NoiseMeter(
        proc,
        clock=lambda: next(ticks) * proc.wall_per_read,
        own_pid=proc.own_pid,
        server_pids=lambda: [proc.server_pid],
        reaped=lambda: 0.0,
    )


def simulated_sender(**settings: Any) -> Sender:
    """The real engine over the simulated server (``load.sim``) with these ``MockSettings``
    (any model), on its own virtual clock: closed and open loops, no HTTP, no real time."""
    clock = VirtualClock()
    return Sender(SimServer(MockSettings(any_model=True, **settings), clock), clock)
