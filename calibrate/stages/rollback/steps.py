"""The five steps of a rollback — stop, vram, active, restart, compare (SPEC §5.7).

Each is appended to ``steps.jsonl`` and to the ledger (stage ``rollback-step``) as it finishes;
a failing step writes an incident bundle and ends the rollback.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from calibrate.errors import (
    CalibrateError,
    ErrorInfo,
    ErrorKind,
    GateClosed,
    ServerDied,
    StepFailed,
)
from calibrate.gpu.nvml import GpuSnapshot
from calibrate.io.baseline import Comparison, Normaliser
from calibrate.server.readiness import VramProbe, used_mib, wait_released
from calibrate.stages.context import StageContext
from calibrate.stages.measure.incidents import Incident, write_incident
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
from calibrate.stages.rollback.target_server import Notify, TargetServer
from calibrate.state.gates import next_step
from calibrate.state.ledger import LedgerEntry
from calibrate.state.setting import RollbackTier
from calibrate.state.setting import rollback_tier as state_rollback_tier
from calibrate.state.summary_values import Setting


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
        self.server = TargetServer(ctx, notify, self._left)
        self.managed = self.server.managed
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
        with self.server.held():  # calibrate's server: no other start from its stop to its start
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
        return self.server.stop()

    def vram(self) -> tuple[str, dict[str, Any]]:
        record = self.server.record
        before_start = record.vram_used_mib_before if record else None
        release = wait_released(self.probe, self.server.old_pid, before_start, self.before_stop)
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
        used = used_mib(self.probe()) if self.managed else None
        return self.server.restart(self.batch, used)

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
        incident = Incident(
            stage="rollback",
            batch_size=self.batch,
            concurrency=1,
            round=None,
            request_body=body,
            request_headers=client.redacted_headers(),
            error=ErrorInfo(step.kind or "server_died", step.message),
            server_pid=self.server.pid,
            server_exit_code=self.server.ended(),
            vram=snapshot.to_json() if snapshot else None,
            log_tail=self.server.log_tail(),
            extra=extra,
        )
        write_incident(self.ctx.run, f"{step.n}-{step.name}.json", incident)
