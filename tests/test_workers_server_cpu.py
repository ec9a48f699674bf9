"""``--workers N`` of the sweep, the ladder and batch: each worker process judges its own late threads on
the parent's rule (SPEC §5.14). A CPU-built server beside calibrate on 2 cores holds the cores,
so every calibrate thread wakes late: that is the server's limit, and a worker that called itself
"calibrate itself is the bottleneck" then would be wrong. The parent tells each worker the
server's processes (its setup, and again before a run when they changed); the worker's
self-check reads their CPU. Its own CPU near a core is still the client's limit.

The worker's self-check runs its real sampling thread here, on a virtual clock and a scripted
``/proc``; the telling runs real worker processes against the mock.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from calibrate.gpu.proc import CpuTimes, ProcessCpu
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.http.client import OpenAIClient
from calibrate.http.models import SamplingParams
from calibrate.load.procs import sender as procs_sender
from calibrate.load.procs.pool import WorkerPool
from calibrate.load.procs.recipe import ClientRecipe, server_pids_of
from calibrate.load.procs.selfcheck import worker_check
from calibrate.load.procs.sender import WorkerSender
from calibrate.load.request import build_requests
from calibrate.load.window import LevelWindow
from calibrate.stages.batch.sending import workers as procs_run
from calibrate.stages.batch.sending.worker import WorkerSetup
from tests.batch_helpers import write_tasks
from tests.helpers import write_config
from tests.mockserver import MockProcess, start_mock
from tests.tier_helpers import FAST, open_gate

SERVER = 4242
STEP_S = 0.122  # each reading of the virtual clock: 121 ms late per 1 ms tick
WINDOW_S = 3 * STEP_S  # a tick reads the clock three times: one window per tick


class Machine:
    """2 cores, a server at ``SERVER`` (and its child) using ``server_cores`` while this worker
    uses ``own_cores``; time moves only when the worker's clock is read."""

    cores = 2

    def __init__(self, server_cores: float, own_cores: float) -> None:
        self.server_cores, self.own_cores = server_cores, own_cores
        self.now_s = 0.0
        self.server_s = 0.0
        self._lock = threading.Lock()

    def clock(self) -> float:
        with self._lock:
            self.now_s += STEP_S
            return self.now_s

    def cpu_clock(self) -> float:  # read once a window
        return self.now_s * self.own_cores

    def cpu_times(self) -> CpuTimes | None:
        return None

    def processes(self) -> Sequence[ProcessCpu]:  # read once a window, at its end
        server_s = self.now_s * self.server_cores
        return [
            ProcessCpu(1, 0, 0.0),
            ProcessCpu(SERVER, 1, server_s / 2),
            ProcessCpu(SERVER + 1, SERVER, server_s / 2),  # its engine core, say
        ]

    def listening(self, port: int) -> Sequence[int]:
        return []


def _started(machine: Machine, server: list[tuple[int, ...]]) -> SelfLoadMonitor:
    return worker_check(
        "load worker process 1 of 2",
        lambda: server[0],  # as the worker holds what the parent last said
        machine,
        clock=machine.clock,
        cpu_clock=machine.cpu_clock,
        window_s=WINDOW_S - 0.01,
        tick_s=0.001,
        cores=machine.cores,
    ).start()


def _until(monitor: SelfLoadMonitor, windows: int) -> None:
    deadline = time.monotonic() + 60  # a bound, never the measure: windows come on the clock
    while monitor.report().windows < windows and time.monotonic() < deadline:
        time.sleep(0.01)
    assert monitor.report().windows >= windows


def _watched(machine: Machine, server: list[tuple[int, ...]]) -> SelfLoadMonitor:
    monitor = _started(machine, server)
    _until(monitor, 4)
    monitor.stop()
    return monitor


def test_a_worker_beside_a_server_that_holds_the_cores_is_not_the_bottleneck() -> None:
    """Its threads 121 ms late while the server uses 1.6 of 2 cores: not client-bound."""
    monitor = _watched(Machine(server_cores=1.6, own_cores=0.2), [(SERVER,)])
    assert monitor.report().lag_max_s > 0.1  # late it was
    assert monitor.bound_since(0) == ""
    assert monitor.poll_warning() is None and not monitor.report().bottleneck


def test_a_worker_whose_own_cpu_is_near_a_core_is_the_bottleneck_beside_any_server() -> None:
    monitor = _watched(Machine(server_cores=1.6, own_cores=0.97), [(SERVER,)])
    warning = monitor.poll_warning()
    assert warning is not None and "calibrate itself is the bottleneck" in warning
    assert "load worker process 1 of 2 used 0.97 CPU cores" in monitor.bound_since(0)


