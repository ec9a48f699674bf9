"""Managing the inference server process (SPEC §6): start, wait until ready, stop, report.

Only the process calibrate started (recorded in runs/server.pid + runs/server.json) is ever
signalled. ``start`` refuses a second server and a busy port; a server that dies or never gets
ready ends in ``ServerUnreachable`` (exit 4) with its exit code and the tail of its log.
``start`` and ``stop`` hold ``runs/server.restart.lock`` (``process.start_lock``) as they run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from calibrate import interrupts
from calibrate.config import Config
from calibrate.engines import redaction
from calibrate.engines.args import ServerKind
from calibrate.engines.builders import EngineCommand, LaunchSpec, Tuned, build
from calibrate.errors import ServerDied, ServerUnreachable, UsageError
from calibrate.io.records import utc_now_iso
from calibrate.server import exit_status, pids, process, readiness, set_values
from calibrate.server.exit_status import ended_words, exited
from calibrate.server.process import ServerRecord, start_lock, start_stop
from calibrate.server.process.start_stop import StopResult

TAIL_LINES = 20
DEAD_PORT_GRACE_S = 5.0  # how long a just-dead recorded engine's socket may linger


def launch_spec(
    cfg: Config,
    kind: ServerKind,
    batch_size: int | None,
    concurrency: int | None,
    context_tokens: int | None = None,
    tuned: Tuned = (),
) -> LaunchSpec:
    """The [server] section plus a setting (and the engine flags tune chose), for the builders.

    The values ``server start --set`` kept fill what ``tuned`` leaves open: every managed start
    and the script pin writes use them."""
    tuned = set_values.merged(set_values.remembered(cfg.runs_dir), tuned)
    return LaunchSpec(
        kind=kind,
        model_path=cfg.server.model_path,
        port=cfg.server.port,
        batch_size=batch_size,
        concurrency=concurrency,
        served_name=cfg.target.model,
        command=cfg.server.command,
        context_tokens=context_tokens,
        tuned=tuned,
        args=cfg.server.args,
        env=cfg.server.env,
    )


def start_engine(
    cfg: Config,
    kind: ServerKind,
    batch_size: int | None,
    concurrency: int | None,
    *,
    notify: Callable[[str], None],
    context_tokens: int | None = None,
    vram_used_mib_before: float | None = None,
    tuned: Tuned = (),
) -> Started:
    """Build the engine's command for a setting and start it: the one way calibrate launches
    an engine from ``[server]`` (server start, sweep at cap B, rollback, batch --restart, tune)."""
    command = build(launch_spec(cfg, kind, batch_size, concurrency, context_tokens, tuned))
    notify(f"starting: {command.display()}")
    for note in command.notes:
        notify(f"note: {note}")
    return start(
        cfg.runs_dir,
        command.argv,
        env=command.env,
        kind=kind,
        port=cfg.server.port,
        health_path=command.health_path,
        ready_timeout_s=cfg.server.ready_timeout_s,
        stop_timeout_s=cfg.server.stop_timeout_s,
        batch_size=batch_size,
        concurrency=concurrency,
        vram_used_mib_before=vram_used_mib_before,
        notify=notify,
        api_key=cfg.api_key,
    )


@dataclass(frozen=True)
class Started:
    record: ServerRecord
    ready_s: float


def local_root(port: int) -> str:
    return f"http://127.0.0.1:{port}"


@start_lock.one_change("not started")
def start(
    runs_dir: Path,
    argv: Sequence[str],
    *,
    env: Sequence[tuple[str, str]] = (),
    kind: str | None,
    port: int,
    health_path: str | None,
    ready_timeout_s: float,
    stop_timeout_s: float,
    batch_size: int | None = None,
    concurrency: int | None = None,
    script: str | None = None,
    vram_used_mib_before: float | None = None,
    notify: Callable[[str], None] | None = None,
    api_key: str | None = None,
) -> Started:
    """Start the server, record it, and wait until it is ready (or fail with exit 4).

    Ready means ready (SPEC §6): after its health answer the engine's own process is alive,
    holds the listening socket (an engine calibrate launches itself: a stranger that took the
    port while it loaded is no engine), and has answered one real 1-token completion (an
    engine that dies on it is exit 4 with its exit code and log tail).

    The engine is in runs/server.json (marked "starting") before the wait begins, and Ctrl-C,
    SIGTERM and SIGHUP are held back until it is: an interrupted start stops the engine it
    started and says so (the KeyboardInterrupt goes on, its text saying what became of the
    engine); after a kill -9 the next ``start`` or ``stop`` finds the record and stops it.
    """
    say = notify or (lambda text: None)
    current = process.load(runs_dir)
    alive = None if current is None else process.liveness(current)
    if current is not None and alive == "running":
        if not current.left_starting():
            raise UsageError(
                f"calibrate already manages a server (PID {current.pid}, port {current.port})",
                "Stop it first: calibrate server stop",
            )
        left = start_stop.stop(current, stop_timeout_s)
        if not left.gone:
            raise UsageError(
                f"an interrupted start left engine PID {current.pid} running and it did not stop",
                f"Stop it (kill -KILL {current.pid}), then start again.",
            )
        process.forget(runs_dir)
        say(f"stopped the engine an interrupted start had left running (PID {current.pid})")
        readiness.wait_port_closed("127.0.0.1", port, 5.0)
    elif current is not None and alive == "gone" and current.port == port:
        # the recorded engine reads as gone (a zombie) while its last threads still hold its
        # socket for a few ms: measured 3-10 ms after kill -9. Its port is not "another server"
        readiness.wait_port_closed("127.0.0.1", port, DEAD_PORT_GRACE_S)
    if readiness.port_open("127.0.0.1", port):
        raise UsageError(
            f"port {port} is already in use (another server is listening there)",
            "Stop that server, or set another [server] port in calibrate.toml.",
        )
    shown = EngineCommand(tuple(argv), tuple(env)).display()
    record: ServerRecord | None = None
    try:
        with interrupts.deferred():  # until the engine is on disk: no signal can orphan it
            record = _spawn_recorded(
                runs_dir,
                argv,
                env,
                shown,
                kind=kind,
                port=port,
                health_path=health_path,
                batch_size=batch_size,
                concurrency=concurrency,
                script=script,
                vram_used_mib_before=vram_used_mib_before,
            )
        ready = readiness.wait_ready(
            local_root(port),
            health_path,
            ready_timeout_s,
            exited=lambda: readiness.ended(record) if record else None,
        )
        if ready.ready:
            own = readiness.launched(kind)
            ready = readiness.confirmed(
                record, ready, ready_timeout_s, api_key, own_socket=own, say=say
            )
            ready = ready if ready.ready else replace(ready, died=readiness.ended(record))
    except KeyboardInterrupt as exc:
        if record is not None:
            exc.args = (_stop_interrupted(record, runs_dir, stop_timeout_s),)
        raise
    pid, offset = record.pid, record.log_offset
    if ready.ready:
        record = replace(record, phase="ready")
        process.save(record, runs_dir)
        if ready.last_answer and say is not None:
            say(f"note: {ready.last_answer}")
        return Started(record, ready.elapsed_s)
    tail = process.log_tail(runs_dir, TAIL_LINES, offset)
    shown_tail = "\n".join(f"  | {line}" for line in tail) or "  | (the log is empty)"
    log_file = process.log_path(runs_dir)
    if ready.died is not None:
        process.forget(runs_dir)
        how = f"; {ready.last_answer}" if ready.last_answer.startswith("its health") else ""
        code = ready.died.exit_code
        said = exited(code) if code is not None else f"exited ({ended_words(None)})"
        raise ServerDied(
            f"the server {said} before it was ready "
            f"({ready.elapsed_s:.1f} s after start{how}); last lines of {log_file}:\n{shown_tail}",
            f"Fix the cause above, then: calibrate server start   (full log: {log_file})",
            server_exit_code=code,
        )
    stopped = start_stop.stop(record, stop_timeout_s)
    if stopped.gone:
        process.forget(runs_dir)
    if ready.stranger:
        raise ServerUnreachable(
            f"port {port} is answered by another process, {ready.stranger}, not by the engine "
            f"calibrate started (PID {pid}, still loading): stopped the engine; no stage runs "
            f"against a stranger; last lines of {log_file}:\n{shown_tail}",
            "Stop that process, or set another [server] port in calibrate.toml; then: "
            "calibrate server start",
        )
    raise ServerUnreachable(
        f"the server was not ready within {ready_timeout_s:g} s (last answer: {ready.last_answer}); "
        f"stopped it (PID {pid}); last lines of {log_file}:\n{shown_tail}",
        "If it only needs longer to load, raise [server] ready_timeout_s.",
    )


def _spawn_recorded(
    runs_dir: Path,
    argv: Sequence[str],
    env: Sequence[tuple[str, str]],
    shown: str,
    **fields: Any,
) -> ServerRecord:
    """Start the engine and record it as "starting" (its supervisor stops it if we cannot)."""
    try:
        spawned = start_stop.spawn(argv, env, runs_dir, f"start: {shown}")
    except OSError as exc:
        raise ServerUnreachable(
            f"cannot start {argv[0]}: {exc.strerror or exc}",
            "Is the engine installed and on PATH? Check [server] in calibrate.toml.",
        ) from exc
    pid = spawned.pid
    record = ServerRecord(
        pid=pid,
        start_id=spawned.start_id,
        argv=redaction.redact_argv(argv),
        started_at=utc_now_iso(),
        log_offset=spawned.log_offset,
        status_file=str(exit_status.status_path(runs_dir)),
        supervisor_pid=spawned.supervisor_pid,
        supervisor_id=spawned.supervisor_id,
        phase="starting",
        starter_pid=os.getpid(),
        starter_id=pids.start_id(os.getpid()),
        **fields,
    )
    try:
        process.save(record, runs_dir)
    except BaseException:
        start_stop.abandon(pid)
        raise
    start_stop.adopt(pid)
    return record


def _stop_interrupted(record: ServerRecord, runs_dir: Path, stop_timeout_s: float) -> str:
    """Stop the engine an interrupted start launched; one line saying what became of it."""
    try:
        with interrupts.deferred():
            stopped = start_stop.stop(record, stop_timeout_s)
            if stopped.gone:
                process.forget(runs_dir)
    except KeyboardInterrupt:
        stopped = None
    if stopped is not None and stopped.gone:
        how = f", {stopped.signal_sent}" if stopped.signal_sent else ""
        return f"stopped the engine it was starting (PID {record.pid}{how})"
    return (
        f"the engine it was starting is still running (PID {record.pid}); "
        "stop it: calibrate server stop"
    )


@start_lock.one_change("not stopped", "Wait for that start to end, then: calibrate server stop")
def stop(runs_dir: Path, stop_timeout_s: float) -> StopResult | None:
    """Stop the managed server; None when there is none. The record goes once the PID is gone."""
    record = process.load(runs_dir)
    if record is None:
        return None
    result = start_stop.stop(record, stop_timeout_s)
    if result.gone or result.was == "stranger":
        process.forget(runs_dir)
    return result
