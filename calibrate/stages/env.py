"""How a stage opens: its config resolved, its gate checked, its run folder made, its client
built — and how it ends when interrupted or when a write fails (SPEC §2, §11).

The command builds a ``StageRequest`` from its flags; everything after that is here, so a
stage can be run (and tested) without argv.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from calibrate.config import Config
from calibrate.errors import GateClosed, Interrupted, StageFailed, UsageError, os_error_text
from calibrate.http.client import OpenAIClient
from calibrate.io.output_paths import check_outputs, kind_of, stage_files, writable_folder
from calibrate.io.store import RunDir, ledger_path
from calibrate.server.process.target import running_kind
from calibrate.stages.context import StageContext, manifest
from calibrate.state.gates import check_gate
from calibrate.state.ledger import Ledger, target_fingerprint
from calibrate.state.summaries import PlainSummary
from calibrate.state.target_lock import hold


@dataclass(frozen=True)
class StageRequest:
    """What a command asks of a stage before it runs: which, under which config, from which
    command line, and where its side files go."""

    stage: str
    config: Config
    argv: tuple[str, ...] = ()
    force: bool = False
    gate: bool = True
    junit: Path | None = None
    tasks: Path | None = None
    max_connections: int | None = None
    ledger: Ledger | None = None  # the command's one reader, when it read the ledger already


def open_stage(request: StageRequest, warn: Callable[[str], None]) -> StageContext:
    """Resolve config, check the stage's gate (exit 3 unless --force), open its run folder.

    Where results will be written (runs/, --junit) is checked first: exit 2 before anything
    is sent, rather than a run whose results cannot be kept.
    """
    cfg, stage = request.config, request.stage
    if cfg.proxy_note:  # once per command: every command that talks to the server opens here
        warn(cfg.proxy_note)
    check_outputs(  # --junit is not the ledger, the config, --tasks… (exit 2, nothing sent)
        [("--junit", request.junit)],
        [*stage_files(cfg.runs_dir, cfg.baselines_dir, cfg.source), ("--tasks", request.tasks)],
    )
    check_writable_dir(cfg.runs_dir, "[paths] runs")
    check_ledger(ledger_path(cfg.runs_dir))
    ledger = request.ledger or Ledger(cfg.runs_dir)
    target = target_fingerprint(cfg)
    forced = request.force
    if request.gate:
        verdict = check_gate(stage, cfg, ledger, target)
        if not verdict.open:
            if not forced:
                raise GateClosed(
                    f"{stage} is gated: {verdict.reason}",
                    f"Run first: {verdict.run_first}   (or pass --force to run anyway; it is recorded)",
                )
            warn(f"FORCED: running {stage} with its gate closed ({verdict.reason}); recorded")
        else:
            forced = False
    client = OpenAIClient(
        cfg.target.base_url,
        api_key=cfg.api_key,
        metrics_key=cfg.gpu_metrics_key,
        timeout_s=cfg.target.timeout_s,
        connect_timeout_s=cfg.target.connect_timeout_s,
        max_response_mib=cfg.target.max_response_mib,
        max_connections=max(
            64,
            *cfg.sweep.concurrency,
            max(cfg.ladder.batch_sizes),
            request.max_connections or 0,
        ),
    )
    run = RunDir(cfg.runs_dir, stage)
    ctx = StageContext(cfg, client, run, ledger, target, running_kind(cfg), forced)
    run.set_manifest(manifest(ctx, ["calibrate", *request.argv]))
    return ctx


def check_writable_dir(path: Path, what: str) -> None:
    """Exit 2 before anything is sent when no file can be written in ``path``."""
    problem = writable_folder(path)
    if problem:
        raise UsageError(
            f"{path}: {problem}; nothing was sent",
            f"Make it writable (or free space there), or point {what} elsewhere.",
        )


def check_ledger(path: Path) -> None:
    """Exit 2 before anything is sent when the ledger exists but no verdict could be appended to
    it: a folder, a FIFO, a device (a link to /dev/null would swallow it), a read-only file."""
    try:
        found = os.stat(path)
    except OSError:
        return  # absent (started by the first verdict), or a path that writing will name
    if not stat.S_ISREG(found.st_mode):
        problem = f"is {kind_of(found.st_mode)}, not a regular file"
    else:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
            return
        except OSError as exc:
            problem = f"cannot be appended to ({exc.strerror or exc})"
    raise UsageError(
        f"the ledger {path} {problem}: no verdict could be recorded; nothing was sent",
        "Move it aside (the next verdict starts a new one) or make it writable, or point "
        "[paths] runs elsewhere.",
    )


@contextlib.contextmanager
def load_lock(
    ctx: StageContext, *, shared: bool = False, also: Sequence[str] = ()
) -> Iterator[None]:
    """One load-sending stage per target at a time (ladder, sweep, tune, rollback); ``shared``:
    a batch, which may send beside other batches but never beside a stage that measures — each
    server it sends to (``also``: the other endpoints' targets) held as its own."""
    with contextlib.ExitStack() as held:
        for target in dict.fromkeys((ctx.target, *also)):
            held.enter_context(hold(ctx.config.runs_dir, target, ctx.run.stage, shared=shared))
        yield


def _kept(run: RunDir) -> str:
    return f"what was written is kept in {run.path}" if run.path.exists() else "nothing was kept"


@contextlib.contextmanager
def kept_on_write_error(ctx: StageContext) -> Iterator[None]:
    """A write error once the stage has started (disk full, folder gone) → exit 1, naming the
    file and saying what was kept (a run folder nothing was written into is removed).
    Network errors never arrive here: the client maps them to RequestError."""
    try:
        yield
    except OSError as exc:
        ctx.run.drop_if_empty()
        raise StageFailed(
            f"{ctx.run.stage} stopped: a write failed ({os_error_text(exc)}); {_kept(ctx.run)}",
            f"Free space or fix permissions, then run it again: calibrate {ctx.run.stage}",
        ) from exc


@contextlib.contextmanager
def stopped_by_write(ctx: StageContext, failed: OSError | None, measured: str) -> Iterator[None]:
    """After a write failed mid-run (``failed``; None: it did not, and this does nothing): the
    block finishes what was measured before it as an interrupted run (its table shown and
    written, recorded as not passed) as far as the disk lets it; then exit 1 naming the file
    that failed first, what was measured (``measured``: "2 tier(s)") and where it is kept."""
    if failed is None:
        yield
        return
    table = ctx.run.path / "tiers.csv"
    with contextlib.suppress(OSError):  # the disk still full: the first failure is said
        yield
    ctx.run.drop_if_empty()  # its writers closed (one may still hold what failed)
    kept = (
        f"the {measured} measured before it are in {table} (calibrate report {ctx.run.path})"
        if table.is_file()
        else _kept(ctx.run)
    )
    raise StageFailed(
        f"{ctx.run.stage} stopped: a write failed ({os_error_text(failed)}); {kept}",
        f"Free space or fix permissions, then run it again: calibrate {ctx.run.stage}",
    ) from failed


@contextlib.contextmanager
def guarded(ctx: StageContext) -> Iterator[None]:
    """Ctrl-C / SIGTERM → recorded as interrupted (never passed), exit 130 saying what was
    kept and how to resume; a write error → exit 1 saying what was kept. The stage's client is
    closed at the end (its kept-alive connections): a process that runs stage after stage
    (``calibrate run``) would hold a socket to the server for each one."""
    with contextlib.closing(ctx.client), kept_on_write_error(ctx):
        try:
            yield
        except KeyboardInterrupt as exc:
            kept = _kept(ctx.run)
            ctx.record_result(False, PlainSummary(), interrupted=True)
            ctx.run.close()
            engine = f"; {exc}" if str(exc) else ""  # what became of an engine being started
            raise Interrupted(
                f"{ctx.run.stage} interrupted, recorded as not passed; {kept}{engine}",
                f"Run it again: calibrate {ctx.run.stage}",
            ) from None
