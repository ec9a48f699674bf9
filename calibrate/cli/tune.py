"""Stage C″: search the engine's own flags — restart per candidate, measure, rank, keep the best.

Needs a passing ladder and [server] (calibrate starts and stops the engine). First the memory
fraction (vLLM --gpu-memory-utilization, SGLang --mem-fraction-static, a custom
{memory_fraction}): the highest of [tune] memory_fractions at which the engine starts and serves
one request. Then each candidate — defaults per engine kind around the ladder's batch size;
[tune] grid and --grid KEY=V1,V2,… replace an axis (for a custom command: any {placeholder}) —
is started, warmed up, measured like the sweep at increasing concurrency (goodput under [slo]),
stopped, and proven gone. Each result is on disk as it finishes: run the same command again to
resume. The ranked table goes to tiers.csv/jsonl and plot.svg; pin then writes the winner.

example: calibrate tune --grid max_num_seqs=8,16,32 --grid max_num_batched_tokens=4096,8192 --budget-s 3600
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
from pathlib import Path
from typing import Any

from calibrate.cli.common import (
    Output,
    add_command,
    add_force,
    kept_on_write_error,
    load_lock,
    open_stage,
    output_for,
)
from calibrate.cli.tune_view import finished_line, show_ranked, winner_text
from calibrate.config import MAX_TIMEOUT_S
from calibrate.errors import Interrupted, UsageError
from calibrate.pipeline import next_after
from calibrate.server.builders import SERVER_KINDS
from calibrate.stages.ladder import load_tasks
from calibrate.stages.tier_run import MeasureSpec, preflight
from calibrate.stages.tune import Tune, TuneOutcome
from calibrate.stages.tune_files import rows, write_plot, write_tables
from calibrate.stages.tune_run import Lifecycle
from calibrate.stages.tune_setup import TuneRequest, TuneSetup, prepare
from calibrate.stages.tune_store import TuneStore


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "tune", __doc__ or "", run)
    add = parser.add_argument
    add("--kind", choices=SERVER_KINDS, help="engine kind (overrides [server] kind)")
    add(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2,…",
        help="values to try for one flag (repeatable; replaces that axis of the defaults and "
        "[tune] grid), e.g. --grid parallel=1,2,4",
    )
    add(
        "--search",
        choices=("grid", "halving"),
        help="grid: every candidate (default, [tune] search); halving: all at a short window, "
        "the better half again at twice the window, … the last two at the full window",
    )
    add(
        "--budget-s",
        type=float,
        metavar="S",
        help="cap the whole run (checked before each start; says what was left untested; "
        "default [tune] budget_s, 0 = none)",
    )
    add(
        "--new",
        action="store_true",
        help="start a new tune run even if an unfinished one with the same grid exists",
    )
    add("--stream", action="store_true", help="stream (SSE) and measure TTFT")
    add("--tasks", metavar="FILE", help="real inputs: a JSONL file with a 'text' per line")
    add(
        "--vram-source",
        choices=("auto", "nvml", "metrics", "none"),
        default="auto",
        help="where VRAM comes from (default auto)",
    )
    add(
        "--gpu",
        metavar="ID",
        action="append",
        default=None,
        help="NVML device index or UUID the server uses (repeatable)",
    )
    add("--gpu-metrics-url", metavar="URL", help="a DCGM exporter for GPUs on another machine")
    add_force(parser)


def _request(args: argparse.Namespace) -> TuneRequest:
    """The flags as a typed request; mistakes in them are exit 2 before anything is sent."""
    if args.budget_s is not None and not 0 <= args.budget_s <= MAX_TIMEOUT_S:
        raise UsageError(f"--budget-s must be in [0, {MAX_TIMEOUT_S:g}], got {args.budget_s}")
    spec = MeasureSpec(
        vram_source=args.vram_source,
        gpus=tuple(args.gpu) if args.gpu else None,
        gpu_metrics_url=args.gpu_metrics_url,
    )
    preflight(spec)
    return TuneRequest(
        spec,
        kind=args.kind,
        grid=tuple(args.grid),
        search=args.search,
        budget_s=args.budget_s,
        new_run=args.new,
        stream=args.stream,
        tasks=load_tasks(Path(args.tasks)) if args.tasks else (),
    )


def resume_command(args: argparse.Namespace) -> str:
    words = [w for w in getattr(args, "argv", ["tune"]) if w != "--new"]
    return "calibrate " + shlex.join(words)


def run(args: argparse.Namespace) -> int:
    out = output_for(args)
    request = _request(args)
    ctx = open_stage(args, "tune", out)
    with load_lock(ctx):  # one load-sending stage, one server at a time
        setup = prepare(ctx, request)
        return _tune(args, out, setup)


def _tune(args: argparse.Namespace, out: Output, setup: TuneSetup) -> int:
    ctx, plan = setup.ctx, setup.plan
    store = TuneStore(ctx.run)
    measured = {r.candidate.index for r in store.results()}
    axes = "; ".join(f"{a.key} ∈ {{{', '.join(a.values)}}}" for a in plan.axes)
    if setup.resumed:
        out.say(
            f"resuming tune run {ctx.run.run_id}: {len(measured)} of {plan.size} "
            "candidates already measured"
        )
    else:
        out.say(
            f"tune run {ctx.run.run_id}: {plan.size} candidates ({axes}), {setup.search} "
            f"search, {setup.kind} restarted per candidate"
        )
    store.write_plan({**plan.to_json(), "search": setup.search}, setup.fingerprint)
    lifecycle = Lifecycle(ctx, setup.kind, setup.settings, notify=out.say)

    def finished(result: Any) -> None:
        out.say(finished_line(result))

    tune = Tune(
        plan,
        store,
        lifecycle,
        setup.search,
        setup.window,
        setup.budget_s,
        notify=out.say,
        on_result=finished,
    )
    try:
        with kept_on_write_error(ctx):
            outcome = tune.run()
    except KeyboardInterrupt:
        with contextlib.suppress(KeyboardInterrupt):
            lifecycle.stop_managed()
        done = len({index for _, index in tune.done})
        ctx.record_result(
            False,
            {"candidates": plan.size, "measured": done, "grid_fingerprint": setup.fingerprint},
            interrupted=True,
        )
        ctx.run.close()
        raise Interrupted(
            f"tune interrupted: {done} of {plan.size} candidates measured, kept in "
            f"{ctx.run.path}; the server calibrate started for it is stopped",
            f"Resume it: {resume_command(args)}",
        ) from None
    return _finish(out, setup, store, outcome)


def _finish(out: Output, setup: TuneSetup, store: TuneStore, outcome: TuneOutcome) -> int:
    ctx = setup.ctx
    table = rows(outcome.ranked)
    title = f"tune {ctx.run.run_id} (ranked by goodput, {setup.settings.slo.describe()})"
    if table:
        csv_path = write_tables(ctx.run, table)
        plot = write_plot(ctx.run, table, title)
        show_ranked(out, table, title)
        out.say(f"tables: {csv_path}" + (f", plot: {plot}" if plot else ""))
    for probe in outcome.probes:
        if not probe.ok:
            out.say(f"memory step: {plan_key(setup)}={probe.fraction} did not start: {probe.error}")
    if outcome.memory_failed:
        out.fail(
            f"no {plan_key(setup)} in {', '.join(setup.plan.memory_fractions)} let the "
            "engine start and serve one request (see runs/server.log)"
        )
    if outcome.untested:
        out.warn(
            f"--budget-s spent: {len(outcome.untested)} candidate(s) left untested: "
            f"{', '.join(c.id for c in outcome.untested)}; run again to continue"
        )
    details = {
        "grid_fingerprint": setup.fingerprint,
        "search": setup.search,
        "ladder_run_id": setup.ladder_run_id,
        "slo": setup.settings.slo.to_json(),
        "resumed": setup.resumed,
        "ranked": [r["id"] for r in table],
    }
    summary = outcome.summary(details)
    entry = ctx.record_result(summary.winner is not None, summary)
    if outcome.complete:
        store.mark_finished()
    ctx.run.close()
    text = winner_text(outcome)
    if text:
        out.ok(text)
        out.say(f"next: {next_after('tune')}   (writes every flag of the winner)")
    else:
        out.fail("tune found no candidate that served a passing level")
    out.result(
        {
            "passed": entry.passed,
            "run_id": ctx.run.run_id,
            "resumed": setup.resumed,
            "complete": outcome.complete,
            "grid_fingerprint": setup.fingerprint,
            "candidates": [{**r.to_json(), "rank": n} for n, r in enumerate(outcome.ranked, 1)],
            "winner": {
                **summary.winner.to_json(),
                "id": outcome.winner.candidate.id,
                "margin": outcome.margin,
            }
            if summary.winner and outcome.winner
            else None,
            "untested": [c.to_json() for c in outcome.untested],
            "memory": summary.details.get("memory"),
        }
    )
    return 0 if entry.passed else 1


def plan_key(setup: TuneSetup) -> str:
    return setup.plan.memory_key or "memory fraction"
