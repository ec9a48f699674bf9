"""Stage C, the ladder: batch sizes (or input lengths) one tier at a time.

``run(spec, env)`` is the whole stage once it is opened: under the target's load lock it
sizes the context axis, prepares the workload, probes streaming, meets the server's cap (a
managed llama.cpp restarts at ``--parallel B``), runs the tiers, and records the verdict —
an interrupted ladder too, as not passed. Everything it has to say goes to ``env.watcher``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from calibrate.errors import CalibrateError, UsageError
from calibrate.http.server_context import read_context
from calibrate.load.procs.stage_sender import stage_sender
from calibrate.stages.context import StageContext
from calibrate.stages.env import load_lock, stopped_by_write
from calibrate.stages.ladder.context_axis import default_context_lengths
from calibrate.stages.ladder.options import LadderOptions
from calibrate.stages.ladder.repeats import TierRaw
from calibrate.stages.ladder.result import LadderResult
from calibrate.stages.ladder.run import Ladder
from calibrate.stages.ladder.setting import unconfirmed
from calibrate.stages.ladder.spec import LadderEnv, LadderOutcome, LadderSpec, LadderWatcher
from calibrate.stages.measure.stop_rules import ServerCap
from calibrate.stages.measure.tier import Tier
from calibrate.stages.measure.tier_run import Measuring
from calibrate.stages.measure.tier_stage.tier_finish import finish_tiers
from calibrate.stages.measure.tier_stage.watch import prepare_load, run_live, watched
from calibrate.stages.prepare.server_cap import ladder_cap, restarted_cap
from calibrate.stages.server_account.cap import unaccounted
from calibrate.workload import TokenRange, WorkloadSpec

__all__ = ["LadderEnv", "LadderOutcome", "LadderSpec", "LadderWatcher", "run"]


def run(spec: LadderSpec, env: LadderEnv) -> LadderOutcome:
    """The ladder from its first request to its ledger line (Ctrl-C: recorded, not passed)."""
    ctx = env.ctx
    options = replace(
        LadderOptions.from_config(ctx.config, require_match=spec.require_match),
        streaming=spec.streaming,
        slo=spec.slo if spec.slo is not None else ctx.config.slo,
        conservative=spec.conservative or ctx.config.confidence.conservative,
    )
    with load_lock(ctx), watched(spec.measure, ctx, env.watcher) as watch:
        ladder = _ladder(spec, env, options, watch)

        def tiers(on_tier: Callable[[Tier], None]) -> LadderResult:
            ladder.on_tier, ladder.note = on_tier, env.watcher.say
            return ladder.run()

        failed: OSError | None = None
        try:
            result, interrupted = run_live(
                ctx, env.watcher, watch, ladder.options, tiers, ladder.result
            )
        except OSError as exc:  # a write failed mid-run: the tiers before it are finished
            failed, result, interrupted = exc, ladder.result(), True
        except CalibrateError:  # a restart at --parallel B refused or failed: no file left open
            ctx.run.close()
            raise
        finally:
            ladder.sender.close()  # --workers: its processes end with the last tier
        check = result.stream_check
        with stopped_by_write(ctx, failed, f"{len(result.tiers)} tier(s)"):
            return finish_tiers(
                spec.measure,
                ctx,
                "ladder",
                result,
                ladder.options,
                [t.row(result.axis, options.mode) for t in result.tiers],
                tables=env.watcher.tables,
                source=result.vram_source,
                passed=result.passed,
                summary=result.summary(),
                notes=(
                    *result.notes,
                    *account_notes(ladder.cap, result.tiers),
                    *unread_notes(ladder.raw, ctx.config.ladder.sample_interval_s),
                ),
                checks=[
                    (f"batch {t.batch_size}", t.determinism) for t in result.tiers if t.determinism
                ],
                streamed=spec.streaming and (check is None or check.stream),
                selfload=watch.selfload,
                interrupted=interrupted,
            )


def _ladder(spec: LadderSpec, env: LadderEnv, options: LadderOptions, watch: Measuring) -> Ladder:
    """Everything before the first tier: lengths, workload, stream probe, the server's cap."""
    ctx, watcher = env.ctx, env.watcher
    workload = spec.workload
    if spec.axis == "context":
        options, workload = _context_axis(spec, ctx, watcher.say, options)
    plan, check = prepare_load(
        ctx,
        watcher,
        workload,
        options.mode,
        pool=spec.pool,
        stream=options.stream,
        slo=options.slo,
        probe_tokens=next(iter(options.context_lengths), None),
    )
    options = replace(options, stream_check=check)
    cap, restart = ladder_cap(ctx, watcher.say) if options.axis == "batch" else (None, None)
    ladder = Ladder(
        ctx,
        options,
        watch.monitor,
        watch.incidents,
        stage_sender(
            ctx.client,
            ctx.config,
            spec.workers,
            _largest_wave(options),
            None,
            selfload=watch.selfload,
            say=watcher.say,
            server_pids=watch.server_pids,
            each="wave",
        ),
        plan=plan,
        cap=cap,
        before_tier=restart or (lambda batch: False),
        cap_at=_read_back(ctx, watcher.warn) if restart else None,
        selfload=watch.selfload,
        noise=watch.noise,
    )
    watcher.planned(options, plan.spec, cap)
    return ladder


