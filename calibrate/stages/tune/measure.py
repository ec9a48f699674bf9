"""One candidate measured the way the sweep measures: the one place tune builds a ``Sweep``.

``measure_candidate`` runs the existing sweep (``stages.sweep``) at the candidate's cap, over
the candidate's own folder (``runs/<tune>/candidates/<slug>/``: records, levels, incidents),
then reads its levels back as a ``Measurement``: the best level by goodput (requests per second
that met every ``[slo]`` bound, or all successful ones when there are no SLOs), its latency
percentiles, the peak VRAM / KV pressure, errors and incidents. When the sweep's windows change,
this module is what follows them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from calibrate.config import Config, SloConfig
from calibrate.gpu.noise import combined
from calibrate.io.store import RunDir
from calibrate.io.tasks import TaskPool
from calibrate.load.sender import Sender
from calibrate.stages.context import StageContext
from calibrate.stages.measure.slo import has_slo
from calibrate.stages.measure.tier_run import MeasureSpec, measuring
from calibrate.stages.measure.tiers import Stats
from calibrate.stages.prepare.server_cap import read_server_cap
from calibrate.stages.prepare.workload_plan import prepare_workload
from calibrate.stages.sweep.levels import Level
from calibrate.stages.sweep.result import SweepResult
from calibrate.stages.sweep.run import Sweep
from calibrate.stages.sweep.spec import SweepOptions
from calibrate.stages.tune.grid import Candidate
from calibrate.stages.tune.result import BestLevel, LevelLine, Measurement
from calibrate.workload import WorkloadSpec

Notify = Callable[[str], None]


@dataclass(frozen=True)
class MeasureSettings:
    """How every candidate is measured: the sweep's levels and window, the workload, the SLOs."""

    spec: MeasureSpec
    levels: tuple[int, ...]
    stream: bool
    workload: WorkloadSpec
    pool: TaskPool | None  # the tasks of a --tasks workload, read once for every candidate
    ladder_run_id: str
    slo: SloConfig  # [slo]: goodput counts the requests within every bound
    skipped_levels: tuple[int, ...] = ()  # above what the ladder proved in flight: not measured
    proven_in_flight: int = 0  # the most requests the ladder held in flight in a passing tier

    def skipped_note(self) -> str:
        """Why levels of ``[tune] concurrency`` are not measured ("" when none is skipped)."""
        if not self.skipped_levels:
            return ""
        return (
            f"concurrency {', '.join(map(str, self.skipped_levels))} skipped: the ladder passed "
            f"with at most {self.proven_in_flight} requests in flight, and tune measures every "
            f"candidate within that load (levels {', '.join(map(str, self.levels))})"
        )

    def sweep_options(self, cfg: Config, cap: int, window: float) -> SweepOptions:
        """The sweep's own options at this cap, each level's window scaled by ``window``."""
        options = SweepOptions.from_config(
            cfg, cap, stream=self.stream, ladder_run_id=self.ladder_run_id, slo=self.slo
        )
        return dataclasses.replace(options, levels=self.levels, level_s=options.level_s * window)

    def to_json(self, cfg: Config) -> dict[str, Any]:
        """What decides the measurements (part of the grid fingerprint)."""
        options = self.sweep_options(cfg, 1, 1.0)
        return {
            "levels": list(self.levels),
            "level_s": options.level_s,
            "repeats": options.repeats,
            "gain_min": options.gain_min,
            "mode": options.mode,
            "stream": self.stream,
            "workload": self.workload.describe(),
            "prompt": cfg.prompt.text,
            "max_tokens": cfg.prompt.max_tokens,
            "slo": dataclasses.asdict(self.slo),
            **_unless_default(cfg),
        }


def _unless_default(cfg: Config) -> dict[str, Any]:
    """The rest of what decides a candidate's figures — how many runs a level may take, the
    interval its best level is judged on, the fixed-prompt copies sent beside it, the requests'
    deadline — each only where it is set away from its default, so that a run begun before
    these counted keeps its fingerprint and resumes as it did."""
    given = {
        "max_repeats": (cfg.sweep, "max_repeats"),
        "confidence": (cfg.confidence, "level"),
        "determinism_copies": (cfg.determinism, "copies"),
        "timeout_s": (cfg.target, "timeout_s"),
    }
    return {
        key: getattr(section, name)
        for key, (section, name) in given.items()
        if getattr(section, name) != getattr(type(section)(), name)
    }


def candidate_run(tune_run: RunDir, candidate: Candidate, rung: int, again: bool = False) -> RunDir:
    """The candidate's own folder inside the tune run (one per rung of a halving search, and
    one for its second measurement when it is one of the first two)."""
    name = candidate.slug + (f"-rung{rung}" if rung else "") + ("-again" if again else "")
    return RunDir(tune_run.path / "candidates", "tune", run_id=name)


