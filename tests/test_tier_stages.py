"""The ladder and the sweep as stages, without argv or a terminal: ``stages.ladder.run(spec,
env)`` and ``stages.sweep.run(spec, env)`` against the real mock, watched by a recorder instead
of the command line's view."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from calibrate import config
from calibrate.config import SloConfig
from calibrate.io.tier_table import read_table
from calibrate.stages import ladder, sweep
from calibrate.stages.env import StageRequest, open_stage
from calibrate.stages.ladder import LadderEnv, LadderSpec
from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.measure.tier import Tier
from calibrate.stages.measure.tier_run import Measuring
from calibrate.stages.prepare.stream_probe import StreamCheck
from calibrate.stages.sweep import SweepEnv, SweepSpec
from calibrate.stages.sweep.levels import Level
from calibrate.stages.sweep.spec import SweepOptions
from calibrate.workload import WorkloadSpec
from tests.mockserver import start_mock
from tests.tier_helpers import FAST, open_gate


class Recorder:
    """What a ``TierWatcher`` is told, kept."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.tiers: list[int] = []
        self.written: list[int] = []  # rows per table written

    def say(self, text: str) -> None:
        self.lines.append(text)

    def warn(self, text: str) -> None:
        self.lines.append(f"warning: {text}")

    def watching(self, watch: Measuring) -> None:
        self.lines.append(f"watching: {watch.monitor.source}")

    def stream_checked(self, check: StreamCheck, slo: SloConfig) -> None:
        self.lines.append(f"streamed: {check.stream}")

    def tables(self, table: Path, source: str) -> None:
        self.written.append(len(read_table(table).rows))


class LadderRecorder(Recorder):
    """A ``LadderWatcher``: told the plan, then each tier."""

    def planned(
        self, options: LadderOptions, workload: WorkloadSpec, cap: ServerCap | None
    ) -> None:
        self.lines.append(f"planned: {options.batch_sizes}")

    @contextmanager
    def live(
        self, run_id: str, options: LadderOptions, watch: Measuring
    ) -> Iterator[Callable[[Tier], None]]:
        yield lambda tier: self.tiers.append(tier.batch_size)


def test_the_ladder_runs_and_records_without_a_command_line(isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, slots=4) as mock:
        open_gate(isolated, mock.base_url)
        cfg = config.load(config.Overrides(config_path=str(isolated / "calibrate.toml")), {})
        ctx = open_stage(StageRequest("ladder", cfg), lambda text: None)
        watcher = LadderRecorder()
        done = ladder.run(LadderSpec(), LadderEnv(ctx, watcher))
    assert done.passed and not done.interrupted
    tiers = [t.batch_size for t in done.result.tiers]
    # each tier as it finishes (and again if it ran more rounds to be told from another)
    assert watcher.tiers[: len(tiers)] == tiers and tiers[:3] == [1, 2, 4]
    assert set(watcher.tiers) == set(tiers)
    assert watcher.lines[0].startswith("watching: ")
    assert any(line.startswith("planned: (1, 2, 4") for line in watcher.lines)
    assert watcher.written == [len(tiers)] == [len(done.record.rows)]
    assert (ctx.run.path / "tiers.csv").exists()  # the stage's to write, the watcher's to show
    entry = done.record.entry
    assert entry.stage == "ladder" and entry.passed and entry.run_id == ctx.run.run_id
    assert (ctx.run.path / "summary.json").exists()
    assert done.next_step  # a passing ladder says what to run next


class SweepRecorder(Recorder):
    """A ``SweepWatcher``: told the plan, then each level."""

    def planned(self, options: SweepOptions, workload: WorkloadSpec, cap: ServerCap | None) -> None:
        self.lines.append(f"planned: {options.levels}")

    @contextmanager
    def live(
        self, run_id: str, options: SweepOptions, watch: Measuring
    ) -> Iterator[Callable[[Level], None]]:
        yield lambda level: self.tiers.append(level.concurrency)


def test_the_sweep_runs_and_records_without_a_command_line(isolated: Path) -> None:
    with start_mock(ttft_s=0.002, per_token_s=0.0005, slots=4) as mock:
        extra = FAST + "[sweep]\nlevel_s = 0.2\nrepeats = 1\nconcurrency = [1, 2]\n"
        open_gate(isolated, mock.base_url, extra, stage="ladder")
        cfg = config.load(config.Overrides(config_path=str(isolated / "calibrate.toml")), {})
        ctx = open_stage(StageRequest("sweep", cfg), lambda text: None)
        watcher = SweepRecorder()
        done = sweep.run(SweepSpec(), SweepEnv(ctx, watcher))
    assert not done.interrupted and done.options.levels == (1, 2)
    assert watcher.tiers == [lv.concurrency for lv in done.result.levels]
    assert "planned: (1, 2)" in watcher.lines
    assert watcher.written == [len(done.record.rows)]
    assert done.record.entry.stage == "sweep" and done.record.entry.run_id == ctx.run.run_id
    assert (done.next_step is not None) == done.passed


class StarvedAround(SweepRecorder):
    """A sweep watcher on a machine that starves calibrate's threads (777 ms late) while no
    load is sent: as the plan is told (after the probes) and as the tables are written (the
    plot, the ledger) — two self-check windows each, enough to confirm a bottleneck."""

    def watching(self, watch: Measuring) -> None:
        super().watching(watch)
        self.watch = watch

    def starve(self) -> None:
        for _ in range(2):
            self.watch.selfload.observe(1.0, 0.0, 0.777)

    def planned(self, options: SweepOptions, workload: WorkloadSpec, cap: ServerCap | None) -> None:
        super().planned(options, workload, cap)
        self.starve()

    def tables(self, table: Path, source: str) -> None:
        super().tables(table, source)
        self.starve()


def test_the_self_check_judges_the_load_not_the_time_around_it(isolated: Path) -> None:
    """SPEC §5.14: "calibrate itself is the bottleneck … throughput now is the client's limit"
    is a verdict on the levels. A sweep beside three CPU burners on a 2-core machine read its
    levels clean (threads 2–7 ms late) and then, while it drew the plot, 25–33 ms late: the
    run ended "warning: calibrate itself is the bottleneck", ``selfload.bottleneck: true`` in
    --json and the ledger, beside a knee recommended exit 0 with no level client-bound. Only
    windows while the levels are sent are judged."""
    with start_mock(ttft_s=0.002, per_token_s=0.0005, slots=4) as mock:
        extra = FAST + "[sweep]\nlevel_s = 0.2\nrepeats = 1\nconcurrency = [1, 2]\n"
        open_gate(isolated, mock.base_url, extra, stage="ladder")
        cfg = config.load(config.Overrides(config_path=str(isolated / "calibrate.toml")), {})
        ctx = open_stage(StageRequest("sweep", cfg), lambda text: None)
        watcher = StarvedAround()
        done = sweep.run(SweepSpec(), SweepEnv(ctx, watcher))
    selfload = done.record.entry.summary["selfload"]
    assert "777 ms" not in (done.record.client_bound or ""), done.record.client_bound
    assert "777 ms" not in selfload["reason"], selfload
    assert not any(lv.client_bound for lv in done.result.levels)
