"""What a command asks of a batch (``BatchRequest``), and ``prepare``: the request checked and
resolved into a spec before anything is sent (how the batch talks back is env.py's ``BatchEnv``).

``prepare`` raises in the order a user meets the problems: the endpoints and their concurrency,
the weights gate, the output paths, ``--restart`` — each exit 2 with nothing sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from calibrate.config import Config
from calibrate.engines.redaction import shown_command
from calibrate.errors import CalibrateError, ServerUnreachable, StageFailed, UsageError
from calibrate.http.error_kinds import DESCRIPTORS_HINT, OutOfDescriptors
from calibrate.io.jobs.shard import Shard
from calibrate.io.output_paths import Named, check_outputs, check_writable, stage_files
from calibrate.load.retry import RetryPolicy
from calibrate.stages.batch.endpoints import endpoints_for
from calibrate.stages.batch.plan import DRIFT_WINDOW_S, MAX_CONCURRENCY, BatchSpec, lock_path
from calibrate.stages.batch.result import BatchResult
from calibrate.stages.batch.sending.lanes import ManagedRestart
from calibrate.stages.batch.sending.outage import OutagePolicy
from calibrate.stages.context import sampling_params
from calibrate.stages.export import check_export, failed_path_for
from calibrate.stages.measure.format_check import Expect
from calibrate.state.identity import url_host
from calibrate.state.ledger import Ledger
from calibrate.state.setting import Endpoint
from calibrate.state.weights_gate import check_batch


@dataclass(frozen=True)
class BatchRequest:
    """One batch as the command line asked for it (bounds already checked); ``config`` is the
    configuration resolved with the first ``--base-url`` as the target."""

    config: Config
    input_path: Path
    out_path: Path | None
    urls: tuple[str, ...] = ()  # --base-url, each URL or URL#c=N
    concurrency: int | None = None  # -c
    final: str | None = None  # --final as typed (its messages quote it)
    junit_path: Path | None = None
    argv: tuple[str, ...] = ()
    prompt: str = ""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    outage: OutagePolicy = field(default_factory=OutagePolicy)
    restart: bool = False
    grace_s: float = 10.0
    fsync: bool = False
    sample: int | None = None
    limit: int | None = None
    max_chars: int | None = None
    expect: Expect = "text"
    allow_foreign: bool = False
    allow_mixed: bool = False  # keep results made with other settings (io/journal/made.py)
    shard: str | None = None  # --shard I/N as typed
    max_tokens: int | None = None
    temperature: float | None = None
    workers: int | None = 1  # --workers: processes that send the items (None: auto)
    drift_window_s: float = DRIFT_WINDOW_S  # --drift-window-s


@dataclass(frozen=True)
class BatchSetup:
    """The request resolved: the spec, its endpoints, where their concurrency came from."""

    spec: BatchSpec
    endpoints: tuple[Endpoint, ...]
    source: str  # "flag", "URL#c", "default", a setting's set_by, or "per endpoint"
    restarter: ManagedRestart | None
    ledger: Ledger  # the command's one reader: the stage's context reads no other


def prepare(request: BatchRequest) -> BatchSetup:
    """Endpoints, weights gate, paths and --restart checked (exit 2, nothing sent); the spec."""
    cfg = request.config
    ledger = Ledger(cfg.runs_dir)
    endpoints = endpoints_for(cfg, request.urls, request.concurrency, ledger, MAX_CONCURRENCY)
    check_batch(cfg, ledger, endpoints)  # the setting's weights, before anything
    concurrency = sum(e.concurrency for e in endpoints)
    if concurrency > MAX_CONCURRENCY:
        raise UsageError(
            f"the endpoints' concurrency adds up to {concurrency}; at most "
            f"{MAX_CONCURRENCY} in all",
            "Lower URL#c=N or -c.",
        )
    source = endpoints[0].concurrency_source if len(endpoints) == 1 else "per endpoint"
    check_paths(request)  # no output overwrites what the batch reads: before anything is sent
    restarter = ManagedRestart(cfg, ledger) if request.restart else None
    if restarter is not None and (request.workers or 2) > 1:
        raise UsageError(
            "--restart goes with one process: --workers 1 (the default)",
            "Drop --workers, or drop --restart.",
        )
    if restarter is not None and not restarter.managed():
        raise UsageError(
            "--restart needs the target to be a server calibrate manages (runs/server.json, "
            "on this machine at the target's port)",
            "Start it with: calibrate server start (or drop --restart)",
        )
    given: dict[str, Any] = {"max_tokens": request.max_tokens, "temperature": request.temperature}
    params = replace(sampling_params(cfg), **{k: v for k, v in given.items() if v is not None})
    # the flags that shape an {id, text} item's request (a Batch API line is sent as it is)
    flags = ["--prompt"] * bool(request.prompt)
    flags += [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
    spec = BatchSpec(
        input_path=request.input_path,
        out_path=request.out_path,
        model=cfg.target.model,
        params=params,
        prompt=request.prompt,
        concurrency=concurrency,
        retry=request.retry,
        grace_s=request.grace_s,
        fsync=request.fsync,
        sample=request.sample,
        limit=request.limit,
        max_chars=request.max_chars,
        expect=request.expect,
        allow_foreign=request.allow_foreign,
        shard=Shard.parse(request.shard) if request.shard else None,
        hosts=tuple(url_host(e.base_url) for e in endpoints),
        allow_mixed=request.allow_mixed,
        text_flags=tuple(flags),
        drift_window_s=request.drift_window_s,
    )
    return BatchSetup(spec, endpoints, source, restarter, ledger)


def check_paths(request: BatchRequest) -> None:
    """No file the batch writes (--out, --final and its failed list, --junit) is one it reads
    or journals (--input, the lock, the ledger, the config…) or another of them: exit 2
    before anything is sent."""
    cfg, out = request.config, request.out_path
    final = Path(request.final) if request.final else None
    reads: list[Named] = [
        ("--input", request.input_path),
        ("the lock of --out", lock_path(out) if out else None),
        *stage_files(cfg.runs_dir, cfg.baselines_dir, cfg.source),
    ]
    writes: list[Named] = [
        ("--out", out),
        ("--final", final),
        ("the failed list of --final", failed_path_for(final) if final else None),
        ("--junit", request.junit_path),
    ]
    if final is not None:
        check_export(final, None, "--final")  # its format
        check_writable(final, "--final", "final.jsonl")
    check_outputs(writes, reads)


PIPED = (
    "--input {path} was a pipe, read once: to resume, save its items to a file and give that "
    "as --input (the resume command says TASKS.jsonl)"
)
PIPED_ARG = "TASKS.jsonl"


def resume_command(argv: Sequence[str], input_path: Path, piped: bool) -> str:
    """``calibrate ARGV`` to show (no secret in it, a file name that is not UTF-8 as ``$'…'``);
    a piped --input, gone after this run, named ``TASKS.jsonl`` instead (see ``PIPED``)."""
    words = list(argv)
    if piped:
        given = str(input_path)
        for i, word in enumerate(words):
            if word == "--input" and i + 1 < len(words) and words[i + 1] == given:
                words[i + 1] = PIPED_ARG
            elif word == f"--input={given}":
                words[i] = f"--input={PIPED_ARG}"
    return shown_command(["calibrate", *words])


def said(exc: BaseException) -> str:
    """An error's own words, without a hint written for a run that sent nothing."""
    return exc.message if isinstance(exc, CalibrateError) else str(exc)