def measure_candidate(
    ctx: StageContext,
    settings: MeasureSettings,
    candidate: Candidate,
    run: RunDir,
    *,
    window: float,
    notify: Notify,
) -> Measurement:
    """The sweep's measurement of the started candidate, at increasing concurrency."""
    sub = dataclasses.replace(ctx, run=run)
    options = settings.sweep_options(ctx.config, candidate.cap, window)

    def shown(level: Level) -> None:
        s = level.stats
        p50 = s.latency_p50_s or 0.0
        notify(
            f"  {candidate.id} concurrency {s.concurrency}: {s.items_per_s:.2f} items/s, "
            f"p50 {p50:.3f} s, {s.errors} errors"
        )

    with measuring(settings.spec, sub) as watch:
        for line in watch.monitor.warnings():  # a memory source that failed, named
            notify(f"  {candidate.id}: warning: {line}")
        cap = read_server_cap(sub.client.get_text)
        # each candidate is a fresh server: the workload is probed (token counts) on it again
        plan = prepare_workload(
            ctx.config,
            sub.client,
            settings.workload,
            options.mode,
            ctx.params,
            kind=ctx.server_kind,
            pool=settings.pool,
        )
        sweep = Sweep(
            sub,
            options,
            watch.monitor,
            watch.incidents,
            Sender.over(sub.client),
            cap,
            plan=plan,
            noise=watch.noise,
        )
        sweep.on_level = shown
        try:
            result = sweep.run()
        finally:
            run.close()
    found = measurement(result, settings.slo, options.gain_min)
    if watch.monitor.measured and _unread(found):
        notify(
            f"  {candidate.id}: memory not read while it ran (the {watch.monitor.source} sampler "
            f"took no reading inside any run, {watch.monitor.interval_s:g} s apart; a busy "
            "machine delays it): peak unknown — lower [ladder] sample_interval_s, or lengthen "
            "[tune] window"
        )
    return found


def _unread(found: Measurement) -> bool:
    """No memory figure at all from a source that reads one: every window closed unread."""
    figures = (found.peak_vram_mib, found.peak_kv_usage, found.pressure)
    return bool(found.levels) and all(figure is None for figure in figures)


def _goodput(stats: Stats, slo: SloConfig) -> float:
    """The sweep's own goodput of a level or run: within every ``[slo]`` bound over its steady
    window; with no SLOs, every successful request over it (its throughput)."""
    return (stats.goodput_per_s or 0.0) if has_slo(slo) else stats.items_per_s


def measurement(result: SweepResult, slo: SloConfig, gain_min: float) -> Measurement:
    """The levels as the sweep measured them; the best is the lowest concurrency within
    ``gain_min`` of the highest goodput among passing levels the sweep itself would judge
    (more in flight that adds nothing is not better): never one above the server's own cap,
    nor one where the client was the limit (SPEC §5.14, §6.1)."""
    rows: list[dict[str, Any]] = []
    passing: list[BestLevel] = []
    judged = result.judged
    for level in result.levels:
        s = level.stats
        goodput = _goodput(s, slo)
        each = [_goodput(r, slo) for r in level.runs]
        line = LevelLine(
            s.concurrency,
            round(goodput, 4),
            round(s.items_per_s, 4),
            s.errors,
            s.latency_p50_s,
            level.verdict,
        )
        rows.append(line.to_json())
        if level.verdict == "pass" and goodput > 0 and any(level is lv for lv in judged):
            passing.append(
                BestLevel(
                    s.concurrency,
                    goodput,
                    s.items_per_s,
                    s.output_tokens_per_s,
                    s.latency_p50_s,
                    s.latency_p90_s,
                    s.ttft_p50_s,
                    s.joules_per_output_token,
                    s.usd_per_1m_output_tokens,
                    tuple(each),
                )
            )
    top = max((b.goodput_per_s for b in passing), default=0.0)
    best = next((b for b in passing if b.goodput_per_s * (1 + gain_min) >= top), None)
    stats = [lv.stats for lv in result.levels]

    def peak(values: list[float | None]) -> float | None:
        return max((v for v in values if v is not None), default=None)

    return Measurement(
        best,
        tuple(rows),
        sum(s.errors for s in stats),
        result.incidents,
        peak([s.peak_vram_mib for s in stats]),
        peak([s.peak_kv_usage for s in stats]),
        peak([s.pressure for s in stats]),
        result.vram_source,
        result.stopped_by,
        limit.slots if (limit := result.running_limit) is not None else None,
        combined(lv.stats.noise for lv in result.levels),
    )
