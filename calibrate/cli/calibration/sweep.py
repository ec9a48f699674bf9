"""Stage C′: at the verified batch size, step concurrency (1, 2, 4, 8, 16…) and find the knee.

Each level keeps that many requests in flight (a new one as each answer arrives) for at least
[sweep].level_s seconds and 4×C requests, [sweep].repeats times; throughput is counted over the
steady window (all C in flight, before the drain) and shown as the median with its range. Each
level is judged against the best level so far, not only its neighbour: it counts as a gain when
its median adds at least [sweep].gain_min and the runs' interval puts it above the best; when the
runs cannot tell, the two run again, interleaved (up to [sweep].max_repeats each). The knee is the
smallest level within gain_min of the best, never above the server's own cap; its concurrency is
the recommendation, said with how sure it is and what the rest of the machine did meanwhile. When
the runs still cannot tell the levels the knee rests on apart (a busy machine, a starved client,
a jittery server), or calibrate itself was the bottleneck and that leaves the best unknown, the
sweep is inconclusive (exit 1) and says why and what to do; --conservative takes the smaller
level instead, recorded as taken under noise.
Stops at the first failing level. --workers N (or auto) sends each level from N processes that
split its concurrency or rate, for when calibrate itself is the limit.

--find-max finds the SLO boundary instead: the largest concurrency that meets every SLO
([slo] or --slo), probing 1, 8, 64, 512, 1024 until a level breaks an SLO or errors, then
bisecting between the last passing and the first failing level to within 5 % (or 1): at most 10
probes on [1, 1024]. Each probe runs [sweep].repeats times and passes when none of its requests
failed and the median over its runs of each p99 meets every SLO. The last passing level is the
recommended concurrency (pin takes it). With --rates auto (or --rates LO:HI req/s) it searches
the offered rate the same way, from the synchronous rate measured first: the highest rate that
meets every SLO without saturating; pin takes the most requests in flight at it as the
concurrency, as for any rate sweep.

example: calibrate sweep --stream --junit runs/sweep.xml
example: calibrate sweep --find-max --slo ttft:0.5 --beyond-ladder
example: calibrate sweep --find-max --rates auto --slo ttft:0.5
example: calibrate sweep --concurrency 64,128,256 --workers auto
"""

from __future__ import annotations

import argparse
from typing import Any

from calibrate.cli.flags import sweep as sweep_args
from calibrate.cli.flags.resolve import load_config, open_stage
from calibrate.cli.output import output_for
from calibrate.cli.views.sweep import SweepView
from calibrate.stages import sweep
from calibrate.stages.sweep import SweepEnv


def register(subparsers: Any) -> None:
    sweep_args.register(subparsers, __doc__ or "", run)


def run(args: argparse.Namespace) -> int:
    measure = sweep_args.check_sweep_flags(args)
    cfg = load_config(args)
    spec = sweep_args.sweep_spec(args, measure, cfg)
    out = output_for(args)
    ctx = open_stage(args, "sweep", out, cfg)
    view = SweepView(out, ctx)
    done = sweep.run(spec, SweepEnv(ctx, view))
    return view.render(done, args.junit)
