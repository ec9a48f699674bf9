"""The sweep's ``--auto`` mode (SPEC §5.13), GuideLLM's idea done on the user's own workload:
measure the synchronous throughput (one request at a time), then the maximum (the in-flight
count the ladder proved, closed loop), then ``steps`` open-loop rates spread evenly between the
two — the curve of latency against throughput. Rates stop at the first saturated one, like
``--rates``.

Each level carries its step: 0 synchronous, 1…N the rates, N+1 the maximum — the key that
matches two auto runs level by level (their rates differ; their steps do not).
"""

from __future__ import annotations

from dataclasses import replace

from calibrate.stages.measure.stop_rules import continue_sweep
from calibrate.stages.sweep.levels import AutoRole, AutoStep, Level
from calibrate.stages.sweep.rates import run_rate_level
from calibrate.stages.sweep.runner import LevelRunner

DEFAULT_AUTO_STEPS = 5
MAX_AUTO_STEPS = 50


def auto_rates(sync_rate: float, max_rate: float, steps: int) -> tuple[float, ...]:
    """``steps`` rates evenly spaced strictly between the synchronous and the maximum rate,
    rounded to 3 significant digits (rates a user can type again with ``--rates``)."""
    if steps < 1 or max_rate <= sync_rate or sync_rate <= 0:
        return ()
    out: list[float] = []
    for n in range(1, steps + 1):
        rate = float(f"{sync_rate + (max_rate - sync_rate) * n / (steps + 1):.3g}")
        if rate > (out[-1] if out else sync_rate) and rate < max_rate:
            out.append(rate)
    return tuple(out)


def run_auto(sweep: LevelRunner) -> None:
    """Synchronous, maximum, then the rates between (see the module's doc)."""
    o = sweep.options
    top = o.levels[-1]
    sweep.auto_step = 0
    per_request = o.prompts_per_request
    sync = sweep.add(_tagged(sweep.run_level(1), 0, "synchronous", per_request))
    if top <= 1:
        sweep.note(
            "auto: the ladder proved one request in flight, so synchronous is the maximum: "
            "no rates between"
        )
        return
    if not continue_sweep([sync.point]):
        return
    sweep.auto_step = o.auto_steps + 1
    most = sweep.add(_tagged(sweep.run_level(top), o.auto_steps + 1, "maximum", per_request))
    if not continue_sweep([most.point]):
        return
    rates = auto_rates(_request_rate(sync), _request_rate(most), o.auto_steps)
    sweep.note(_plan_text(sync, most, rates))
    for step, rate in enumerate(rates, 1):
        last = sweep.levels[-1]
        if last.saturated or not continue_sweep([last.point]):
            break
        sweep.auto_step = step
        sweep.add(_tagged(run_rate_level(sweep, rate), step, "rate", per_request))


def _tagged(level: Level, step: int, role: AutoRole, per_request: int) -> Level:
    """``level`` as a step of the curve; a closed-loop one with its rate in requests/s (its
    items/s over the prompts each request carries), the unit the rates between are offered in."""
    rate = level.stats.items_per_s / per_request if level.rate is None else None
    return replace(level, auto=AutoStep(step, role, rate))


def _request_rate(level: Level) -> float:
    assert level.auto is not None and level.auto.request_rate is not None
    return level.auto.request_rate


def _plan_text(sync: Level, most: Level, rates: tuple[float, ...]) -> str:
    head = (
        f"auto: synchronous {_request_rate(sync):.3g} req/s, maximum "
        f"{_request_rate(most):.3g} req/s at concurrency {most.concurrency}"
    )
    if not rates:
        return (
            f"{head}: concurrency adds no throughput here (or too little to put a rate "
            "between), so no rates between"
        )
    return f"{head} → rates {', '.join(f'{r:g}' for r in rates)} req/s"
