"""The self-load monitor: when calibrate itself is the bottleneck, it says so (once)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from calibrate.config import Config
from calibrate.config.sections import TargetConfig
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.stages.measure.tier_run import server_cpu_of
from tests.fakes import free_port
from tests.mockserver import MockProcess
from tests.stage_fakes import close_runs, stage_ctx

__all__ = ["close_runs"]  # the autouse fixture, used by being imported


def test_cpu_near_one_core_for_two_windows_is_a_bottleneck() -> None:
    monitor = SelfLoadMonitor(cpu_limit=0.85, confirm=2)
    monitor.observe(1.0, 0.95, 0.001)
    assert monitor.poll_warning() is None  # one window can be a hiccup
    monitor.observe(1.0, 0.97, 0.001)
    warning = monitor.poll_warning()
    assert warning is not None and "calibrate itself is the bottleneck" in warning
    assert "0.97 CPU cores" in warning
    assert monitor.poll_warning() is None  # said once
    report = monitor.report()
    assert report.bottleneck and report.windows == 2 and report.cpu_fraction_max == 0.97


def test_the_warning_gives_the_advice_set_after_it_was_detected() -> None:
    """The monitor starts before the stage knows what to advise (one process, or the parent of
    --workers): a bottleneck found in between still carries the advice the stage then set."""
    monitor = SelfLoadMonitor(cpu_limit=0.85, confirm=1)
    monitor.observe(1.0, 0.97, 0.001)  # during the workload probe, say
    monitor.advice = "split the load over 2 processes with --workers 2"
    warning = monitor.poll_warning()
    assert warning is not None and "--workers 2" in warning and "lower -c" not in warning
    assert "--workers 2" in monitor.report().reason


def test_interrupted_streak_and_idle_client_are_not_a_bottleneck() -> None:
    monitor = SelfLoadMonitor(cpu_limit=0.85, lag_limit_s=0.015, confirm=2)
    for cpu in (0.9, 0.3, 0.9, 0.2, 0.1):
        monitor.observe(1.0, cpu, 0.001)
    assert monitor.poll_warning() is None and not monitor.report().bottleneck


def test_starved_timer_counts_as_waiting_on_the_client() -> None:
    monitor = SelfLoadMonitor(lag_limit_s=0.015, confirm=2)
    monitor.observe(1.0, 0.5, 0.040)
    monitor.observe(1.0, 0.5, 0.050)
    warning = monitor.poll_warning()
    assert warning is not None and "waited 50 ms" in warning


def test_the_thread_samples_a_busy_process() -> None:
    """The sampling thread, with a CPU clock that runs as fast as the wall clock (a process
    busy on one core whatever else the machine runs: a loaded CI box gave the real burn loop
    only 0.66 of a core): every window reads ~1 core and two in a row are a bottleneck."""
    monitor = SelfLoadMonitor(
        window_s=0.05, tick_s=0.005, cpu_limit=0.6, confirm=2, cpu_clock=time.perf_counter
    ).start()
    time.sleep(0.4)
    report = monitor.stop()
    assert report.windows >= 3
    assert report.bottleneck and report.cpu_fraction_max > 0.9


def test_windows_while_an_endpoint_is_down_never_make_a_bottleneck() -> None:
    """A batch in an outage sends nothing: the client's CPU or its late timer then says nothing
    about the server, and "calibrate itself is the bottleneck" would be wrong."""
    monitor = SelfLoadMonitor(cpu_limit=0.85, confirm=2)
    monitor.quiet("http://gpu:8000/v1", True)
    for _ in range(5):
        monitor.observe(1.0, 0.99, 0.0)
    assert not monitor.bottleneck and monitor.poll_warning() is None
    monitor.quiet("http://gpu:8000/v1", False)  # back up: the streak starts again
    monitor.observe(1.0, 0.99, 0.0)
    assert not monitor.bottleneck
    monitor.observe(1.0, 0.99, 0.0)
    assert monitor.bottleneck


def test_the_batch_knows_the_cpu_its_server_uses_beside_it(tmp_path: Path) -> None:
    """The ladder and sweep knew the server's CPU (late threads while it holds the cores are not
    calibrate's limit); batch did not, so a CPU-built vLLM beside a batch on 2 cores read as
    "calibrate itself is the bottleneck". Batch finds the server on the target's port the same
    way: a mock process listening there uses CPU seconds that are read; no server, unknown."""
    mock = MockProcess("--slots", "2")
    try:
        target = replace(TargetConfig(), base_url=mock.base_url)
        ctx = stage_ctx(tmp_path, Config(target=target), "batch")
        read = server_cpu_of(None, ctx)
        seen = read()
        assert seen is not None and seen > 0  # the mock's interpreter started: CPU used
    finally:
        mock.stop()
    nobody = replace(TargetConfig(), base_url=f"http://127.0.0.1:{free_port()}/v1")
    assert server_cpu_of(None, stage_ctx(tmp_path / "b", Config(target=nobody), "batch"))() is None
