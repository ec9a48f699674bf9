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

from calibrate import server
from calibrate.engines.args import ServerKind
from calibrate.engines.builders import SERVER_KINDS, EngineCommand, build
from calibrate.errors import ConfigError, GateClosed
from calibrate.gpu.energy import pinned_cost
from calibrate.io.records import utc_now_iso
from calibrate.io.store import read_object, run_path
from calibrate.server import launch_script
from calibrate.server.launch_script import PinnedValues
from calibrate.server.process import running_kind
from calibrate.stages.context import StageContext
from calibrate.stages.pin_context import context_for
from calibrate.state.gates import next_step
from calibrate.state.setting import resolve
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
    chosen = chosen or running_kind(cfg.runs_dir, cfg.server.kind)
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


def refuse_unrun_cap(ctx: StageContext, run_id: str, batch: int) -> None:
    """pin never writes a cap the server did not run (SPEC §6.1): when the run that set the
    setting saw the server run fewer than its batch size at once (its reported cap, or its own
    running count while requests waited), the script would pin a batch never measured."""
    entry = ctx.ledger.view().of_run(run_id)
    for key in ("server_cap", "server_limit"):
        cap = entry.summary.get(key) if entry is not None else None
        slots = cap.get("slots") if isinstance(cap, dict) else None
        if entry is not None and isinstance(slots, int) and 0 < slots < batch:
            raise GateClosed(
                f"pin refused: {entry.stage} run {run_id} saw the server run at most {slots} "
                f"at once ({cap.get('source') if isinstance(cap, dict) else ''}), below the "
                f"batch size {batch}: an engine cap of {batch} was never run",
                "Run first: calibrate ladder   (against the server as it runs now)",
            )


def run_pin(ctx: StageContext, *, kind: str | None = None, out: Path | None = None) -> PinResult:
    """Write the launch script for the calibrated setting, record the pin in the ledger and
    close the run; the result carries the next step."""
    setting = resolve(ctx.ledger, ctx.target)
    if setting is None:
        raise GateClosed(
            "pin has no verified batch size: no ladder with a passing tier",
            "Run first: calibrate ladder",
        )
    refuse_unrun_cap(ctx, setting.run_id, setting.batch_size)
    engine = resolve_kind(ctx, kind, setting.run_id)
    cfg = ctx.config
    batch, concurrency = setting.batch_size, setting.concurrency
    tuned = setting.tuned
    # llama.cpp's slots are the engine's cap, which is the batch size (SPEC §5.0); a tuned -c wins
    sized = None
    if not any(key == "ctx_size" for key, _ in tuned):
        sized = context_for(ctx.ledger, ctx.target, cfg.runs_dir, engine, batch)
    tokens = sized.context_tokens if sized else None
    command = build(server.launch_spec(cfg, engine, batch, concurrency, tokens, tuned))
    tuned_text = ""
    if tuned:
        flags = ", ".join(f"{k}={v}" for k, v in tuned)
        tuned_text = f"{setting.tuned_by or 'a tune run'}: {flags}"
    values = PinnedValues(
        kind=engine,
        model_path=cfg.server.model_path,
        port=cfg.server.port,
        batch_size=batch,
        concurrency=concurrency,
        verified_by=setting.batch_from,
        verified_at=setting.ts,
        concurrency_from=setting.concurrency_from,
        pinned_by=ctx.run.run_id,
        pinned_at=utc_now_iso(),
        workload=setting.verified_on(),
        context=sized.describe() if sized else "",
        tuned=tuned_text,
        cost=pinned_cost(ctx.ledger.view().entries, setting.run_id, batch, concurrency),
    )
    text = launch_script.render(values, command)
    path = out or cfg.scripts_dir / "launch.sh"
    launch_script.write(path, text)
    ctx.run.write_text("launch.sh", text)
    result = PinResult(path, values, command, tuned, setting.tuned_by if tuned else "")
    ctx.record_result(True, result.summary())
    ctx.run.close()
    return replace(result, next_command=next_step(cfg, ctx.ledger, ctx.target))
