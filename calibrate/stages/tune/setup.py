"""Before a tune starts anything: the engine, the plan, how candidates are measured, the run.

Everything a user can get wrong is found here (exit 2, nothing started): no ``[server]``, an
unknown flag or placeholder, a value that is not allowed, a grid too large — the first
candidate's command is built once, dry. The grid fingerprint (the plan, the workload, the
windows, the engine command) picks the unfinished run to continue, unless ``--new``.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field

from calibrate.config import SloConfig, TuneSearch
from calibrate.engines import engine, redaction, shell_words
from calibrate.engines.args import ServerKind
from calibrate.engines.builders import SERVER_KINDS, build
from calibrate.errors import ConfigError, UsageError
from calibrate.gpu.energy import RankBy
from calibrate.io.store import RunDir
from calibrate.io.tasks import TaskPool
from calibrate.redact import redact_url
from calibrate.server import lifecycle as server
from calibrate.server.process.target import serves_target
from calibrate.stages.context import StageContext
from calibrate.stages.measure.tier_run import MeasureSpec
from calibrate.stages.pin_context import verified_workload
from calibrate.stages.prepare.server_cap import safe_levels
from calibrate.stages.tune.grid import TunePlan, build_plan
from calibrate.stages.tune.measure import MeasureSettings
from calibrate.stages.tune.store import find_unfinished, fingerprint
from calibrate.state.setting import latest_passing_ladder
from calibrate.workload import WorkloadSpec

NEEDS_SERVER = (
    'Add [server] to calibrate.toml: kind = "vllm" (or llamacpp, sglang, lmdeploy, tgi, '
    'ollama) and model_path = "/models/…", or kind = "custom" and command = "… {port} …"; '
    "or pass --kind."
)


@dataclass(frozen=True)
class TuneRequest:
    """What the command line asked for (None: from ``[tune]``)."""

    spec: MeasureSpec
    kind: str | None = None
    grid: tuple[str, ...] = ()
    search: TuneSearch | None = None
    budget_s: float | None = None
    new_run: bool = False
    stream: bool = False
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    pool: TaskPool | None = None  # --tasks, read once by the command: every candidate's
    rank_by: RankBy = "goodput"
    slo: SloConfig | None = None  # --slo NAME:S … over [slo], parsed; None: [slo] as it is
    conservative: bool = False  # --conservative: a winner noise leaves in doubt takes the smaller
    restarts: int | None = None  # --restarts: at most this many candidate restarts; 0: no cap
    patience: int | None = None  # --patience: refine stops after this many without a gain


@dataclass(frozen=True)
class TuneSetup:
    ctx: StageContext  # its run is the tune run (a resumed one, or a new one)
    kind: ServerKind
    plan: TunePlan
    settings: MeasureSettings
    fingerprint: str
    search: TuneSearch
    budget_s: float
    window: float
    resumed: bool
    ladder_run_id: str
    rank_by: RankBy = "goodput"
    conservative: bool = False
    restarts: int = 0  # at most this many candidate restarts in the run; 0: no cap
    patience: int = 6  # refine: candidates in a row without a significant gain


def engine_kind(ctx: StageContext, asked: str | None) -> ServerKind:
    """The managed engine's kind; tune restarts it per candidate, so one is required (exit 2)."""
    chosen = asked or ctx.config.server.kind
    kind = next((k for k in SERVER_KINDS if k == chosen), None)
    if kind is None:
        raise UsageError(
            "tune restarts the engine for every candidate, so calibrate must manage it: "
            "no [server] kind is configured",
            NEEDS_SERVER,
        )
    if engine(kind).templated and not ctx.config.server.command.strip():
        raise ConfigError("[server] kind is custom but [server] command is empty", NEEDS_SERVER)
    return kind


def _placeholders(command: str) -> tuple[str, ...]:
    try:
        return shell_words.placeholders(shlex.split(command))
    except ValueError as exc:
        raise ConfigError(f"[server] command cannot be split into arguments: {exc}") from exc


