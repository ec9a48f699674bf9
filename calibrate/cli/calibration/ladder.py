"""Stage C: step the batch size (1→2→4→8), two rounds per tier, VRAM sampled throughout.

A warm-up wave ([ladder].warmup_waves) goes first, not counted; each round repeats waves of B
until it has lasted [ladder].min_round_s. Stops on the first failing tier, on an [slo] bound
exceeded at p99, above the server's own cap, when the server preempts requests (those three are
not kept), on VRAM pressure at [ladder].vram_limit, or when the time per item (round wall time /
items) rises by more than [ladder].latency_rise over the previous tier beyond the spread of the
rounds. The setting is the smallest kept batch the fastest kept tier adds less than
[sweep].gain_min over, not the last; the ladder says which and why, every percentage over the
setting and the rounds behind it. Two tiers whose rounds cannot tell that apart run more rounds,
interleaved (up to [ladder].max_rounds); still unsure, the ladder is inconclusive (exit 1, the
cause named: a busy machine, a starved client, a jittery server) unless --conservative takes the
smaller batch, recorded as taken under noise. Exit 0 when a tier passed and the setting is
known, 1 when even the first failed, the setting is inconclusive, or --require-match /
--compare failed.

The workload: the fixed prompt (default), --tasks FILE (the longest items), or
synthetic --input-tokens N --output-tokens M; the fixed prompt is then sent alone once per round,
after the measured waves, as a canary. A managed llama.cpp restarts at --parallel B per tier.
--axis context steps the input length (512, 1k, 2k, … up to max_model_len) instead.
--workers N (or auto) sends each wave from N processes that split it, released together.

example: calibrate ladder --input-tokens 3000 --output-tokens 200 --junit runs/ladder.xml
"""

from __future__ import annotations

import argparse
from typing import Any

from calibrate.cli import flags, output
from calibrate.cli.flags import resolve
from calibrate.cli.flags.workload import add_tier_args, measure_spec, resolved_workload
from calibrate.cli.views.ladder import LadderView
from calibrate.config import Config
from calibrate.io.tasks import pool_for
from calibrate.stages import ladder
from calibrate.stages.ladder import LadderEnv, LadderSpec
from calibrate.stages.measure.slo import parse_slo_flags
from calibrate.stages.measure.tier_run import MeasureSpec


def register(subparsers: Any) -> None:
    parser = flags.add_command(subparsers, "ladder", __doc__ or "", run)
    parser.add_argument(
        "--require-match",
        action="store_true",
        help="fail when any output differs from the single-call baseline",
    )
    add_tier_args(parser, "ladder")


def run(args: argparse.Namespace) -> int:
    measure = measure_spec(args, "ladder")  # a flag's mistake before the config's
    cfg = resolve.load_config(args)
    spec = ladder_spec(args, measure, cfg)
    out = output.output_for(args)
    ctx = resolve.open_stage(args, "ladder", out, cfg)
    view = LadderView(out, ctx)
    done = ladder.run(spec, LadderEnv(ctx, view))
    return view.render(done, args.junit)


def ladder_spec(args: argparse.Namespace, measure: MeasureSpec, cfg: Config) -> LadderSpec:
    """The flags as one typed spec: exit 2 on a mistake before anything is written."""
    workload = resolved_workload(args, cfg, "ladder")
    return LadderSpec(
        measure=measure,
        workload=workload.spec,
        pool=pool_for(workload.spec),
        require_match=args.require_match,
        streaming=not args.no_stream,
        slo=parse_slo_flags(args.slo, cfg.slo) if args.slo else None,
        axis=workload.axis,
        context_lengths=workload.context_lengths,
        context_batch=workload.context_batch,
        workers=args.workers,
        conservative=args.conservative,
    )
