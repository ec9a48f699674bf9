"""Stage E: write the verified setting into a launch script for the engine (SPEC §5.8).

BATCH_SIZE is the last passing ladder tier (or a rollback's active setting, if newer);
MAX_CONCURRENCY is the latest passing sweep's recommendation, else 1. The script is built by the
same builder ``calibrate server start`` uses, so what is pinned is what calibrate would run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from calibrate import server
from calibrate.config import ServerKind
from calibrate.errors import ConfigError, GateClosed
from calibrate.records import utc_now_iso
from calibrate.server import launch_script
from calibrate.server.builders import SERVER_KINDS, EngineCommand, build
from calibrate.server.launch_script import PinnedValues
from calibrate.stages.active import verified_batch
from calibrate.stages.context import StageContext
from calibrate.stages.pin_context import WorkloadContext, verified_workload


@dataclass(frozen=True)
class PinResult:
    script: Path
    values: PinnedValues
    command: EngineCommand

    def summary(self) -> dict[str, Any]:
        v = self.values
        return {"batch_size": v.batch_size, "concurrency": v.concurrency, "kind": v.kind,
                "script": str(self.script), "port": v.port, "verified_by": v.verified_by,
                "concurrency_from": v.concurrency_from, "command": self.command.display()}  # fmt: skip


def recommended_concurrency(ctx: StageContext) -> tuple[int, str]:
    """The latest passing sweep's recommendation for this target, else 1."""
    sweep = ctx.ledger.latest("sweep", ctx.target, passed=True)
    value = sweep.summary.get("recommended_concurrency") if sweep else None
    if sweep and isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value, f"sweep run {sweep.run_id}"
    return 1, "default 1 (no sweep has passed for this target)"


def resolve_kind(ctx: StageContext, kind: str | None) -> ServerKind:
    chosen = kind or ctx.config.server.kind
    for known in SERVER_KINDS:
        if known == chosen:
            return known
    raise ConfigError(
        "pin needs the server kind to write its launch command",
        f"Set [server] kind in calibrate.toml or pass --kind ({' | '.join(SERVER_KINDS)}).",
    )


def run_pin(ctx: StageContext, *, kind: str | None = None, out: Path | None = None) -> PinResult:
    """Write the launch script and record the pin in the ledger."""
    engine = resolve_kind(ctx, kind)
    verified = verified_batch(ctx.ledger, ctx.target)
    if verified is None:
        raise GateClosed("pin has no verified batch size: no ladder with a passing tier",
                         "Run first: calibrate ladder")  # fmt: skip
    batch, entry = verified
    concurrency, concurrency_from = recommended_concurrency(ctx)
    cfg = ctx.config
    sized = _llamacpp_context(ctx, max(batch, concurrency)) if engine == "llamacpp" else None
    tokens = sized.context_tokens if sized else None
    command = build(server.launch_spec(cfg, engine, batch, concurrency, tokens))
    source = f"{'ladder' if entry.stage == 'ladder' else 'rollback'} run {entry.run_id}"
    values = PinnedValues(
        kind=engine, model_path=cfg.server.model_path, port=cfg.server.port, batch_size=batch,
        concurrency=concurrency, verified_by=source, verified_at=entry.ts,
        concurrency_from=concurrency_from, pinned_by=ctx.run.run_id, pinned_at=utc_now_iso(),
        context=sized.describe() if sized else "",
    )  # fmt: skip
    text = launch_script.render(values, command)
    path = out or cfg.scripts_dir / "launch.sh"
    launch_script.write(path, text)
    ctx.run.write_text("launch.sh", text)
    result = PinResult(path, values, command)
    ctx.record_result(True, result.summary())
    return result


def _llamacpp_context(ctx: StageContext, slots: int) -> WorkloadContext | None:
    """-c from the latest passing ladder's requests (None: the builder's default per slot)."""
    ladder = ctx.ledger.latest("ladder", ctx.target, passed=True)
    return verified_workload(ctx.config.runs_dir, ladder.run_id, slots) if ladder else None
