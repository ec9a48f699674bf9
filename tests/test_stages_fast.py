"""Ladder and sweep logic in milliseconds: a scripted sender and a fake VRAM source, no HTTP.

The stop rules run at their real defaults here (the end-to-end tests over HTTP keep the latency
rule out of the way because ms-scale timings jitter on a loaded machine; these do not jitter).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from calibrate.client import OpenAIClient
from calibrate.config import Config, LadderConfig, SweepConfig
from calibrate.errors import ErrorInfo
from calibrate.gpu import GpuSnapshot, VramReading
from calibrate.ledger import Ledger, target_fingerprint
from calibrate.records import Usage
from calibrate.stages.context import StageContext
from calibrate.stages.incidents import IncidentRecorder
from calibrate.stages.ladder import Ladder, LadderOptions
from calibrate.stages.sweep import Sweep, SweepOptions
from calibrate.stages.tiers import ItemResult
from calibrate.stages.waves import Request, Sender
from calibrate.store import RunDir
from calibrate.vram import VramMonitor

# (batch or concurrency, requests in the call) -> (per-request latency s, wall s, error kind or None)
Script = Callable[[int, int], tuple[float, float, str | None]]


class ScriptedSender(Sender):
    """Answers every request at once with scripted timings; records what it was asked."""

    def __init__(self, script: Script, size_of: Callable[[Sequence[Request], int], int]) -> None:
        self.script, self.size_of = script, size_of
        self.calls: list[tuple[int, int]] = []  # (requests, workers)

    def send(
        self, requests: Sequence[Request], workers: int, max_tokens: int | None = None
    ) -> tuple[list[ItemResult], float]:
        self.calls.append((len(requests), workers))
        latency, wall, kind = self.script(self.size_of(requests, workers), len(requests))
        error = ErrorInfo(kind, f"HTTP 500: {kind}", 500) if kind else None
        items = [
            ItemResult(
                index=r.first_index,
                prompt=r.prompts[0],
                path=r.path,
                body=r.body,
                text=None if error else "答案。",
                finish_reason=None if error else "stop",
                usage=None if error else Usage(10, 5, 15),
                completion_tokens=0 if error else 5,
                elapsed_s=latency,
                ttft_s=None,
                started_s=0.0,
                done_s=latency,
                error=error,
            )
            for r in requests
        ]
        return items, wall


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
def _close_runs() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def _ctx(tmp_path: Path, cfg: Config, stage: str) -> StageContext:
    runs = tmp_path / "runs"
    client = OpenAIClient("http://127.0.0.1:9/v1")  # builds bodies only; nothing is sent
    run = RunDir(runs, stage)
    _OPEN.append(run)
    return StageContext(cfg, client, run, Ledger(runs), target_fingerprint(cfg))


def _ladder(tmp_path: Path, script: Script, kv: FakeKv | None = None, **ladder: object) -> Ladder:
    cfg = Config(ladder=replace(LadderConfig(), batch_sizes=(1, 2, 4, 8), **ladder))
    ctx = _ctx(tmp_path, cfg, "ladder")
    monitor = VramMonitor([kv] if kv else [])
    incidents = IncidentRecorder(
        ctx.run,
        {},
        monitor,
        runs_dir=tmp_path / "runs",
        snapshot=lambda devices: GpuSnapshot((), ()),
    )
    sender = ScriptedSender(script, lambda requests, workers: len(requests))
    return Ladder(ctx, LadderOptions.from_config(cfg), monitor, incidents, sender)


def test_flat_per_item_latency_passes_every_tier(tmp_path: Path) -> None:
    result = _ladder(tmp_path, lambda batch, n: (0.1, 0.1, None)).run()
    assert [t.verdict for t in result.tiers] == ["pass"] * 4
    assert result.stopped_by == "completed" and result.last_passing is not None
    assert result.summary().max_in_flight == 8


def test_latency_rule_at_its_default_stops_and_keeps_the_tier(tmp_path: Path) -> None:
    default = LadderConfig().latency_rise
    latencies = {1: 0.10, 2: 0.10, 4: 0.10, 8: 0.10 * (default + 0.2)}
    ladder = _ladder(tmp_path, lambda batch, n: (latencies[batch], latencies[batch], None))
    result = ladder.run()
    assert [t.verdict for t in result.tiers] == ["pass", "pass", "pass", "stop: latency"]
    assert result.stopped_by == "latency"
    assert result.last_passing is not None and result.last_passing.batch_size == 8
    assert f"limit {default:g}×" in result.tiers[-1].reason


def test_a_rise_just_under_the_default_is_not_a_stop(tmp_path: Path) -> None:
    default = LadderConfig().latency_rise
    latencies = {1: 0.10, 2: 0.10, 4: 0.10, 8: 0.10 * (default - 0.05)}
    result = _ladder(tmp_path, lambda batch, n: (latencies[batch], 0.1, None)).run()
    assert result.stopped_by == "completed"


def test_vram_pressure_at_the_limit_stops_above_the_tier(tmp_path: Path) -> None:
    kv = FakeKv()

    def script(batch: int, n: int) -> tuple[float, float, None]:
        kv.usage = {1: 0.2, 2: 0.4, 4: 0.95, 8: 0.99}[batch]
        return 0.1, 0.1, None

    result = _ladder(tmp_path, script, kv).run()
    assert [t.verdict for t in result.tiers] == ["pass", "pass", "stop: vram"]
    assert result.last_passing is not None and result.last_passing.batch_size == 4


def test_a_failing_tier_keeps_the_one_before_and_writes_incidents(tmp_path: Path) -> None:
    ladder = _ladder(tmp_path, lambda batch, n: (0.1, 0.1, "oom" if batch == 8 else None))
    result = ladder.run()
    assert [t.verdict for t in result.tiers] == ["pass", "pass", "pass", "fail"]
    assert result.last_passing is not None and result.last_passing.batch_size == 4
    assert result.summary().max_in_flight == 4
    assert len(result.tiers[-1].rounds) == 1, "a failed round ends the tier"
    assert len(list((ladder.ctx.run.path / "incidents").glob("8-1-*.json"))) == 8


def test_one_batch_at_a_time(tmp_path: Path) -> None:
    ladder = _ladder(tmp_path, lambda batch, n: (0.1, 0.1, None))
    ladder.run()
    sender = ladder.sender
    assert isinstance(sender, ScriptedSender)
    assert sender.calls == [(b, b) for b in (1, 2, 4, 8) for _ in range(2)]


def _sweep(tmp_path: Path, per_s: dict[int, float], errors_at: int | None = None) -> Sweep:
    cfg = Config(sweep=replace(SweepConfig(), concurrency=(1, 2, 4, 8), items=8))
    ctx = _ctx(tmp_path, cfg, "sweep")
    monitor = VramMonitor([])
    incidents = IncidentRecorder(
        ctx.run,
        {},
        monitor,
        runs_dir=tmp_path / "runs",
        snapshot=lambda devices: GpuSnapshot((), ()),
    )

    def script(conc: int, n: int) -> tuple[float, float, str | None]:
        return 0.1, n / per_s[conc], "oom" if conc == errors_at else None

    sender = ScriptedSender(script, lambda requests, workers: workers)
    return Sweep(ctx, SweepOptions.from_config(cfg, 4), monitor, incidents, sender)


def test_the_knee_is_where_throughput_stops_rising(tmp_path: Path) -> None:
    result = _sweep(tmp_path, {1: 10.0, 2: 19.0, 4: 37.0, 8: 38.0}).run()
    assert result.knee is not None and result.knee.concurrency == 4
    assert result.summary(SweepOptions.from_config(Config(), 4)).recommended_concurrency == 4


def test_a_failing_level_stops_the_sweep_with_its_reason(tmp_path: Path) -> None:
    result = _sweep(tmp_path, {1: 10.0, 2: 19.0, 4: 37.0, 8: 70.0}, errors_at=1).run()
    assert [lv.verdict for lv in result.levels] == ["fail"]
    assert result.knee is None and result.stopped_by == "failure"
    assert "concurrency 1 (the first level): 8 of 8 requests failed (oom×8)" in result.reason
