"""The server a rollback stops and starts again (SPEC §5.7): calibrate's managed one when it is
the target, stopped and restarted here; else whatever listens on the target's port, which the
user stops and restarts while calibrate waits out ``--wait``. A server calibrate manages beside
another target is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from calibrate.engines.args import ServerKind
from calibrate.errors import ExitCode, StepFailed
from calibrate.server import lifecycle as server
from calibrate.server import pids, process, readiness
from calibrate.server.exit_status import ended_words
from calibrate.server.process import start_lock
from calibrate.server.process.target import is_target, serves_target
from calibrate.stages.context import StageContext
from calibrate.stages.pin_context import context_for

Notify = Callable[[str], None]


class TargetServer:
    """The target's server as a rollback finds it, stops it and starts it again; ``left`` says
    how many seconds of ``--wait`` are left."""

    def __init__(self, ctx: StageContext, notify: Notify, left: Callable[[], float]) -> None:
        self.ctx, self.notify, self.left = ctx, notify, left
        self.runs = ctx.config.runs_dir
        cfg = ctx.config
        found = process.load(self.runs)
        # the managed server is stopped and started again only when it is the target: a server
        # calibrate manages beside another target is left as it is (said at the first step);
        # with none, [server] is started only where the target is (its port on this machine)
        self.beside = found if found is not None and not is_target(cfg, found) else None
        self.record = found if self.beside is None else None
        startable = self.record is not None or serves_target(cfg, cfg.server.port)
        self.kind: ServerKind | None = (
            process.kind_of(self.record, cfg.server.kind) if startable else None
        )
        self.managed = self.kind is not None
        self.host, self.port = readiness.host_port(ctx.config.target.base_url)
        self.old_pid: int | None = self.record.pid if self.record else None
        self.exit_code: int | None = None

    def held(self) -> AbstractContextManager[None]:
        """The restart lock, where calibrate stops and starts this server: held by another
        process, the rollback is refused (exit 2, naming its PID) before its first step."""
        if not self.managed:
            return nullcontext()
        return start_lock.refusing(self.runs, "not rolled back: nothing was stopped")

    @property
    def pid(self) -> int | None:
        """The server's PID now: the one started again, else the one stopped (None: unknown)."""
        return self.record.pid if self.record else self.old_pid

    def stop(self) -> tuple[str, dict[str, Any]]:
        if self.record is not None:
            result = server.stop(self.runs, self.ctx.config.server.stop_timeout_s)
            assert result is not None
            self.exit_code = result.exit_code
            if result.was == "stranger":
                message = (
                    f"the managed server had already exited; PID {result.pid} now belongs "
                    f"to another program ({pids.cmdline(result.pid)[:80]}): not signalled"
                )
            elif result.was == "gone":
                message = f"the managed server (PID {result.pid}) had already exited"
            elif not result.gone:
                raise StepFailed(f"PID {result.pid} is still alive after SIGKILL", "timeout")
            else:
                message = (
                    f"stopped the managed server (PID {result.pid}, {result.signal_sent}, "
                    f"{result.elapsed_s:.1f} s)"
                )
            if result.exit_code is not None or result.was == "gone":  # how it ended, or that
                message += f", {ended_words(result.exit_code)}"  # it is not known: never silent
            detail = {"pid": result.pid, "was": result.was, "signal": result.signal_sent}
            if not readiness.wait_port_closed(self.host, self.port, 5.0):
                raise StepFailed(f"{message}, but port {self.port} is still open", "timeout")
            return message, detail
        if self.beside is not None:
            self.notify(
                f"the server calibrate manages (PID {self.beside.pid}, port {self.beside.port}) "
                f"is not the target ({self.host}:{self.port}): left as it is"
            )
        if not readiness.port_open(self.host, self.port):
            return f"nothing listens on {self.host}:{self.port}: the server is already down", {}
        self.old_pid = pids.listener_pid(self.port)
        how = (
            f"kill -TERM {self.old_pid}   # {pids.cmdline(self.old_pid)[:100]}"
            if self.old_pid
            else f"kill -TERM $(lsof -t -iTCP:{self.port} -sTCP:LISTEN)"
        )
        self.notify(f"calibrate does not manage this server: stop it yourself, e.g.\n  {how}")
        self.notify(f"waiting up to {self.left():.0f} s for port {self.port} to close (--wait)")
        old, now = self.old_pid, [self.old_pid]

        def moved() -> bool:  # another PID listens there, as the last poll read it
            return old is not None and now[0] not in (None, old)

        def replaced() -> bool:  # restarted quicker than a poll
            now[0] = pids.listener_pid(self.port)
            return moved()

        if not readiness.wait_port_closed(self.host, self.port, self.left(), replaced=replaced):
            raise StepFailed(
                f"port {self.port} is still open after --wait: the server was not stopped",
                "timeout",
            )
        again = f", and PID {now[0]} listens there already" if moved() else ""
        return f"the server on port {self.port} stopped (PID {old or 'unknown'}){again}", {
            "pid": old
        }

    def restart(self, batch: int, vram_used_mib_before: float | None) -> tuple[str, dict[str, Any]]:
        if self.kind is not None:
            ctx = self.ctx
            sized = context_for(ctx.ledger, ctx.target, self.runs, self.kind, batch)
            started = server.start_engine(
                ctx.config,
                self.kind,
                batch,
                1,
                notify=self.notify,
                context_tokens=sized.context_tokens if sized else None,
                vram_used_mib_before=vram_used_mib_before,
            )
            self.record = started.record
            return (
                f"restarted (PID {started.record.pid}) at batch {batch}, concurrency 1; "
                f"ready after {started.ready_s:.1f} s"
            ), {"pid": started.record.pid}
        root = self.ctx.client.server_root
        self.notify(
            f"restart your server at batch size {batch} and concurrency 1, e.g.: "
            f"calibrate pin --out launch.sh && ./launch.sh"
        )
        self.notify(f"waiting up to {self.left():.0f} s for {root} to answer (--wait)")
        ready = readiness.wait_ready(root, None, self.left())
        if not ready.ready:
            raise StepFailed(
                f"no server answered at {root} within --wait ({ready.last_answer})",
                "connect",
                ExitCode.UNREACHABLE,
            )
        return f"the server at {root} is back ({ready.elapsed_s:.1f} s)", {}

    def log_tail(self) -> list[str] | None:
        """The managed server's last output lines, the latest start's at the end (None: not
        calibrate's)."""
        return process.log_tail(self.runs, 200) if self.managed else None

    def ended(self) -> int | None:
        """How the managed server ended, as its supervisor wrote it (None: it runs, it is not
        calibrate's, or it is not known): never the supervisor's own shell-style code."""
        if self.record is None:
            return self.exit_code
        gone = process.liveness(self.record) == "gone"
        return process.end_code(self.record, wait=gone)
