"""The five steps of a rollback — stop, vram, active, restart, compare (SPEC §5.7).

Each is appended to ``steps.jsonl`` and to the ledger (stage ``rollback-step``) as it finishes;
a failing step writes an incident bundle and ends the rollback.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from calibrate.engines.args import ServerKind
from calibrate.errors import (
    CalibrateError,
    ErrorInfo,
    ErrorKind,
    ExitCode,
    GateClosed,
    ServerDied,
    StepFailed,
)
from calibrate.gpu.nvml import GpuSnapshot
from calibrate.io.baseline import Comparison, Normaliser
from calibrate.server import lifecycle as server
from calibrate.server import pids, process, readiness
from calibrate.server.exit_status import ended_words
from calibrate.server.process import is_target, serves_target
from calibrate.server.readiness import VramProbe, used_mib, wait_released
from calibrate.stages.context import StageContext
from calibrate.stages.measure.incidents import Incident, write_incident
from calibrate.stages.pin_context import context_for
from calibrate.stages.prepare.server_cap import running_cap
from calibrate.stages.repro import against_baseline
from calibrate.stages.rollback.result import (
    RollbackResult,
    StepName,
    StepResult,
    compare_failed,
    restored_line,
    unverified_differs,
)
from calibrate.state.gates import next_step
from calibrate.state.ledger import LedgerEntry
from calibrate.state.setting import RollbackTier
from calibrate.state.setting import rollback_tier as state_rollback_tier
from calibrate.state.summary_values import Setting

Notify = Callable[[str], None]


def rollback_tier(ctx: StageContext) -> RollbackTier:
    """The tier to return to (``calibrate.state.setting.rollback_tier``, which the gate reads);
    run with --force and none, the rollback cannot start."""
    tier = state_rollback_tier(ctx.ledger, ctx.target)
    if tier is None:
        raise GateClosed(
            "rollback has no tier to return to: no ladder with a passing tier, no pin",
            "Run first: calibrate ladder",
        )
    return tier


class Rollback:
    """Runs the five steps in order; stops at the first failure."""

    def __init__(
        self,
        ctx: StageContext,
        normaliser: Normaliser,
        *,
        wait_s: float,
        notify: Notify,
        on_step: Callable[[StepResult], None],
        vram_probe: VramProbe,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ctx, self.normaliser, self.notify, self.probe = ctx, normaliser, notify, vram_probe
        self.on_step = on_step
        self.clock = clock
        self.deadline = clock() + wait_s
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
        self.before_stop: GpuSnapshot | None = None
        self.comparison: Comparison | None = None
        self.setting: Setting | None = None

    def run(self) -> RollbackResult:
        tier = rollback_tier(self.ctx)
        batch, source = tier.batch_size, tier.source
        self.batch = batch
        self.notify(f"rollback to batch {batch}, concurrency 1 (last passing, from {source})")
        steps: list[StepResult] = []
        plan: list[tuple[StepName, Callable[[], tuple[str, dict[str, Any]]]]] = [
            ("stop", self.stop),
            ("vram", self.vram),
            ("active", self.active),
            ("restart", self.restart),
            ("compare", self.compare),
        ]
        for n, (name, action) in enumerate(plan, 1):
            step = self._step(n, name, action)
            steps.append(step)
            if not step.ok:
                break
        code = next((s.exit_code for s in steps if not s.ok), 0)
        result = RollbackResult(
            batch, source, self.managed, tuple(steps), self.comparison, code, self.setting
        )
        ctx = self.ctx
        ctx.record_result(result.passed, result.summary())
        ctx.run.close()
        if not result.passed:
            return result
        return replace(result, next_command=next_step(ctx.config, ctx.ledger, ctx.target))

    def _step(
        self, n: int, name: StepName, action: Callable[[], tuple[str, dict[str, Any]]]
    ) -> StepResult:
        start = self.clock()
        try:
            message, detail = action()
            step = StepResult(n, name, True, message, self.clock() - start, detail)
        except StepFailed as exc:
            step = StepResult(
                n, name, False, exc.message, self.clock() - start, {}, exc.code, exc.kind
            )
        except CalibrateError as exc:
            kind: ErrorKind = "server_died" if isinstance(exc, ServerDied) else "connect"
            step = StepResult(
                n,
                name,
                False,
                exc.render().removeprefix("error: "),
                self.clock() - start,
                {},
                int(exc.exit_code),
                kind,
            )
        self.ctx.run.append("steps.jsonl", step.to_json())
        self.ctx.ledger.append(
            LedgerEntry(
                "rollback-step", self.ctx.run.run_id, self.ctx.target, step.ok, step.to_json()
            )
        )
        self.on_step(step)
        if not step.ok:
            self._incident(step)
        return step

    # -- the steps -------------------------------------------------------------------------

    def stop(self) -> tuple[str, dict[str, Any]]:
        self.before_stop = self.probe()
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
        self.notify(f"waiting up to {self._left():.0f} s for port {self.port} to close (--wait)")
        if not readiness.wait_port_closed(self.host, self.port, self._left()):
            raise StepFailed(
                f"port {self.port} is still open after --wait: the server was not stopped",
                "timeout",
            )
        return f"the server on port {self.port} stopped (PID {self.old_pid or 'unknown'})", {
            "pid": self.old_pid
        }

    def vram(self) -> tuple[str, dict[str, Any]]:
        before_start = self.record.vram_used_mib_before if self.record else None
        release = wait_released(self.probe, self.old_pid, before_start, self.before_stop)
        if not release.ok:
            raise StepFailed(release.message, "timeout")
        return release.message, release.to_json()

    def active(self) -> tuple[str, dict[str, Any]]:
        self.setting = Setting(self.batch, 1)
        return (
            f"active setting: batch {self.batch}, concurrency 1 (recorded with this rollback)",
            self.setting.to_json(),
        )

    def restart(self) -> tuple[str, dict[str, Any]]:
        if self.kind is not None:
            ctx = self.ctx
            sized = context_for(ctx.ledger, ctx.target, self.runs, self.kind, self.batch)
            started = server.start_engine(
                ctx.config,
                self.kind,
                self.batch,
                1,
                notify=self.notify,
                context_tokens=sized.context_tokens if sized else None,
                vram_used_mib_before=used_mib(self.probe()),
            )
            self.record = started.record
            return (
                f"restarted (PID {started.record.pid}) at batch {self.batch}, concurrency 1; "
                f"ready after {started.ready_s:.1f} s"
            ), {"pid": started.record.pid}
        root = self.ctx.client.server_root
        self.notify(
            f"restart your server at batch size {self.batch} and concurrency 1, e.g.: "
            f"calibrate pin --out launch.sh && ./launch.sh"
        )
        self.notify(f"waiting up to {self._left():.0f} s for {root} to answer (--wait)")
        ready = readiness.wait_ready(root, None, self._left())
        if not ready.ready:
            raise StepFailed(
                f"no server answered at {root} within --wait ({ready.last_answer})",
                "connect",
                ExitCode.UNREACHABLE,
            )
        return f"the server at {root} is back ({ready.elapsed_s:.1f} s)", {}

    def compare(self) -> tuple[str, dict[str, Any]]:
        result = against_baseline(self.ctx, self.normaliser, runs=1)
        self.comparison = result.comparisons[0]
        if not self.comparison.passed:
            raise StepFailed(*self._differs(self.comparison))
        account = running_cap(self.ctx)  # the server's own account of its cap, as verify reads it
        cap = account.cap
        if cap is not None and cap.slots != self.batch:
            raise StepFailed(
                f"the output matches the baseline, but the server runs at cap {cap.slots} "
                f"({cap.source}), not batch {self.batch}: restart it at batch {self.batch} "
                "(calibrate pin --out launch.sh && ./launch.sh), then run calibrate verify",
                "invalid_response",
            )
        note = " (whitespace only)" if self.comparison.verdict == "whitespace-only" else ""
        note += "".join(f"; {n}" for n in self.comparison.notes)
        if cap is None:
            note += f"; {account.unknown_line(self.batch)}"
        detail = {**self.comparison.to_json(), "server_cap": cap.to_json() if cap else None}
        line = restored_line(self.batch, read=cap is not None, restarted=self.managed)
        return line + note, detail

    def _differs(self, comparison: Comparison) -> tuple[str, ErrorKind]:
        """Why the compare failed; "at the verified setting" only where the server is known to
        run it: calibrate restarted it, or its own cap says so."""
        if self.managed:
            return compare_failed(comparison)
        message, kind = compare_failed(comparison, "after your restart")
        if comparison.failure:  # no answer: its cap is not asked of a failing server
            return message, kind
        account = running_cap(self.ctx)
        return unverified_differs(self.batch, account.cap, account.unknown) or message, kind

    # -- helpers ---------------------------------------------------------------------------

    def _left(self) -> float:
        return max(0.0, self.deadline - self.clock())

    def _incident(self, step: StepResult) -> None:
        cfg, client = self.ctx.config, self.ctx.client
        body = (
            client.chat_body(cfg.target.model, cfg.prompt.text, self.ctx.params)
            if step.name == "compare"
            else None
        )
        extra: dict[str, Any] = {"step": step.name, "step_n": step.n}
        if self.comparison is not None and step.name == "compare":
            extra["comparison"] = {**self.comparison.to_json(), "diff": list(self.comparison.diff)}
        snapshot = self.probe()
        tail = None
        if self.managed:
            tail = process.log_tail(self.runs, 200)  # the latest start's output is at the end
        pid = self.record.pid if self.record else self.old_pid
        incident = Incident(
            stage="rollback",
            batch_size=self.batch,
            concurrency=1,
            round=None,
            request_body=body,
            request_headers=client.redacted_headers(),
            error=ErrorInfo(step.kind or "server_died", step.message),
            server_pid=pid,
            server_exit_code=self._ended(),
            vram=snapshot.to_json() if snapshot else None,
            log_tail=tail,
            extra=extra,
        )
        write_incident(self.ctx.run, f"{step.n}-{step.name}.json", incident)

    def _ended(self) -> int | None:
        """How the managed server ended, as its supervisor wrote it (None: it runs, it is not
        calibrate's, or it is not known): never the supervisor's own shell-style code."""
        if self.record is None:
            return self.exit_code
        gone = process.liveness(self.record) == "gone"
        return process.end_code(self.record, wait=gone)
