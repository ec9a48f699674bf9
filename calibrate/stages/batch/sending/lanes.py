"""The endpoints a batch sends to: one lane each, with its own client, slots and breaker.

``--base-url`` may be given several times (or ``[target] base_urls``), each ``URL`` or
``URL#c=N``. Every lane keeps up to ``concurrency`` items in flight (pacing.py); a free slot
takes the next item, so an item always goes to an endpoint with a free slot and a faster
endpoint takes more. A lane in an outage takes nothing, and its items go back to the queue
for the others.

``--restart`` (``ManagedRestart``) starts the managed server again when its process is gone
mid-run: only the server calibrate started (``runs/server.json``) and only when its PID is gone
— a server that is alive but slow is waited for, never restarted, and nothing is found by name.
It comes back the way it was started: from the pinned script if it was started from one, else
from ``[server]`` at the calibrated setting (the setting it had when none is calibrated). One
process restarts it (``runs/server.restart.lock``): another batch that found it gone too (a
shard of the same job) waits for that restart and goes on against the server it started —
two restarts started two engines on one port, and the record named the one that lost it. A
batch stopped (Ctrl-C, SIGTERM) while it waits for that restart stops waiting, and starts no
engine once stopped: before, it went on waiting through its grace period and, the lock let go,
restarted the server after the user had stopped it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from calibrate.config import Config
from calibrate.engines.builders import build
from calibrate.errors import RequestError, ServerUnreachable
from calibrate.http.client import OpenAIClient
from calibrate.io.lock import WaitStopped
from calibrate.load.transport import HttpTransport, Transport
from calibrate.server import lifecycle as server
from calibrate.server import process
from calibrate.server.exit_status import ended_words, exited
from calibrate.server.process import start_lock
from calibrate.server.process.target import is_target
from calibrate.stages.batch.sending.outage import (
    Breaker,
    OutageEvent,
    OutagePolicy,
    Restarted,
    Restarter,
    is_outage,
)
from calibrate.state.ledger import Ledger, target_fingerprint
from calibrate.state.setting import Endpoint, resolve

PROBE_TIMEOUT_S = 3.0
RESTART_WAIT_MARGIN_S = 30.0  # beyond the longest restart [server] allows: a hung one is left

log = logging.getLogger("calibrate")


@dataclass(frozen=True)
class Lane:
    """One endpoint as the batch sends to it: completions over ``transport`` (the engine's),
    the control plane (the breaker's probe) over ``client``."""

    endpoint: Endpoint
    client: OpenAIClient
    breaker: Breaker
    transport: Transport

    @property
    def label(self) -> str:
        return self.endpoint.label

    @property
    def concurrency(self) -> int:
        return self.endpoint.concurrency


def probe_for(client: OpenAIClient) -> Callable[[], str | None]:
    """``GET /v1/models`` with a short deadline: None when the server answers at all."""

    def probe() -> str | None:
        try:
            client.get_text(client.base_url + "/models", timeout_s=PROBE_TIMEOUT_S)
        except RequestError as exc:
            return exc.info.message if is_outage(exc.info) or exc.kind == "timeout" else None
        return None

    return probe


def make_lane(
    endpoint: Endpoint,
    client: OpenAIClient,
    policy: OutagePolicy,
    *,
    restarter: Restarter | None = None,
    on_event: Callable[[OutageEvent], None] = lambda event: None,
    transport: Transport | None = None,
) -> Lane:
    """``endpoint``'s lane; its completions over ``client`` unless another ``transport``
    is given (the simulated server)."""
    breaker = Breaker(
        endpoint.label, policy, probe_for(client), restarter=restarter, on_event=on_event
    )
    return Lane(endpoint, client, breaker, transport or HttpTransport(client))


@dataclass(frozen=True)
class EndpointReport:
    """What one endpoint did in this run (summary, ``--json``)."""

    url: str
    concurrency: int
    concurrency_source: str
    done: int
    failed: int
    seconds: float
    state: str  # up | down | gone
    outages: int
    down_s: float
    restarts: int

    @property
    def serving_s(self) -> float:
        """The run's seconds less those the endpoint took no items (down, or given up)."""
        return max(self.seconds - self.down_s, 0.0)

    @property
    def items_per_s(self) -> float:
        """Its pace while it served: a run's whole length would count the seconds it was
        down or given up as its slowness."""
        return (self.done + self.failed) / self.serving_s if self.serving_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "concurrency": self.concurrency,
            "concurrency_source": self.concurrency_source,
            "done": self.done,
            "failed": self.failed,
            "items_per_s": round(self.items_per_s, 3),
            "ok_per_s": round(self.done / self.serving_s, 3) if self.serving_s > 0 else 0.0,
            "serving_s": round(self.serving_s, 3),
            "state": self.state,
            "outages": self.outages,
            "down_s": round(self.down_s, 3),
            "restarts": self.restarts,
        }


def report(lane: Lane, done: int, failed: int, seconds: float) -> EndpointReport:
    b = lane.breaker
    e = lane.endpoint
    return EndpointReport(
        e.label,
        e.concurrency,
        e.concurrency_source,
        done,
        failed,
        seconds,
        b.state,
        b.incidents,
        b.unavailable_s(),
        b.restarts,
    )


class ManagedRestart:
    """A ``Restarter`` (outage.py) for the server in ``cfg.runs_dir``."""

    def __init__(self, cfg: Config, ledger: Ledger) -> None:
        self.cfg = cfg
        self.ledger = ledger  # the command's reader: the setting to restart at

    def managed(self) -> bool:
        """Whether calibrate manages the target's server (checked before the run): a managed
        server beside it is no server of this batch's to restart."""
        record = process.load(self.cfg.runs_dir)
        return record is not None and is_target(self.cfg, record)

    def needed(self) -> bool:
        record = process.load(self.cfg.runs_dir)
        return record is not None and process.liveness(record) == "gone"

    def restart(self, stop: threading.Event) -> Restarted | None:
        cfg = self.cfg
        seen = process.load(cfg.runs_dir)
        if seen is None:
            raise ServerUnreachable("calibrate manages no server here (no runs/server.json)")
        code = process.end_code(seen)  # the engine's own, as its supervisor recorded it
        died = f"the managed server (PID {seen.pid}) " + (
            exited(code) if code is not None else f"had exited ({ended_words(None)})"
        )

        def waiting(holder: str) -> None:
            log.warning("%s; PID %s is restarting it: waiting for that restart", died, holder)

        limits = cfg.server  # the longest a restart may take: two readiness waits and a stop
        wait_s = 2 * limits.ready_timeout_s + limits.stop_timeout_s + RESTART_WAIT_MARGIN_S
        try:
            with start_lock.held(cfg.runs_dir, wait_s, waiting, stop=stop):
                if stop.is_set():  # stopped as the lock came: a stopped batch starts no engine
                    return None
                record = process.load(cfg.runs_dir)
                if record is None:  # a restart before ours failed, and said why
                    raise ServerUnreachable(
                        f"{died}; another calibrate process restarted it and that failed",
                        f"See {process.log_path(cfg.runs_dir)}; then: calibrate server start",
                    )
                if process.liveness(record) == "running":  # restarted while we waited
                    by = f"PID {record.starter_pid}" if record.starter_pid else "another process"
                    return Restarted(
                        f"{died}; restarted by {by} as PID {record.pid}: going on with it",
                        ours=False,
                    )
                return Restarted(self._start(record, died))
        except WaitStopped:
            log.debug("stopped while waiting for another process's restart: not restarted")
            return None
        except TimeoutError as exc:
            raise ServerUnreachable(
                f"{died}; another calibrate process was restarting it and had not finished: {exc}",
                "See calibrate server status; start it yourself if it stays down.",
            ) from None

    def _start(self, record: process.ServerRecord, died: str) -> str:
        cfg = self.cfg
        if record.script:
            argv: tuple[str, ...] = ("bash", record.script)
            env: tuple[tuple[str, str], ...] = ()
            batch, conc, health = record.batch_size, record.concurrency, record.health_path
            how = f"bash {record.script}"
        else:
            kind = process.kind_of(record, cfg.server.kind)
            if kind is None:
                raise ServerUnreachable(
                    f"{died}; its kind is unknown, so it cannot be restarted",
                    "Start it yourself: calibrate server start",
                )
            setting = resolve(self.ledger, target_fingerprint(cfg))
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
            api_key=cfg.api_key,
            script=record.script,
        )
        return (
            f"{died}; restarted as PID {started.record.pid} ({how}), ready in "
            f"{started.ready_s:.1f} s"
        )