def test_a_worker_late_with_the_server_idle_or_unknown_is_the_bottleneck() -> None:
    for server, pids in ((0.1, [SERVER]), (1.6, [])):  # idle; or told of no server here
        monitor = _watched(Machine(server_cores=server, own_cores=0.2), [tuple(pids)])
        assert "the threads of load worker process 1 of 2 waited 121 ms on average" in (
            monitor.bound_since(0)
        )


def test_a_worker_told_of_a_restarted_server_reads_the_new_ones_cpu() -> None:
    """Told no server at its start, then the server's processes before a later run (a server
    restarted between runs has new PIDs): the windows after that are the server's limit."""
    machine, server = Machine(server_cores=1.6, own_cores=0.2), [()]
    monitor = _started(machine, server)
    try:
        _until(monitor, 2)
        assert monitor.bound_since(0) != ""  # no server known: its own lateness
        server[0] = (SERVER,)
        after = monitor.report().windows + 1  # the window under way may have begun before
        _until(monitor, after + 3)
        assert monitor.bound_since(after) == ""
    finally:
        monitor.stop()


def test_the_parent_tells_its_workers_the_servers_processes_never_its_own() -> None:
    """A mock serving from inside the parent is the parent's CPU, the client's: never told as
    the server's. The finder is asked when the workers start and again before every run."""
    own = os.getpid()
    assert server_pids_of([SERVER, own, SERVER, 0]) == (SERVER,)
    asked: list[int] = []

    def server_pids() -> list[int]:
        asked.append(1)
        return [own, SERVER] if len(asked) > 1 else [own]

    with start_mock(ttft_s=0.005, per_token_s=0.0005) as mock:
        client = OpenAIClient(mock.base_url)
        params = SamplingParams(0.0, 256, 1.0)
        made = iter(range(1_000_000))

        def supply() -> object:
            return build_requests(client, "internlm-s2", params, [[f"p{next(made)}"]], "wave")[0]

        recipe = ClientRecipe(mock.base_url, None, None, 30, 5, 64, 8)
        sender = WorkerSender(client, recipe, 2, server_pids)
        try:
            for _ in range(2):  # a worker that did not take its setup or word never answers
                run = sender.closed_loop(supply, 2, LevelWindow(0.1, 4), 256)  # type: ignore[arg-type]
                assert run.items and all(i.ok for i in run.items)
        finally:
            sender.close()
            client.close()
    assert len(asked) == 3  # at the start, then before each of the two runs


SWEEP = FAST + "[sweep]\nconcurrency = [2]\nlevel_s = 0.3\nrepeats = 1\n"


@pytest.mark.parametrize("command", ["sweep", "ladder"])
def test_the_sweeps_and_ladders_workers_are_told_the_server_on_the_targets_port(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """The server is found as the stage's own self-check finds it (here: the mock process that
    listens on the target's port), and every worker is told its PID."""
    told: list[tuple[int, ...]] = []

    class Told(WorkerPool):
        def tell_server(self) -> None:
            super().tell_server()
            told.append(self._told)

    monkeypatch.setattr(procs_sender, "WorkerPool", Told)
    with MockProcess("--ttft", "0.002", "--per-token", "0.0005", "--oom-at", "3") as mock:
        open_gate(isolated, mock.base_url, SWEEP, stage="ladder" if command == "sweep" else "repro")
        result = cli(command, "--json", "--workers", "2")  # the ladder: waves of 2, then OOM at 4
        assert result.code == 0, result.err
    assert told and set(told) == {(mock.pid,)}, told


def test_batchs_workers_are_told_the_server_on_the_targets_port(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``batch --workers 2``: each worker process's self-check reads the same server as the
    parent's (the mock process listening on the target's port), so its late threads beside a
    server that holds the cores are the server's limit there too."""
    told: list[tuple[int, ...]] = []

    class Told(procs_run.WorkerSet):
        def __init__(self, setups: Sequence[WorkerSetup], *args: object, **kw: object) -> None:
            told.extend(s.server_pids for s in setups)
            super().__init__(setups, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(procs_run, "WorkerSet", Told)
    tasks = write_tasks(isolated / "tasks.jsonl", 8)
    out = isolated / "out.jsonl"
    with MockProcess("--ttft", "0.002", "--per-token", "0.0005") as mock:
        write_config(isolated / "calibrate.toml", mock.base_url)
        result = cli("batch", "--input", str(tasks), "--out", str(out), "-c", "4", "--workers", "2")
        assert result.code == 0, result.err
    assert told == [(mock.pid,), (mock.pid,)], told
