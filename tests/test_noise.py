"""The machine's own noise (SPEC §5.14): other processes' CPU (the machine's busy time less
calibrate's tree and the server's), steal, the client's scheduling delay — read through the
``ProcReader`` seam (a fake one here, and ``LinuxProc`` over a /proc written to a folder)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from calibrate.config import Config, SweepConfig
from calibrate.gpu.noise import LinuxProc, MachineNoise, NoiseMeter, combined, server_cpu, tree
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.gpu.vram import VramMonitor
from calibrate.stages.measure.tier_run import LOOK_AGAIN_S, server_finder
from calibrate.stages.sweep.run import Sweep
from calibrate.stages.sweep.spec import SweepOptions
from tests.stage_fakes import FakeProc, SimulatedLoop, close_runs, fake_meter, recorder, stage_ctx
from tests.tier_helpers import jsonl

__all__ = ["close_runs"]


def test_other_processes_are_the_busy_time_less_calibrate_and_the_server() -> None:
    """1.6 cores busy elsewhere, calibrate's own process at 0.75 and the server at 0.5 of a core:
    only the 1.6 are other processes'."""
    proc = FakeProc(busy_per_read=3.2, ours_per_read=1.5, server_per_read=1.0)
    meter = fake_meter(proc)
    noise = meter.since(meter.mark())
    assert noise is not None
    assert round(noise.others_cores, 6) == 1.6 and noise.cores == 2
    assert noise.causes() == ["other processes used 1.6 of this machine's 2 cores"]
    calm = fake_meter(FakeProc(busy_per_read=0.2, ours_per_read=1.5, server_per_read=1.5))
    quiet = calm.since(calm.mark())
    assert quiet is not None and quiet.causes() == [] and not quiet.busy


def test_steal_and_a_starved_client_are_named() -> None:
    proc = FakeProc(busy_per_read=0.0, steal_per_read=0.4)
    lag = SelfLoadMonitor()
    meter = NoiseMeter(
        proc,
        clock=iter(range(2, 100, 2)).__next__,
        own_pid=proc.own_pid,
        lag=(lag.mark, lag.lag_since),
        reaped=lambda: 0.0,
    )
    mark = meter.mark()
    lag.observe(1.0, 0.1, 0.030)
    lag.observe(1.0, 0.1, 0.010)
    noise = meter.since(mark)
    assert noise is not None and round(noise.steal_share, 3) == 0.1
    assert noise.causes() == [
        "the hypervisor took 10% of its CPU time (steal)",
        "calibrate's threads waited 20 ms on average to run",
    ]


def test_threads_late_while_the_server_holds_the_cores_are_not_the_clients_limit() -> None:
    """vLLM's CPU build beside calibrate on 2 cores: calibrate's threads ran 121 ms late while
    the server worked, and the ladder called batch 1 client-bound ("calibrate itself is the
    bottleneck … --workers 2") and then exited 0 with no setting. The server holding the cores is
    the server's limit on this machine; calibrate's own CPU near a core is still the client's."""
    proc = FakeProc(server_per_read=1.8)
    read = server_cpu(proc, lambda: [proc.server_pid])
    first = read()
    proc.reads += 1
    second = read()
    assert first is not None and second is not None and round(second - first, 6) == 1.8
    assert server_cpu(proc, lambda: [])() is None  # no server on this machine: unknown
    assert server_cpu(proc, lambda: [proc.own_pid], own_pid=proc.own_pid)() is None

    def windows(own: float, server: float | None) -> SelfLoadMonitor:
        monitor = SelfLoadMonitor(cpu_limit=0.85, lag_limit_s=0.015, confirm=2, cores=2)
        for _ in range(3):
            monitor.observe(1.0, own, 0.121, server)
        return monitor

    working = windows(0.2, 1.8)
    assert working.bound_since(0) == "" and working.poll_warning() is None
    for server in (0.1, None):  # the server idle, or not on this machine: the client's lateness
        late = windows(0.2, server)
        assert late.bound_since(0) == "calibrate's threads waited 121 ms on average to run"
        assert late.poll_warning() is not None
    assert "0.95 CPU cores" in windows(0.95, 1.8).bound_since(0)


def test_windows_add_up_and_never_claim_more_cores_than_there_are() -> None:
    a = MachineNoise(2.0, 2, 3.0, 0.0, 4.0, 0.010)
    b = MachineNoise(6.0, 2, 1.0, 0.0, 12.0, 0.002)
    both = combined([a, None, b])
    assert both is not None and both.wall_s == 8.0 and both.others_cores == 0.5
    assert both.client_lag_s is not None and round(both.client_lag_s, 6) == 0.004
    assert MachineNoise(1.0, 2, 2.3, 0.0, 2.0).others_cores == 2  # read a moment apart


def test_the_server_and_calibrate_are_whole_process_trees() -> None:
    proc = FakeProc()
    found = tree(proc.processes(), [proc.server_pid])
    assert found == {proc.server_pid, proc.server_pid + 1}


