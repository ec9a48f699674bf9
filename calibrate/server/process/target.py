"""Whether the managed server is the target's: asked before its record is read as the target's
account (its cap, its engine) or it is stopped and started for the target. A managed server
beside another target (a second server given by --base-url, a proxy in front of it) says nothing
of the target and is never touched for it."""

from __future__ import annotations

from urllib.parse import urlsplit

from calibrate.config import Config
from calibrate.engines.args import ServerKind
from calibrate.server.process import ServerRecord, kind_of, liveness, load
from calibrate.state.identity import LOOPBACK, url_host

THIS_MACHINE = (LOOPBACK, "0.0.0.0", "::")  # a target host that is the managed server's machine


def managed_target(cfg: Config) -> ServerRecord | None:
    """The server calibrate manages, when it runs and the target is it (this machine, its
    port); None otherwise. Its record says its cap and how to restart it — of itself only: a
    managed server beside the target (another server given by ``--base-url``, a proxy in front
    of it) says nothing of the target's cap, and restarting it changes nothing there."""
    record = load(cfg.runs_dir)
    if record is None or liveness(record) != "running" or not is_target(cfg, record):
        return None
    return record


def is_target(cfg: Config, record: ServerRecord) -> bool:
    """Whether the managed server of ``record`` is the one the target points at: this machine
    (by any of its names), the server's port."""
    return serves_target(cfg, record.port)


def serves_target(cfg: Config, port: int) -> bool:
    """Whether a server on ``port`` of this machine is the one the target points at."""
    target = urlsplit(cfg.target.base_url)
    try:
        target_port = target.port or (443 if target.scheme == "https" else 80)
    except ValueError:
        return False
    return url_host(cfg.target.base_url) in THIS_MACHINE and port == target_port


def running_kind(cfg: Config) -> ServerKind | None:
    """``kind_of`` the managed server while it runs and is the target; ``[server] kind``
    otherwise (a managed engine beside another target is not the target's engine)."""
    return kind_of(managed_target(cfg), cfg.server.kind)
