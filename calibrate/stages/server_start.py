"""``server start``: the flags checked, then a pinned script or ``[server]`` at a setting.

Without --batch-size/--concurrency the engine starts at the active setting (a rollback's or
the pin's) with the engine flags tune chose; ``--set`` values are checked against the engine
and kept for later managed starts.

A start by hand takes ``runs/server.restart.lock`` as a ``batch --restart`` does: it is refused
(exit 2, naming the PID) while a batch restarts the managed server (or another hand start
runs), and a batch that finds the server gone meanwhile waits for this start — never two
engines raced onto one port.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from calibrate.config import MAX_BATCH_SIZE, Config
from calibrate.engines.args import ServerKind
from calibrate.errors import ConfigError, UsageError
from calibrate.server import lifecycle as server
from calibrate.server import manage, set_values
from calibrate.server.process import start_lock
from calibrate.stages.pin_context import context_for
from calibrate.state.ledger import Ledger, target_fingerprint
from calibrate.state.setting import resolve


@dataclass(frozen=True)
class StartRequest:
    """What ``server start`` was asked: a script, or an engine kind and a setting."""

    script: str | None  # a launch script written by pin
    kind: ServerKind | None
    batch_size: int | None
    concurrency: int | None
    set_values: tuple[str, ...] = ()


def start_server(
    cfg: Config, request: StartRequest, notify: Callable[[str], None]
) -> server.Started:
    """Start the server the request names and wait until it is ready (exit 4 if it is not)."""
    for flag, value in (("batch-size", request.batch_size), ("concurrency", request.concurrency)):
        if value is not None and not 1 <= value <= MAX_BATCH_SIZE:
            raise UsageError(f"--{flag} must be in [1, {MAX_BATCH_SIZE}], got {value}")
    given = set_values.parse(list(request.set_values))
    if request.script and given:
        raise UsageError(
            "--set fills the [server] command's placeholders; a script from pin has its values",
            "Drop --set, or start from [server] command: calibrate server start --set KEY=VALUE",
        )
    if request.script:
        with start_lock.refusing(cfg.runs_dir, "not started"):
            return manage.start_script(cfg, Path(request.script), notify)
    kind = request.kind or cfg.server.kind
    if kind is None:
        raise ConfigError(
            "calibrate does not know how to start your server",
            'Add [server] kind = "vllm" (and model_path) to calibrate.toml, '
            "pass --kind, or give --script scripts/launch.sh.",
        )
    batch, conc = request.batch_size, request.concurrency
    ledger, target = Ledger(cfg.runs_dir), target_fingerprint(cfg)
    setting = resolve(ledger, target)
    tuned: tuple[tuple[str, str], ...] = ()
    if setting is not None and batch is None and conc is None:
        batch, conc, tuned = setting.batch_size, setting.concurrency, setting.tuned
        notify(f"using the calibrated setting: {setting.describe()}")
    if given:
        set_values.check(kind, cfg.server.command, given)
        tuned = set_values.merged(tuned, given)
        kept = set_values.remember(cfg.runs_dir, given)
        shown = ", ".join(f"{k}={v}" for k, v in kept) or "none"
        notify(f"--set values kept for later managed starts: {shown}")
    sized = context_for(ledger, target, cfg.runs_dir, kind, batch)
    with start_lock.refusing(cfg.runs_dir, "not started"):
        return server.start_engine(
            cfg,
            kind,
            batch,
            conc,
            notify=notify,
            context_tokens=sized.context_tokens if sized else None,
            vram_used_mib_before=manage.vram_used_mib(),
            tuned=tuned,
        )