def prepare(ctx: StageContext, request: TuneRequest) -> TuneSetup:
    """The plan and the run to write to; every mistake is exit 2 before anything starts."""
    cfg = ctx.config
    kind = engine_kind(ctx, request.kind)
    if not serves_target(cfg, cfg.server.port):  # else every candidate measures one other server
        raise UsageError(
            f"tune starts each candidate on port {cfg.server.port} of this machine, but the "
            f"target is {redact_url(cfg.target.base_url)}: its measurements would not be of the "
            "candidates",
            f"Set [target] base_url to http://127.0.0.1:{cfg.server.port}/v1, or [server] port "
            "to the target's port.",
        )
    price = request.spec.gpu_price_per_hour
    if request.rank_by == "usd_per_1m" and price is None and cfg.cost.gpu_price_per_hour is None:
        raise UsageError(
            "--rank-by usd_per_1m needs a GPU price: none given",
            "Add --gpu-price-per-hour USD (or [cost] gpu_price_per_hour in calibrate.toml).",
        )
    ladder = latest_passing_ladder(ctx.ledger, ctx.target)
    top = ladder[0].last_passing if ladder else None
    batch = top.batch_size if top else 1
    ladder_run = ladder[1].run_id if ladder else ""
    per_slot = verified_workload(cfg.runs_dir, ladder_run, 1) if ladder_run else None
    plan = build_plan(
        kind,
        batch,
        config_grid=cfg.tune.grid,
        cli_grid=request.grid,
        memory_fractions=cfg.tune.memory_fractions,
        placeholders=_placeholders(cfg.server.command) if engine(kind).templated else (),
        ctx_per_slot=per_slot.context_tokens if per_slot else None,
    )
    first = plan.probe(plan.memory_fractions[0]) if plan.memory_key else plan.candidates()[0]
    build(server.launch_spec(cfg, kind, first.cap, first.cap, tuned=first.flags))  # dry: exit 2
    # candidates are measured within the load the ladder proved, as a sweep against a server
    # calibrate does not cap (SPEC §5.0): a candidate whose cap is above B would otherwise
    # meet more requests at once than any tier held, and every one fail the same way
    proven = ladder[0].max_in_flight if ladder else 0
    levels, skipped = safe_levels(
        cfg.tune.concurrency or cfg.sweep.concurrency, proven, managed=False, beyond_ladder=False
    )
    slo = request.slo if request.slo is not None else cfg.slo
    settings = MeasureSettings(
        request.spec,
        levels,
        request.stream or slo.needs_stream,  # a TTFT/TPOT SLO is measured on streamed answers
        request.workload,
        request.pool,
        ladder_run,
        slo,
        skipped,
        proven,
    )
    search = request.search or cfg.tune.search
    budget = request.budget_s if request.budget_s is not None else cfg.tune.budget_s
    identity = {
        "plan": plan.to_json(),
        "measure": settings.to_json(cfg),
        "search": search,
        "window": cfg.tune.window,
        "command": cfg.server.command if engine(kind).templated else "",
        **({"args": list(redaction.redact_argv(cfg.server.args))} if cfg.server.args else {}),
        "model_path": cfg.server.model_path,
        "target": ctx.target,
        # every candidate runs with [server] env: one measured with other values is another run
        # (values hashed, never kept; absent when none is set, so runs before resume as they were)
        **({"env": fingerprint(dict(cfg.server.env))} if cfg.server.env else {}),
    }
    grid_fingerprint = fingerprint(identity)
    found = None if request.new_run else find_unfinished(cfg.runs_dir, grid_fingerprint)
    if found is not None:
        ctx = dataclasses.replace(ctx, run=RunDir(cfg.runs_dir, "tune", run_id=found))
    return TuneSetup(
        ctx,
        kind,
        plan,
        settings,
        grid_fingerprint,
        search,
        budget,
        cfg.tune.window,
        found is not None,
        ladder_run,
        request.rank_by,
        request.conservative or cfg.confidence.conservative,
        request.restarts if request.restarts is not None else cfg.tune.restarts,
        request.patience if request.patience is not None else cfg.tune.patience,
    )
