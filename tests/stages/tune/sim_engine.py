"""The simulated tune of tests/stages/tune: a ``Lifecycle`` whose every candidate is a simulated
``{slots}``-slot server (``stage_fakes.SimulatedLoop``, a virtual clock) measured by the real
``Sweep`` and read back as tune reads it, and the real ``Tune`` driving it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from calibrate.config import Config, SloConfig, SweepConfig, TuneSearch
from calibrate.config.sections import DeterminismConfig
from calibrate.gpu.vram import VramMonitor
from calibrate.io.store import RunDir
from calibrate.stages.sweep.run import Sweep
from calibrate.stages.sweep.spec import SweepOptions
from calibrate.stages.tune.grid import Candidate, TunePlan, build_plan
from calibrate.stages.tune.measure import measurement
from calibrate.stages.tune.outcome import TuneOutcome
from calibrate.stages.tune.result import CandidateResult, MemoryProbe
from calibrate.stages.tune.search import Tune
from calibrate.stages.tune.store import TuneStore
from tests.stage_fakes import SimulatedLoop, open_run, recorder, stage_ctx

LEVELS = (1, 2, 4)  # tests/tune_helpers.py's [sweep] concurrency
SERVICE_S = 0.1  # one answer on a slot: SERVER_BOUND's ~0.1 s
PLACEHOLDERS = ("port", "slots", "kv_tokens", "memory_fraction")


@dataclass
class Clock:
    """Tune's clock: the virtual seconds every candidate's sweep took, added up."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class SweepEngine:
    """The ``Lifecycle`` a tune drives: a start above ``max_fraction`` fails like an engine
    whose cache does not fit (the mock's ``--max-memory-fraction``); each candidate is a
    simulated ``{slots}``-slot server measured by the real sweep at ``LEVELS``."""

    root: Path
    slo: SloConfig = field(default_factory=SloConfig)
    level_s: float = 0.1
    repeats: int = 1
    copies: int = 0  # [determinism] copies after each level's window
    max_fraction: float = 0.8
    # a machine that slows as the tune goes on: each start serves this fraction slower than the
    # one before (its runs a hair apart, as a real server's are)
    drift: float = 0.0
    clock: Clock = field(default_factory=Clock)
    started: list[tuple[str, int, float]] = field(default_factory=list)  # (id, rung, window)
    loops: dict[tuple[str, int], SimulatedLoop] = field(default_factory=dict)

    def probe_memory(self, candidate: Candidate, fraction: str) -> MemoryProbe:
        if float(fraction) > self.max_fraction:
            oom = ("torch.OutOfMemoryError: CUDA out of memory",)
            return MemoryProbe(fraction, False, False, 1, "the server exited (exit code 1)", oom)
        return MemoryProbe(fraction, True, True, None, "", ())

    def run(
        self, candidate: Candidate, rung: int, window: float, _run: RunDir, again: bool = False
    ) -> CandidateResult:
        slower = (1 + self.drift) ** len(self.started)
        self.started.append((candidate.id + " again" * again, rung, window))
        slots = int(candidate.value("slots") or 1)
        sweep = replace(SweepConfig(), concurrency=LEVELS, level_s=self.level_s)
        cfg = Config(
            sweep=replace(sweep, repeats=self.repeats),
            slo=self.slo,
            determinism=DeterminismConfig(self.copies),
        )
        ctx = stage_ctx(self.root / f"{candidate.slug}-{rung}", cfg, "sweep")
        options = SweepOptions.from_config(cfg, candidate.cap, slo=self.slo)
        options = replace(options, levels=LEVELS, level_s=options.level_s * window)

        def service(_concurrency: int, repeat: int) -> float:
            return SERVICE_S * slower * (1 + 0.01 * (repeat % 2) if self.drift else 1.0)

        loop = SimulatedLoop(service, slots=slots)
        self.loops[(candidate.id, rung)] = loop
        monitor = VramMonitor([])
        result = Sweep(ctx, options, monitor, recorder(ctx, monitor, self.root), loop).run()
        self.clock.now += loop.clock.now()
        measured = measurement(result, self.slo, options.gain_min)
        return CandidateResult(candidate, rung, window, True, served=True, measurement=measured)


def sim_plan(grid: str, fractions: tuple[float, ...] = ()) -> TunePlan:
    """The grid of ``{slots}`` (and kv_tokens) at a ladder's batch 4; with ``fractions`` the
    memory step tries them first, else the grid fixes memory_fraction=0.8 itself."""
    fixed = [] if fractions else ["memory_fraction=0.8"]
    return build_plan(
        "custom",
        4,
        config_grid=[grid, "kv_tokens=50000", *fixed],
        cli_grid=[],
        memory_fractions=fractions,
        placeholders=PLACEHOLDERS,
    )


def sim_tune(
    tmp_path: Path,
    engine: SweepEngine,
    plan: TunePlan,
    search: TuneSearch = "grid",
    *,
    run_id: str | None = None,
    budget_s: float = 0.0,
    said: list[str] | None = None,
    restarts: int = 0,
) -> TuneOutcome:
    run = open_run(tmp_path / "runs", "tune", run_id)
    notes = said if said is not None else []
    tune = Tune(
        plan,
        TuneStore(run),
        engine,  # type: ignore[arg-type]
        search,
        1.0,
        budget_s,
        notes.append,
        clock=engine.clock,
        restarts=restarts,
    )
    return tune.run()