def _read_back(ctx: StageContext, warn: Callable[[str], None]) -> Callable[[int], ServerCap | None]:
    """The slots the server runs after each restart at --parallel B; more than B is said once a
    tier (its verdict stands: its B requests ran together, none queued)."""
    said: set[int] = set()

    def read(batch: int) -> ServerCap | None:
        cap = restarted_cap(ctx, batch)
        if cap is not None and cap.slots > batch and batch not in said:
            said.add(batch)
            warn(
                f"the server runs {cap.slots} slots ({cap.source}), not {batch}: batch {batch} "
                f"is measured on a {cap.slots}-slot server, and --parallel {batch} pinned would "
                f"run {cap.slots} at once"
            )
        return cap

    return read


def account_notes(cap: ServerCap | None, tiers: tuple[Tier, ...]) -> tuple[str, ...]:
    """Said once: the server publishes neither its cap nor a running count (SPEC §6.1); and
    each kept tier its running count could not show it ran whole (``Tier.unseen``)."""
    running = any(t.stats.server_running_max is not None for t in tiers)
    note = unaccounted(cap, running) if tiers else None
    unseen = tuple(
        f"batch {t.batch_size} is not the setting: {t.unseen.why}"
        for t in tiers
        if t.passed and t.unseen and unconfirmed(t, tiers)
    )
    return ((note,) if note else ()) + unseen


def unread_notes(raw: Mapping[int, TierRaw], interval_s: float) -> tuple[str, ...]:
    """Said of the tiers whose memory the VRAM sampler never read while they ran (each round
    shorter than its interval): their peak is unknown, and the VRAM rule did not judge them."""
    unread = [batch for batch, r in raw.items() if r.peaks and all(p.unread for p in r.peaks)]
    if not unread:
        return ()
    they, them = ("they", "them") if len(unread) > 1 else ("it", "it")
    return (
        f"batch {', '.join(map(str, unread))}: VRAM not read while {they} ran (every round over "
        f"before the next sample, {interval_s:g} s apart): peak unknown, the VRAM rule did not "
        f"judge {them} — raise [ladder] min_round_s, or lower [ladder] sample_interval_s",
    )


def _largest_wave(options: LadderOptions) -> int:
    """The most requests a wave sends at once: a prompt-list wave is one request, never split."""
    return max(options.batch_sizes, default=1) if options.mode == "wave" else 1


def _context_axis(
    spec: LadderSpec, ctx: StageContext, say: Callable[[str], None], options: LadderOptions
) -> tuple[LadderOptions, WorkloadSpec]:
    """The input lengths to step (from --context-lengths or the server's max_model_len)."""
    output = spec.workload.output_tokens or ctx.config.prompt.max_tokens
    limit = read_context(ctx.client, ctx.config.target.model)
    lengths = spec.context_lengths
    if lengths is None:
        lengths = default_context_lengths(limit.tokens if limit else None, output)
    if not lengths:
        raise UsageError(
            f"the server's {limit.what if limit else 'context'} of {limit.tokens if limit else 0} "
            f"tokens leaves no room for an input beside a {output}-token answer",
            "Lower --output-tokens, or give --context-lengths.",
        )
    where = (
        f"the server's {limit.what}: {limit.tokens} tokens, from {limit.source}"
        if limit
        else "the server reports no context limit"
    )
    say(f"context axis: input lengths {', '.join(map(str, lengths))} tokens ({where})")
    sized = replace(spec.workload, input_tokens=TokenRange(lengths[0], lengths[-1]))
    return options.on_context_axis(lengths, spec.context_batch), sized