def stopped_error(
    result: BatchResult, spec: BatchSpec, resume: str, input_changed: str | None = None
) -> CalibrateError | None:
    """The error a run that stopped early (or whose input changed under it) ends with, once
    its summary is shown."""
    if result.stopped_by == "other_model":
        return StageFailed(
            f"{result.stop_detail}; stopped after {result.ok} ok",
            f"Check what serves {spec.model!r} there, then resume with: {resume}",
        )
    if result.stopped_by == "unknown_model":
        return StageFailed(
            result.stop_detail,
            "Set --model (or [target] model) to a model the server serves (calibrate single "
            f"names them) and run the batch again; what finished is kept in {result.out_path}",
        )
    if result.stopped_by == "descriptors":
        return OutOfDescriptors(result.stop_detail, f"{DESCRIPTORS_HINT} Resume with: {resume}")
    if result.stopped_by == "internal":
        return StageFailed(
            f"{result.stop_detail}; {result.ok} done this run, {result.remaining} remaining",
            "This is calibrate's own bug (its traceback is above): please report it. What "
            f"finished is kept; resume with: {resume}",
        )
    if result.stopped_by == "workers":
        return StageFailed(
            f"{result.stop_detail}; {result.ok} done this run, {result.remaining} remaining",
            f"Resume with: {resume}",
        )
    if result.stopped_by == "outage":
        return ServerUnreachable(
            f"{result.stop_detail}; {result.ok} done this run, {result.remaining} remaining",
            f"When the server answers again, resume with: {resume}",
        )
    if input_changed is not None:
        return StageFailed(
            f"{input_changed}; {result.finished} result(s) of this run are kept in "
            f"{result.out_path}",
            f"Put the input back (or keep the new one) and resume with: {resume} — items whose "
            "text changed run again.",
        )
    return None
