"""A sweep's progress plan against the time its levels really take (``cli.views.pace``), on the
simulated server on a virtual clock: 2 slots calibrate is not told, answers of 0.4 s (±10 %).

Planned from √B growth, levels 4, 8 and 16 were 1.9× longer than planned after 1 and 2 answered
alike (2 slots, each a wave of its own: the answers double from 4 on); and a Poisson rate near
the server's capacity runs to its repeat bound, which no plan counted (2.9× the plan). The plan
is a range: at least the growth and the runs measured, at most B-fold growth and every level at
``max_repeats`` — and what the levels really took lies within it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from calibrate.cli.views.pace import Growth, SweepPace
from calibrate.cli.views.sweep import planned_levels
from calibrate.config import Config, SloConfig, SweepConfig
from calibrate.gpu.vram import VramMonitor
from calibrate.report.progress import Plan, span_text
from calibrate.stages.sweep.levels import Level
from calibrate.stages.sweep.run import Sweep
from calibrate.stages.sweep.spec import SweepOptions
from tests.stage_fakes import close_runs, recorder, simulated_sender, stage_ctx

__all__ = ["close_runs"]  # the autouse fixture, used by being imported

ANSWER_S = 0.3 + 0.01 * 10  # the baseline's answer: a 0.3 s first token and 10 tokens


def _planned_and_taken(
    tmp_path: Path, seed: int, rates: tuple[float, ...] = ()
) -> list[tuple[tuple[float, float], float]]:
    """At the start and after each level: the plan's (low, high) time left, and the virtual
    seconds the rest of the sweep really took."""
    sender = simulated_sender(
        seed=seed, slots=2, ttft_s=0.3, per_token_s=0.01, answer_tokens=10, jitter=0.1
    )
    cfg = Config(sweep=replace(SweepConfig(), concurrency=(1, 2, 4, 8, 16), level_s=3.0))
    ctx = stage_ctx(tmp_path, cfg, "sweep")
    monitor = VramMonitor([])
    options = replace(
        SweepOptions.from_config(cfg, 4, slo=SloConfig(), stream=True), rates=rates, seed=seed
    )
    pace = SweepPace(options, planned_levels(options), Growth(ANSWER_S))  # slots not told
    plan = Plan(len(rates or options.levels), options.repeats * options.level_s, pace=pace.step_s)
    marks = [(0.0, plan.left_span(0, 0.0, 0.0))]

    def on_level(level: Level) -> None:
        pace.observe(level)
        now = sender.clock.now()  # type: ignore[attr-defined]
        marks.append((now, plan.left_span(len(marks), now, 0.0)))

    sweep = Sweep(ctx, options, monitor, recorder(ctx, monitor, tmp_path), sender)
    sweep.on_level = on_level
    sweep.run()
    end = sender.clock.now()  # type: ignore[attr-defined]
    return [(span, end - at) for at, span in marks[:-1]]


def test_levels_beyond_unknown_slots_and_their_repeats_are_within_the_plans_range(
    tmp_path: Path,
) -> None:
    for seed in range(3):
        closed = _planned_and_taken(tmp_path / f"c{seed}", seed)
        (low, high), took = closed[2]  # after 1 and 2 answered alike: 4, 8, 16 left
        assert took > 1.5 * low, "√B is the low end: a server whose slots are not all taken"
        assert low <= took <= high, (seed, low, took, high)
        rates = _planned_and_taken(tmp_path / f"r{seed}", seed, rates=(1.0, 2.0, 4.0))
        (low, high), took = rates[0]  # 4 req/s of Poisson arrivals against 5: run again
        assert low <= took <= high, (seed, low, took, high)
    assert span_text((100.0, 300.0)) == "1:40–5:00" and span_text((100.0, 105.0)) == "1:40"
