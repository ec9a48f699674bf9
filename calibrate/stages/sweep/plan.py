"""The levels a sweep runs: at the verified batch size, within what the ladder proved (SPEC §5.0).

A managed server is restarted at cap B first (``run_at_cap``), so extra requests queue in the
server; against one calibrate does not manage, levels above the most requests the ladder passed
with in flight are skipped (or sent anyway with ``--beyond-ladder``, said and recorded).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from calibrate.errors import GateClosed, UsageError
from calibrate.load.arrivals import parse_counts, parse_rates
from calibrate.stages.context import StageContext
from calibrate.stages.prepare.server_cap import run_at_cap, safe_levels
from calibrate.stages.sweep.find_max import TOP
from calibrate.stages.sweep.spec import SweepOptions, SweepSpec
from calibrate.state.setting import latest_passing_ladder

Say = Callable[[str], None]


def plan_sweep(spec: SweepSpec, ctx: StageContext, say: Say, warn: Say) -> SweepOptions:
    """The options to run with; a managed server restarted at cap B if it runs at another."""
    ladder = latest_passing_ladder(ctx.ledger, ctx.target)
    if ladder is None and not spec.batch_size:
        raise GateClosed(
            "no verified batch size: no passing ladder found a passing tier for this target",
            "Run first: calibrate ladder   (or give --batch-size N with --force)",
        )
    top = ladder[0].last_passing if ladder else None
    batch = spec.batch_size or (top.batch_size if top else 1)
    wanted = parse_counts(spec.concurrency) if spec.concurrency else ctx.config.sweep.concurrency
    wanted = (TOP,) if spec.find_max else wanted
    managed = run_at_cap(ctx, batch, say, max(wanted, default=batch))
    proved = ladder[0].max_in_flight if ladder else 0
    levels, skipped = safe_levels(
        wanted,
        proved,
        managed=managed,
        beyond_ladder=spec.beyond_ladder,
    )
    rates = parse_rates(spec.rates) if spec.rates else ()
    auto = spec.auto_steps > 0
    if rates or auto or spec.find_max:
        skipped = ()
    if auto:
        levels = (1, max(1, proved or batch))
    if spec.burstiness <= 0:
        raise UsageError(f"--burstiness must be above 0, got {spec.burstiness:g}")
    if skipped:
        instead = [
            c for c in levels if c not in wanted
        ]  # none asked for was safe: the most that is
        runs = f"; running concurrency {instead[0]} instead" if instead else ""
        warn(
            f"concurrency {', '.join(map(str, skipped))} skipped: the ladder passed with at most "
            f"{proved} requests in flight, and calibrate does not manage this server to cap it "
            f"(--beyond-ladder to send them anyway){runs}"
        )
    if spec.beyond_ladder and not managed:
        warn("--beyond-ladder: sending more requests at once than the ladder proved (recorded)")
    capped = not managed and not spec.beyond_ladder and proved > 0
    search_top = min(TOP, proved) if capped else TOP
    over_rates = spec.find_max and spec.find_max_rates is not None
    if spec.find_max and search_top < TOP and not over_rates:
        warn(
            f"find-max searches concurrency 1–{search_top} only: the ladder passed with at most "
            f"{proved} requests in flight and calibrate does not manage this server "
            f"(--beyond-ladder to search up to {TOP})"
        )
    options = SweepOptions.from_config(
        ctx.config,
        batch,
        stream=spec.streaming,
        ladder_run_id=ladder[1].run_id if ladder else "",
        skipped_levels=skipped,
        beyond_ladder=spec.beyond_ladder and not managed,
        slo=spec.slo if spec.slo is not None else ctx.config.slo,
        rates=rates,
        arrival=spec.arrival,
        job_gaps=spec.workload.trace.gaps_s() if spec.workload.trace else (),
        burstiness=spec.burstiness,
        seed=spec.seed,
        max_in_flight=proved if capped and (rates or auto or over_rates) else None,
        auto_steps=spec.auto_steps,
        conservative=spec.conservative or ctx.config.confidence.conservative,
    )
    if over_rates:  # the synchronous level first, then rate probes of their repeats, no more
        return replace(
            options, levels=(1,), find_max_rates=spec.find_max_rates, max_repeats=options.repeats
        )
    if spec.find_max:  # each probe runs its repeats, more only while its runs straddle a bound
        return replace(options, levels=(search_top,), find_max_top=search_top)
    return replace(options, levels=levels)
