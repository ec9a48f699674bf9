"""Stage E: write the verified setting into a launch script for the engine (SPEC §5.8).

BATCH_SIZE and MAX_CONCURRENCY are the calibrated setting (``calibrate.state.setting.resolve``): the
ladder's last passing tier with the sweep's recommendation, a newer tune winner, or a newer
rollback; the engine's cap is the batch size (SPEC §5.0). After a tune every engine flag of the
winner is written too, and the header names the tune run. The script is built by the
same builder ``calibrate server start`` uses, so what is pinned is what calibrate would run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from calibrate.engines import find
from calibrate.engines.args import ServerKind
from calibrate.engines.base import LaunchSpec
from calibrate.engines.builders import SERVER_KINDS, EngineCommand, build
from calibrate.errors import ConfigError, GateClosed, StageFailed, os_error_text, unwritten
from calibrate.gpu.energy import pinned_cost
from calibrate.io.records import utc_now_iso
from calibrate.io.store import read_object, run_path
from calibrate.server import launch_script
from calibrate.server import lifecycle as server
from calibrate.server.launch_script import PinnedValues
from calibrate.server.process.target import running_kind
from calibrate.stages.context import StageContext
from calibrate.stages.pin_context import ASSUMED_SPLIT, JobInput, context_for
from calibrate.stages.setting_reasons import measured_by, named_run, reasons
from calibrate.state.gates import next_step, unrun_cap
from calibrate.state.ledger import LedgerView, current_weights
from calibrate.state.setting import CalibratedSetting, resolve
from calibrate.state.summaries import PinSummary
from calibrate.state.summary_values import Setting


@dataclass(frozen=True)
class PinResult:
    script: Path
    values: PinnedValues
    command: EngineCommand
    tuned: tuple[tuple[str, str], ...] = ()
    tuned_by: str = ""
    next_command: str = ""  # ``gates.next_step`` once the pin is recorded
    model_from: str = ""  # where the model path came from when [server] model_path is empty
    above_cap: str = ""  # the concurrency was measured with the server above the pinned cap

    def summary(self) -> PinSummary:
        v = self.values
        details = {
            "port": v.port,
            "verified_by": v.verified_by,
            "concurrency_from": v.concurrency_from,
            "command": self.command.display(),
            "tuned_by": self.tuned_by or None,
        }
        setting = Setting(v.batch_size, v.concurrency)
        return PinSummary(setting, v.kind, str(self.script), details, self.tuned)


def resolve_kind(ctx: StageContext, kind: str | None, measured_in: str = "") -> ServerKind:
    """--kind; else the kind the setting was measured on (its run's manifest, ``measured_in``);
    else what the managed server runs as; else [server] kind."""
    cfg = ctx.config
    chosen = kind or _measured_kind(cfg.runs_dir, measured_in)
    chosen = chosen or running_kind(cfg)
    for known in SERVER_KINDS:
        if known == chosen:
            return known
    raise ConfigError(
        "pin needs the server kind to write its launch command",
        f"Set [server] kind in calibrate.toml or pass --kind ({' | '.join(SERVER_KINDS)}).",
    )


def _measured_kind(runs_dir: Path, run_id: str) -> str | None:
    """The engine kind the run's manifest says the server ran as (None: no run, an older run,
    or no readable manifest)."""
    if not run_id:
        return None
    found = read_object(run_path(runs_dir, run_id) / "manifest.json").get("server_kind")
    return found if isinstance(found, str) else None


def refuse_unrun_cap(ctx: StageContext, setting: CalibratedSetting) -> None:
    """pin never writes a cap the server did not run (SPEC §6.1): when the run that set the
    setting saw the server run fewer than its batch size at once (its reported cap, or its own
    running count while requests waited), the script would pin a batch never measured."""
    gate = unrun_cap(ctx.ledger, setting)
    if not gate.open:
        raise GateClosed(
            f"pin refused: {gate.reason}",
            f"Run first: {gate.run_first}   (against the server as it runs now)",
        )


def ran_above_cap(ctx: StageContext, setting: CalibratedSetting) -> str:
    """When the sweep that set the concurrency measured it while the server ran more at once
    than the batch size the script caps it at (a server calibrate does not manage keeps its own
    cap: the sweep goes up to the ladder's largest passing in-flight count): what that leaves
    unmeasured ("" otherwise). The throughput at that concurrency came from running more than
    the script's cap allows."""
    entry = measured_by(ctx.ledger.view(), setting).get("sweep")  # set, held or pinned from it
    levels = entry.summary.get("levels") if entry is not None else None
    batch, concurrency = setting.batch_size, setting.concurrency
    for level in levels if isinstance(levels, list) else ():
        if not isinstance(level, dict):  # a damaged ledger line: nothing said of that level
            continue
        measured = level.get("measured")
        seen = measured.get("server_running_max") if isinstance(measured, dict) else None
        if level.get("concurrency") == concurrency and isinstance(seen, int) and seen > batch:
            return (
                f"sweep: concurrency {concurrency} was measured while the server ran up to {seen} "
                f"at once, above this script's cap of {batch}: its throughput there was not "
                f"measured at this cap — after starting the server from this script, run "
                f"calibrate sweep again"
            )
    return ""


def _verified_at(view: LedgerView, setting: CalibratedSetting) -> str:
    """When the run that verified the batch size ran: the setting's own time is its latest
    run's — a sweep's, after the ladder — and "verified by ladder run L at <the sweep's time>"
    dated the ladder by another run."""
    entry = named_run(view, setting.batch_from)
    return entry.ts if entry is not None else setting.ts


def _how_sure(view: LedgerView, setting: CalibratedSetting) -> tuple[str, ...]:
    """How sure the runs the setting came from were ("not sure", "taken under noise"): the
    ladder's line when it set the batch size, the sweep's when it set the concurrency, the
    tune's when its winner set them — those runs', never a later one's that set nothing."""
    return reasons(measured_by(view, setting), ("ladder", "sweep", "tune"))


def _default_context(kind: str, slots: int, tuned: tuple[tuple[str, str], ...]) -> str:
    """A shared context left at the engine's default per slot: said, with how to size it for
    the job (nothing for an engine whose slots do not share one, or a tuned -c)."""
    shared = find(kind)
    if shared is None or shared.ctx_per_slot is None or any(k == "ctx_size" for k, _ in tuned):
        return ""
    return (
        f"-c {slots * shared.ctx_per_slot} = {slots} slot{'s' if slots != 1 else ''} x "
        f"calibrate's default of {shared.ctx_per_slot} a slot ({ASSUMED_SPLIT}): the ladder sent "
        "no input shaped like the job; size it with calibrate pin --tasks FILE (the batch "
        "input), or set -c in [server] args"
    )


def _loads_a_path(spec: LaunchSpec) -> bool:
    """Whether the launch command names the weights' path (Ollama pulls by name; a custom
    command only where it has a {model_path} placeholder)."""
    if spec.kind == "custom":
        return "{model_path}" in spec.command
    found = find(spec.kind)
    return found is not None and found.needs_model_path


def run_pin(
    ctx: StageContext,
    *,
    kind: str | None = None,
    out: Path | None = None,
    job: JobInput | None = None,
) -> PinResult:
    """Write the launch script for the calibrated setting, record the pin in the ledger and
    close the run; the result carries the next step."""
    setting = resolve(ctx.ledger, ctx.target)
    if setting is None:
        raise GateClosed(
            "pin has no verified batch size: no ladder with a passing tier",
            "Run first: calibrate ladder",
        )
    refuse_unrun_cap(ctx, setting)
    above = ran_above_cap(ctx, setting)
    engine = resolve_kind(ctx, kind, setting.run_id)
    cfg = ctx.config
    batch, concurrency = setting.batch_size, setting.concurrency
    tuned = setting.tuned
    # llama.cpp's slots are the engine's cap, which is the batch size (SPEC §5.0); a tuned -c wins
    sized = None
    if not any(key == "ctx_size" for key, _ in tuned):
        sized = context_for(
            ctx.ledger, ctx.target, cfg.runs_dir, engine, batch, args=cfg.server.args, job=job
        )
    tokens = sized.context_tokens if sized else None
    spec = server.launch_spec(cfg, engine, batch, concurrency, tokens, tuned)
    if cfg.server.kind is None:  # no [server] set up: serve where the calibrated server did
        spec = replace(spec, port=urlsplit(cfg.target.base_url).port or spec.port)
    model_from = ""
    if not spec.model_path and _loads_a_path(spec):  # what the server said it serves (root)
        root = current_weights(cfg, ctx.ledger, ctx.target).served_root
        spec = replace(spec, model_path=root)
        model_from = f"model path {root} from the server's /v1/models" if root else ""
    command = build(spec)
    context = sized.describe() if sized else _default_context(engine, batch, tuned)
    tuned_text = ""
    if tuned:
        flags = ", ".join(f"{k}={v}" for k, v in tuned)
        tuned_text = f"{setting.tuned_by or 'a tune run'}: {flags}"
    values = PinnedValues(
        kind=engine,
        model_path=spec.model_path,
        port=spec.port,
        batch_size=batch,
        concurrency=concurrency,
        verified_by=setting.batch_from,
        verified_at=_verified_at(ctx.ledger.view(), setting),
        concurrency_from=setting.concurrency_from,
        pinned_by=ctx.run.run_id,
        pinned_at=utc_now_iso(),
        workload=setting.verified_on(),
        context=context,
        tuned=tuned_text,
        cost=pinned_cost(ctx.ledger.view().entries, setting.run_id, batch, concurrency),
        how_sure=(
            *_how_sure(ctx.ledger.view(), setting),
            *filter(None, [above]),
        ),
    )
    text = launch_script.render(values, command)
    path = out or cfg.scripts_dir / "launch.sh"
    try:
        launch_script.write(path, text)
    except OSError as exc:  # a full disk exit 1, a path that cannot be written exit 2
        raise unwritten(exc, "nothing was written and nothing pinned") from exc
    result = PinResult(
        path,
        values,
        command,
        tuned,
        setting.tuned_by if tuned else "",
        model_from=model_from,
        above_cap=above,
    )
    try:
        ctx.run.write_text("launch.sh", text)
        ctx.record_result(True, result.summary())
    except OSError as exc:  # the script is in place: say so, not "fix the path"
        raise StageFailed(
            f"pin wrote {path} but could not record it ({os_error_text(exc)}): status, verify "
            "and run do not know this pin",
            "Free space or fix permissions, then run it again: calibrate pin",
        ) from exc
    ctx.run.close()
    return replace(result, next_command=next_step(cfg, ctx.ledger, ctx.target))