def test_linux_proc_reads_stat_processes_and_the_listener(tmp_path: Path) -> None:
    """/proc/stat's first line (user nice system idle iowait irq softirq steal, in ticks), each
    process's parent and CPU, and the process holding the listening socket of a port."""
    root = tmp_path / "proc"
    (root / "net").mkdir(parents=True)
    (root / "stat").write_text(
        "cpu  100 0 50 800 10 5 5 30 0 0\ncpu0 50 0 25 400 5 2 3 15\ncpu1 50 0 25 400 5 3 2 15\n"
    )
    for pid, ppid, ticks in ((1, 0, 3), (42, 1, 120)):
        (root / str(pid) / "fd").mkdir(parents=True)
        fields = ["S", str(ppid)] + ["0"] * 9 + [str(ticks), "7"]
        (root / str(pid) / "stat").write_text(f"{pid} (py (x)) {' '.join(fields)}\n")
    (root / "42" / "fd" / "3").symlink_to("socket:[777]")
    (root / "net" / "tcp").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 777\n"
    )
    proc = LinuxProc(root)
    times = proc.cpu_times()
    assert times is not None and times.cores == 2
    assert times.busy_s == 160 * proc.tick_s and times.steal_s == 30 * proc.tick_s
    assert times.total_s == 1000 * proc.tick_s
    assert {(p.pid, p.ppid, round(p.cpu_s / proc.tick_s)) for p in proc.processes()} == {
        (1, 0, 10),
        (42, 1, 127),
    }
    assert proc.listening(8080) == [42] and proc.listening(8081) == []
    assert LinuxProc(tmp_path / "none").cpu_times() is None  # no /proc: nothing is claimed


def test_the_process_scan_reads_odd_names_and_passes_over_what_it_cannot_read(
    tmp_path: Path,
) -> None:
    """A name with parentheses and numbers in it, a process gone between the listing and the
    read (no stat), a short stat, and a folder that is no process: the figures are those of
    the readable processes, as before the scan read each stat in one call."""
    root = tmp_path / "proc"
    for pid, line in (
        (5, "5 (a) S 9 (b) S 1 " + "0 " * 9 + "40 2 0"),
        (6, "6 (short) S 1 0"),
    ):
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "stat").write_text(line + "\n")
    (root / "7").mkdir()  # gone before its stat was read
    (root / "self").mkdir()
    proc = LinuxProc(root)
    assert [(p.pid, p.ppid, p.cpu_s) for p in proc.processes()] == [(5, 1, 42 * proc.tick_s)]


def test_a_sweep_records_the_noise_per_run_and_level_and_names_it(tmp_path: Path) -> None:
    """On the simulated 4-slot server with other processes at 1.6 of 2 cores: every line of
    rounds.jsonl and tiers.jsonl carries the figures, and the verdict names the machine."""
    speed_8 = [1.12, 1.30, 0.97, 1.12, 0.98, 1.10]
    runs_at = {4: [0.1, 0.095, 0.105], 8: [0.1 / x for x in speed_8]}

    def service(concurrency: int, repeat: int) -> float:
        runs = runs_at.get(concurrency, [0.1])
        return runs[(repeat - 1) % len(runs)]

    cfg = Config(sweep=replace(SweepConfig(), concurrency=(1, 2, 4, 8), level_s=1.0))
    ctx = stage_ctx(tmp_path, cfg, "sweep")
    monitor = VramMonitor([])
    sweep = Sweep(
        ctx,
        SweepOptions.from_config(cfg, 4),
        monitor,
        recorder(ctx, monitor, tmp_path),
        SimulatedLoop(service),
        noise=fake_meter(FakeProc(busy_per_read=3.2, ours_per_read=1.0)),
    )
    result = sweep.run()
    rounds = jsonl(ctx.run.path / "rounds.jsonl")
    assert {r["noise_other_cpu_cores"] for r in rounds} == {1.6}
    assert all(r["noise_cores"] == 2 for r in jsonl(ctx.run.path / "tiers.jsonl"))
    assert not result.passed
    assert result.inconclusive.endswith(
        "— other processes used 1.6 of this machine's 2 cores during the sweep"
    ), result.inconclusive
    assert result.what_to_do.startswith("run it again when the other jobs have stopped")
    summary = result.summary(sweep.options).to_json()
    assert summary["noise"]["causes"] == ["other processes used 1.6 of this machine's 2 cores"]
    assert summary["recommended_concurrency"] is None


class _Listeners(FakeProc):
    """A machine where ``found`` listens on the target's port, once it does; counts the looks."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[int] = []
        self.looks = 0

    def listening(self, port: int) -> list[int]:
        self.looks += 1
        return list(self.found)


def test_a_server_not_found_listening_is_looked_for_again_only_after_a_while(
    tmp_path: Path,
) -> None:
    """Finding no listener reads, where sock_diag is refused, the machine's whole socket table
    and, where the server runs as another user (Ollama's service does), every process's open
    files: calibrate's own load on the machine it measures. Looked for on every window's read
    before; now again only after LOOK_AGAIN_S. A listener found is asked after each time (the
    reader re-checks it cheaply, ``LinuxProc.listening``): a restarted server's new process is
    the server at once, even while the old one lives on."""
    cfg = replace(Config(), paths=replace(Config().paths, runs=str(tmp_path / "runs")))
    machine, now = _Listeners(), [0.0]
    pids = server_finder(None, stage_ctx(tmp_path, cfg, "ladder"), machine, lambda: now[0])
    assert [pids() for _ in range(5)] == [[]] * 5 and machine.looks == 1
    machine.found = [77]
    now[0] = LOOK_AGAIN_S - 0.1
    assert pids() == [] and machine.looks == 1  # not yet
    now[0] = LOOK_AGAIN_S
    assert [pids() for _ in range(5)] == [[77]] * 5 and machine.looks == 6  # found, re-checked
    machine.found = [78]  # restarted: its old process may live on, holding nothing
    assert pids() == [78]
