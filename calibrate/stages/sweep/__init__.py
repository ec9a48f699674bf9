"""Stage D, the sweep: concurrency levels, rates, --auto and --find-max over the ladder's batch size.

``run(spec, env)`` is the whole stage once it is opened: under the target's load lock it plans
the levels (a managed server restarted at cap B), prepares the workload, probes streaming,
reads the server's own cap, runs the levels, and records the verdict — an interrupted sweep
too, as not passed. Everything it has to say goes to ``env.watcher``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from calibrate.config import SloConfig
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.load.waves import Sender
from calibrate.stages.context import StageContext
from calibrate.stages.env import kept_on_write_error, load_lock
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.measure.tier_finish import (
    Determinism,
    TierRecord,
    finish_tiers,
    write_determinism,
)
from calibrate.stages.measure.tier_run import Measuring, TierWatcher, measuring
from calibrate.stages.prepare.server_cap import read_server_cap
from calibrate.stages.prepare.stream_probe import StreamCheck, probe_stream
from calibrate.stages.prepare.workload_plan import prepare_workload
from calibrate.stages.sweep.levels import Level
from calibrate.stages.sweep.plan import plan_sweep
from calibrate.stages.sweep.result import SweepResult
from calibrate.stages.sweep.run import Sweep
from calibrate.stages.sweep.spec import SweepOptions, SweepSpec
from calibrate.state.gates import next_step
from calibrate.workload import WorkloadSpec

__all__ = ["SweepEnv", "SweepOutcome", "SweepSpec", "SweepWatcher", "run"]


class SweepWatcher(TierWatcher, Protocol):
    """Who watches a sweep: what it will send, then each level as it finishes."""

    def stream_checked(self, check: StreamCheck, slo: SloConfig) -> None:
        """The stream probe's finding, before any load."""

    def planned(self, options: SweepOptions, workload: WorkloadSpec, cap: ServerCap | None) -> None:
        """The levels, runs and workload, once everything before the load is done."""

    def live(
        self, run_id: str, options: SweepOptions, watch: Measuring
    ) -> AbstractContextManager[Callable[[Level], None]]:
        """Open while the levels run; what it yields is told each finished level."""
        ...


@dataclass(frozen=True)
class SweepEnv:
    """Where a sweep runs (the opened stage) and who watches it."""

    ctx: StageContext
    watcher: SweepWatcher


@dataclass(frozen=True)
class SweepOutcome:
    """A finished (or interrupted) sweep, recorded: what there is to say about it."""

    result: SweepResult
    options: SweepOptions  # as run: streamed only where the probe let it
    record: TierRecord
    determinism: Determinism | None = None
    next_step: str | None = None  # what to run next (after a pass)
    interrupted: bool = False

    @property
    def passed(self) -> bool:
        return self.record.entry.passed


def run(spec: SweepSpec, env: SweepEnv) -> SweepOutcome:
    """The sweep from its plan to its ledger line (Ctrl-C: recorded, not passed)."""
    ctx, watcher = env.ctx, env.watcher
    with load_lock(ctx):  # held from the restart at cap B to the last level
        options = plan_sweep(spec, ctx, watcher.say, watcher.warn)
        with kept_on_write_error(ctx), measuring(spec.measure, ctx) as watch:
            watcher.watching(watch)
            sweep = _sweep(spec, env, options, watch)
            try:
                with watcher.live(ctx.run.run_id, sweep.options, watch) as on_level:
                    sweep.on_level = on_level
                    sweep.note = watcher.say
                    result = sweep.run()
            except KeyboardInterrupt:
                return _finish(spec, env, sweep.result(), sweep.options, watch.selfload, True)
            return _finish(spec, env, result, sweep.options, watch.selfload)


def _sweep(spec: SweepSpec, env: SweepEnv, options: SweepOptions, watch: Measuring) -> Sweep:
    """Everything before the first level: the server's cap, the workload, the stream probe."""
    ctx, watcher = env.ctx, env.watcher
    cap = read_server_cap(ctx.client.get_text)
    plan = prepare_workload(
        ctx.config, ctx.client, spec.workload, options.mode, ctx.params, pool=spec.pool
    )
    for note in plan.notes:
        watcher.warn(note)
    if options.stream:  # a server that refuses streaming is measured unstreamed, said so
        check = probe_stream(ctx, options.mode)
        options = options.probed(check)
        watcher.stream_checked(check, options.slo)
    sweep = Sweep(
        ctx,
        options,
        watch.monitor,
        watch.incidents,
        Sender(ctx.client),
        cap,
        plan=plan,
        selfload=watch.selfload,
    )
    watcher.planned(options, plan.spec, cap)
    return sweep


def _finish(
    spec: SweepSpec,
    env: SweepEnv,
    result: SweepResult,
    options: SweepOptions,
    selfload: SelfLoadMonitor,
    interrupted: bool = False,
) -> SweepOutcome:
    """The table, --compare, the ledger verdict; then determinism.json and the next step."""
    ctx = env.ctx
    rows = [{**lv.to_json(), "vram_source": result.vram_source} for lv in result.levels]
    record = finish_tiers(
        spec.measure,
        ctx,
        "sweep",
        rows,
        tables=env.watcher.tables,
        source=result.vram_source,
        passed=result.passed,
        summary=result.summary(options),
        notes=result.notes(llamacpp=ctx.config.server.kind == "llamacpp"),
        selfload=selfload,
        interrupted=interrupted,
    )
    if interrupted:
        return SweepOutcome(result, options, record, interrupted=True)
    checks = [(lv.label, lv.determinism) for lv in result.levels if lv.determinism]
    determinism = write_determinism(ctx, checks)
    hint = next_step(ctx.config, ctx.ledger, ctx.target) if record.entry.passed else None
    return SweepOutcome(result, options, record, determinism, hint)
