"""``batch --restart``: start the managed server again when its process is gone mid-run.

Only the server calibrate started (``runs/server.json``) and only when its PID is gone: a server
that is alive but slow is waited for, never restarted, and nothing is found by name. It comes
back the way it was started: from the pinned script if it was started from one, else from
``[server]`` at the calibrated setting (the setting it had when none is calibrated).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import cast

from calibrate import server
from calibrate.config import Config
from calibrate.engines.args import ServerKind
from calibrate.engines.builders import build
from calibrate.errors import ServerUnreachable
from calibrate.server import process
from calibrate.state.ledger import Ledger, target_fingerprint
from calibrate.state.setting import resolve

log = logging.getLogger("calibrate")


class ManagedRestart:
    """A ``Restarter`` (batch_outage.py) for the server in ``cfg.runs_dir``."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def managed(self) -> bool:
        """Whether calibrate manages a server here at all (checked before the run)."""
        return process.load(self.cfg.runs_dir) is not None

    def needed(self) -> bool:
        record = process.load(self.cfg.runs_dir)
        return record is not None and process.liveness(record) == "gone"

    def restart(self) -> str:
        cfg = self.cfg
        record = process.load(cfg.runs_dir)
        if record is None:
            raise ServerUnreachable("calibrate manages no server here (no runs/server.json)")
        code = process.exit_code(record.pid)
        died = f"the managed server (PID {record.pid}) had exited" + (
            f" with code {code}" if code is not None else ""
        )
        if record.script:
            argv: tuple[str, ...] = ("bash", record.script)
            env: tuple[tuple[str, str], ...] = ()
            batch, conc, health = record.batch_size, record.concurrency, record.health_path
            how = f"bash {record.script}"
        else:
            kind = cfg.server.kind if record.kind is None else cast(ServerKind, record.kind)
            if kind is None:
                raise ServerUnreachable(
                    f"{died}; its kind is unknown, so it cannot be restarted",
                    "Start it yourself: calibrate server start",
                )
            setting = resolve(Ledger(cfg.runs_dir), target_fingerprint(cfg))
            batch, conc = record.batch_size, record.concurrency
            if setting is not None:
                batch, conc = setting.batch_size, setting.concurrency
            spec = server.launch_spec(cfg, kind, batch, conc)
            command = build(replace(spec, port=record.port))
            argv, env, health = command.argv, command.env, command.health_path
            how = command.display()
        log.warning("%s; restarting it: %s", died, how)
        started = server.start(
            cfg.runs_dir,
            argv,
            env=env,
            kind=record.kind,
            port=record.port,
            health_path=health,
            ready_timeout_s=cfg.server.ready_timeout_s,
            stop_timeout_s=cfg.server.stop_timeout_s,
            batch_size=batch,
            concurrency=conc,
            script=record.script,
        )
        return (
            f"{died}; restarted as PID {started.record.pid} ({how}), ready in "
            f"{started.ready_s:.1f} s"
        )
