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
from calibrate.server.builders import (
    LLAMACPP_THREADS_HTTP,
    SERVER_KINDS,
    LaunchSpec,
    threads_http,
)
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
    threads = short_of_threads(record.argv, kind, batch, concurrency)
    if record.batch_size == batch and (not threads or record.script):
        return True  # a server from a pinned script keeps its own flags
    if kind is None or record.script:
        notify(
            f"warning: the managed server runs at batch {record.batch_size}, not the verified "
            f"{batch}, and calibrate cannot rebuild its command (started from "
            f"{record.script or 'an unknown kind'}): the sweep runs against it as it is"
        )
        return True
    notify(f"restarting the managed server at cap {batch} (the verified batch size){threads}")
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


def short_of_threads(
    argv: tuple[str, ...], kind: ServerKind | None, batch: int, concurrency: int | None
) -> str:
    """``", with --threads-http 18 for 16 in flight"`` when a managed llama.cpp has fewer HTTP
    threads than the sweep will have requests in flight + 2 (SPEC §5.8), else ""."""
    wanted = max(batch, concurrency or batch)
    need = threads_http(LaunchSpec("llamacpp", "", 0, batch, wanted))
    if kind != "llamacpp" or need is None:
        return ""
    flag = LLAMACPP_THREADS_HTTP
    have = argv[argv.index(flag) + 1] if flag in argv[:-1] else ""
    if have.isdigit() and int(have) >= need:
        return ""
    return f", with {flag} {need} for {wanted} in flight"
