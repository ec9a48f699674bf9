"""Stage C, the ladder: batch sizes (or input lengths) one tier at a time.

``run(spec, env)`` is the whole stage once it is opened: under the target's load lock it
sizes the context axis, prepares the workload, probes streaming, meets the server's cap (a
managed llama.cpp restarts at ``--parallel B``), runs the tiers, and records the verdict —
an interrupted ladder too, as not passed. Everything it has to say goes to ``env.watcher``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from calibrate.errors import RequestError, UsageError
from calibrate.gpu.selfload import SelfLoadMonitor
from calibrate.load.waves import Sender
from calibrate.stages.context import StageContext
from calibrate.stages.env import kept_on_write_error, load_lock
from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.ladder.result import LadderResult
from calibrate.stages.ladder.run import Ladder
from calibrate.stages.ladder.spec import LadderEnv, LadderOutcome, LadderSpec, LadderWatcher
from calibrate.stages.measure.slo import parse_slo_flags
from calibrate.stages.measure.tier_finish import finish_tiers, write_determinism
from calibrate.stages.measure.tier_run import Measuring, measuring
from calibrate.stages.prepare.server_cap import ladder_cap
from calibrate.stages.prepare.stream_probe import probe_stream
from calibrate.stages.prepare.workload_plan import prepare_workload
from calibrate.state.gates import next_step
from calibrate.workload import TokenRange, WorkloadSpec, default_context_lengths

__all__ = ["LadderEnv", "LadderOutcome", "LadderSpec", "LadderWatcher", "run"]


def run(spec: LadderSpec, env: LadderEnv) -> LadderOutcome:
    """The ladder from its first request to its ledger line (Ctrl-C: recorded, not passed)."""
    ctx = env.ctx
    options = replace(
        LadderOptions.from_config(ctx.config, require_match=spec.require_match),
        streaming=spec.streaming,
        slo=parse_slo_flags(spec.slo_flags, ctx.config.slo),
    )
    with load_lock(ctx), kept_on_write_error(ctx), measuring(spec.measure, ctx) as watch:
        env.watcher.watching(watch)
        ladder = _ladder(spec, env, options, watch)
        try:
            with env.watcher.live(ctx.run.run_id, ladder.options, watch) as on_tier:
                ladder.on_tier = on_tier
                result = ladder.run()
        except KeyboardInterrupt:
            return _finish(spec, env, ladder.result(), watch.selfload, interrupted=True)
        return _finish(spec, env, result, watch.selfload)


def _ladder(spec: LadderSpec, env: LadderEnv, options: LadderOptions, watch: Measuring) -> Ladder:
    """Everything before the first tier: lengths, workload, stream probe, the server's cap."""
    ctx, watcher = env.ctx, env.watcher
    workload = spec.workload
    if spec.axis == "context":
        options, workload = _context_axis(spec, ctx, watcher.say, options)
    plan = prepare_workload(
        ctx.config,
        ctx.client,
        workload,
        options.mode,
        ctx.params,
        pool=spec.pool,
        probe_tokens=next(iter(options.context_lengths), None),
    )
    for note in plan.notes:
        watcher.warn(note)
    if options.stream:  # a server that refuses streaming is measured unstreamed, said so
        check = probe_stream(ctx, options.mode)
        options = replace(options, stream_check=check)
        watcher.stream_checked(check, options.slo)
    cap, restart = ladder_cap(ctx, watcher.say) if options.axis == "batch" else (None, None)
    ladder = Ladder(
        ctx,
        options,
        watch.monitor,
        watch.incidents,
        Sender(ctx.client),
        plan=plan,
        cap=cap,
        before_tier=restart or (lambda batch: False),
    )
    watcher.planned(options, plan.spec, cap)
    return ladder


def _context_axis(
    spec: LadderSpec, ctx: StageContext, say: Callable[[str], None], options: LadderOptions
) -> tuple[LadderOptions, WorkloadSpec]:
    """The input lengths to step (from --context-lengths or the server's max_model_len)."""
    output = spec.workload.output_tokens or ctx.config.prompt.max_tokens
    limit = served_max_model_len(ctx)
    lengths = spec.context_lengths
    if lengths is None:
        lengths = default_context_lengths(limit, output)
    if not lengths:
        raise UsageError(
            f"the server's max_model_len {limit} leaves no room for an input beside a "
            f"{output}-token answer",
            "Lower --output-tokens, or give --context-lengths.",
        )
    where = f"max_model_len {limit} from /v1/models" if limit else "no max_model_len reported"
    say(f"context axis: input lengths {', '.join(map(str, lengths))} tokens ({where})")
    sized = replace(spec.workload, input_tokens=TokenRange(lengths[0], lengths[-1]))
    return options.on_context_axis(lengths, spec.context_batch), sized


def served_max_model_len(ctx: StageContext) -> int | None:
    """``max_model_len`` of the configured model in ``GET /v1/models`` (vLLM, the mock)."""
    try:
        models = ctx.client.models(keep=ctx.config.target.model)
    except RequestError:
        return None
    model = ctx.config.target.model
    found = [m.max_model_len for m in models if m.id == model and m.max_model_len]
    return found[0] if found else None


def _finish(
    spec: LadderSpec,
    env: LadderEnv,
    result: LadderResult,
    selfload: SelfLoadMonitor,
    *,
    interrupted: bool = False,
) -> LadderOutcome:
    """The table, --compare, the ledger verdict; then determinism.json and the next step."""
    ctx = env.ctx
    rows = [
        {**t.to_json(), "vram_source": result.vram_source, "axis": result.axis}
        for t in result.tiers
    ]
    record = finish_tiers(
        spec.measure,
        ctx,
        "ladder",
        rows,
        tables=env.watcher.tables,
        source=result.vram_source,
        passed=result.passed,
        summary=result.summary(),
        notes=result.notes,
        selfload=selfload,
        interrupted=interrupted,
    )
    check = result.stream_check
    streamed = spec.streaming and (check is None or check.stream)
    if interrupted:
        return LadderOutcome(result, record, streamed, interrupted=True)
    checks = [(f"batch {t.batch_size}", t.determinism) for t in result.tiers if t.determinism]
    determinism = write_determinism(ctx, checks)
    hint = next_step(ctx.config, ctx.ledger, ctx.target) if record.entry.passed else None
    return LadderOutcome(result, record, streamed, determinism, hint)
