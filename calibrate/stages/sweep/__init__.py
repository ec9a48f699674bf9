"""Stage D, the sweep: concurrency levels, rates, --auto and --find-max over the ladder's batch size.

``run(spec, env)`` is the whole stage once it is opened: under the target's load lock it plans
the levels (a managed server restarted at cap B), prepares the workload, probes streaming,
reads the server's own cap, runs the levels, and records the verdict — an interrupted sweep
too, as not passed. Everything it has to say goes to ``env.watcher``.
"""

from __future__ import annotations

from collections.abc import Callable

from calibrate.engines import find
from calibrate.load.procs.stage_sender import stage_sender
from calibrate.stages.env import load_lock, stopped_by_write
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.measure.tier_run import Measuring
from calibrate.stages.measure.tier_stage.tier_finish import TierOutcome, finish_tiers
from calibrate.stages.measure.tier_stage.watch import (
    StageWatcher,
    TierEnv,
    prepare_load,
    run_live,
    watched,
)
from calibrate.stages.prepare.server_cap import read_cap_account
from calibrate.stages.sweep.levels import Level
from calibrate.stages.sweep.plan import plan_sweep
from calibrate.stages.sweep.result import SweepResult
from calibrate.stages.sweep.run import Sweep
from calibrate.stages.sweep.spec import SweepOptions, SweepSpec

__all__ = ["SweepEnv", "SweepOutcome", "SweepSpec", "SweepWatcher", "run"]


SweepWatcher = StageWatcher[SweepOptions, Level, ServerCap]  # the plan, then each level
SweepEnv = TierEnv[SweepWatcher]  # where a sweep runs (the opened stage), who watches it
SweepOutcome = TierOutcome[SweepResult, SweepOptions]  # a finished sweep, recorded


def run(spec: SweepSpec, env: SweepEnv) -> SweepOutcome:
    """The sweep from its plan to its ledger line (Ctrl-C: recorded, not passed)."""
    ctx, watcher = env.ctx, env.watcher
    with load_lock(ctx):  # held from the restart at cap B to the last level
        options = plan_sweep(spec, ctx, watcher.say, watcher.warn)
        with watched(spec.measure, ctx, watcher) as watch:
            sweep = _sweep(spec, env, options, watch)

            def levels(on_level: Callable[[Level], None]) -> SweepResult:
                sweep.on_level, sweep.note = on_level, watcher.say
                return sweep.run()

            failed: OSError | None = None
            try:
                result, interrupted = run_live(
                    ctx, watcher, watch, sweep.options, levels, sweep.result
                )
            except OSError as exc:  # a write failed mid-run: the levels before it are finished
                failed, result, interrupted = exc, sweep.result(), True
            finally:
                sweep.sender.close()  # --workers: its processes end with the last level
            with stopped_by_write(ctx, failed, f"{len(result.levels)} level(s)"):
                return finish_tiers(
                    spec.measure,
                    ctx,
                    "sweep",
                    result,
                    sweep.options,
                    [lv.row() for lv in result.levels],
                    tables=watcher.tables,
                    source=result.vram_source,
                    passed=result.passed,
                    summary=result.summary(sweep.options),
                    notes=result.notes(find(ctx.server_kind)),
                    checks=[(lv.label, lv.determinism) for lv in result.levels if lv.determinism],
                    streamed=sweep.options.stream,
                    selfload=watch.selfload,
                    interrupted=interrupted,
                )


def _sweep(spec: SweepSpec, env: SweepEnv, options: SweepOptions, watch: Measuring) -> Sweep:
    """Everything before the first level: the server's cap, the workload, the stream probe."""
    ctx, watcher = env.ctx, env.watcher
    account = read_cap_account(ctx.client.get_text)
    cap = account.cap
    if cap is None and account.unknown:
        watcher.say(f"the server's own cap is not known ({account.unknown})")
    plan, check = prepare_load(
        ctx,
        watcher,
        spec.workload,
        options.mode,
        pool=spec.pool,
        stream=options.stream,
        slo=options.slo,
    )
    options = options.probed(check) if check is not None else options
    sweep = Sweep(
        ctx,
        options,
        watch.monitor,
        watch.incidents,
        stage_sender(
            ctx.client,
            ctx.config,
            spec.workers,
            *highest_load(options),
            selfload=watch.selfload,
            say=watcher.say,
            server_pids=watch.server_pids,
            each="level",
        ),
        cap,
        plan=plan,
        selfload=watch.selfload,
        noise=watch.noise,
    )
    watcher.planned(options, plan.spec, cap)
    return sweep


def highest_load(options: SweepOptions) -> tuple[int, float | None]:
    """The most requests any planned level keeps in flight, and its highest offered rate."""
    levels = max((*options.levels, options.find_max_top, 1))
    if not options.rates and options.find_max_rates is None:
        return levels, None
    highest = max(options.rates, default=float("inf"))  # a find-max's top is not known yet
    return options.max_in_flight or levels, highest
