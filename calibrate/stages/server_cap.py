"""Before a sweep: a managed server runs at the verified batch size as its cap (SPEC §5.0).

With the engine's own cap at B, a concurrency above B queues in the server instead of raising
memory past what the ladder proved, so every sweep level is safe. A server calibrate does not
manage cannot be capped; the sweep then limits what it sends instead (``safe_levels``).
"""

from __future__ import annotations

from collections.abc import Callable

from calibrate import server
from calibrate.config import ServerKind
from calibrate.server import process
from calibrate.server.builders import SERVER_KINDS
from calibrate.stages.context import StageContext
from calibrate.stages.pin_context import context_for


def _kind(name: str | None) -> ServerKind | None:
    return next((k for k in SERVER_KINDS if k == name), None)


def run_at_cap(
    ctx: StageContext, batch: int, notify: Callable[[str], None], concurrency: int | None = None
) -> bool:
    """Restart the managed server at cap ``batch`` unless it already runs there; ``concurrency``
    is the most the sweep will have in flight (llama.cpp's HTTP threads are sized for it).

    Returns whether calibrate manages the server (False: nothing was touched).
    """
    cfg = ctx.config
    record = process.load(cfg.runs_dir)
    if record is None or process.liveness(record) != "running":
        return False
    kind = _kind(cfg.server.kind) or _kind(record.kind)
    if record.batch_size == batch:
        return True
    if kind is None or record.script:
        notify(
            f"warning: the managed server runs at batch {record.batch_size}, not the verified "
            f"{batch}, and calibrate cannot rebuild its command (started from "
            f"{record.script or 'an unknown kind'}): the sweep runs against it as it is"
        )
        return True
    notify(f"restarting the managed server at cap {batch} (the verified batch size)")
    server.stop(cfg.runs_dir, cfg.server.stop_timeout_s)
    sized = context_for(ctx.ledger, ctx.target, cfg.runs_dir, kind, batch)
    server.start_engine(
        cfg,
        kind,
        batch,
        max(batch, concurrency or batch),
        notify=notify,
        context_tokens=sized.context_tokens if sized else None,
    )
    return True
