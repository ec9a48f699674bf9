"""Manage the inference server process from [server] in calibrate.toml: start, stop, status, logs.

The server runs in its own process group, output in runs/server.log, PID in runs/server.pid.
Only the process calibrate started is ever signalled, never a process found by name.

example: calibrate server start --concurrency 4
example: calibrate server start --script scripts/launch.sh
example: calibrate server stop
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from calibrate import server
from calibrate.cli.common import Output, add_command, load_config, output_for
from calibrate.config import MAX_BATCH_SIZE, Config
from calibrate.engines import redaction
from calibrate.engines.builders import SERVER_KINDS, health_path
from calibrate.errors import ConfigError, UsageError
from calibrate.gpu.nvml import gpu_snapshot
from calibrate.server import exit_status, launch_script, process, readiness, set_values
from calibrate.stages.pin_context import context_for
from calibrate.state.ledger import Ledger, target_fingerprint
from calibrate.state.setting import resolve

START_DOC = """Start the server ([server] in calibrate.toml, or a pinned script) and wait until ready.

Without --batch-size/--concurrency it uses the active setting (a rollback's or the pin's); before
any calibration the engine's own defaults. Exit 4 if it dies or is not ready in ready_timeout_s.

example: calibrate server start --kind vllm --concurrency 4
example: calibrate server start --script scripts/launch.sh
"""
STOP_DOC = """Stop the managed server: SIGTERM to its process group, SIGKILL after stop_timeout_s.

example: calibrate server stop
"""
STATUS_DOC = """Show whether the managed server runs, its PID, port, command and readiness.

example: calibrate server status --json
"""
LOGS_DOC = """Print the last lines of runs/server.log.

example: calibrate server logs -n 100
"""


def register(subparsers: Any) -> None:
    doc = __doc__ or ""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "server",
        help=doc.splitlines()[0],
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(run=_no_action)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    start = add_command(actions, "start", START_DOC, run_start, target=False)
    start.add_argument("--script", metavar="PATH", help="start from a script written by pin")
    start.add_argument("--kind", choices=SERVER_KINDS, help="engine kind (overrides [server] kind)")
    start.add_argument("--batch-size", type=int, metavar="N", help="batch size to start with")
    start.add_argument("--concurrency", type=int, metavar="C", help="concurrency to start with")
    start.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fill a {placeholder} of a custom [server] command (or an engine flag tune sets); "
        "kept for later managed starts, KEY= forgets it",
    )
    add_command(actions, "stop", STOP_DOC, run_stop, target=False)
    add_command(actions, "status", STATUS_DOC, run_status, target=False)
    logs = add_command(actions, "logs", LOGS_DOC, run_logs, target=False)
    logs.add_argument("-n", "--lines", type=int, default=50, metavar="N", help="lines (default 50)")


def _no_action(args: argparse.Namespace) -> int:
    raise UsageError(
        "say what to do: calibrate server start | stop | status | logs",
        "example: calibrate server start",
    )


def _vram_used() -> float | None:
    return readiness.used_mib(gpu_snapshot())


def run_start(args: argparse.Namespace) -> int:
    out = output_for(args)
    cfg = load_config(args)
    for name in ("batch_size", "concurrency"):
        value = getattr(args, name)
        if value is not None and not 1 <= value <= MAX_BATCH_SIZE:
            raise UsageError(
                f"--{name.replace('_', '-')} must be in [1, {MAX_BATCH_SIZE}], got {value}"
            )
    given = set_values.parse(args.set)
    if args.script and given:
        raise UsageError(
            "--set fills the [server] command's placeholders; a script from pin has its values",
            "Drop --set, or start from [server] command: calibrate server start --set KEY=VALUE",
        )
    if args.script:
        started = _start_script(cfg, Path(args.script), out)
    else:
        kind = args.kind or cfg.server.kind
        if kind is None:
            raise ConfigError(
                "calibrate does not know how to start your server",
                'Add [server] kind = "vllm" (and model_path) to calibrate.toml, '
                "pass --kind, or give --script scripts/launch.sh.",
            )
        batch, conc = args.batch_size, args.concurrency
        setting = resolve(Ledger(cfg.runs_dir), target_fingerprint(cfg))
        tuned: tuple[tuple[str, str], ...] = ()
        if setting is not None and batch is None and conc is None:
            batch, conc, tuned = setting.batch_size, setting.concurrency, setting.tuned
            out.say(f"using the calibrated setting: {setting.describe()}")
        if given:
            set_values.check(kind, cfg.server.command, given)
            tuned = set_values.merged(tuned, given)
            kept = set_values.remember(cfg.runs_dir, given)
            shown = ", ".join(f"{k}={v}" for k, v in kept) or "none"
            out.say(f"--set values kept for later managed starts: {shown}")
        ledger, target = Ledger(cfg.runs_dir), target_fingerprint(cfg)
        sized = context_for(ledger, target, cfg.runs_dir, kind, batch)
        started = server.start_engine(
            cfg,
            kind,
            batch,
            conc,
            notify=out.say,
            context_tokens=sized.context_tokens if sized else None,
            vram_used_mib_before=_vram_used(),
            tuned=tuned,
        )
    record = started.record
    out.ok(
        f"server ready on port {record.port} (PID {record.pid}, {started.ready_s:.1f} s); "
        f"log: {process.log_path(cfg.runs_dir)}"
    )
    out.result({"ready": True, "ready_s": round(started.ready_s, 3), **record.to_json()})
    return 0


def _start_script(cfg: Config, script: Path, out: Output) -> server.Started:
    settings = launch_script.read_settings(script)
    port = settings.port or cfg.server.port
    kind = settings.kind or cfg.server.kind
    out.say(f"starting: bash {script}  (kind {kind or 'unknown'}, port {port})")
    return server.start(
        cfg.runs_dir,
        ["bash", str(script)],
        kind=kind,
        port=port,
        health_path=health_path(kind),
        ready_timeout_s=cfg.server.ready_timeout_s,
        stop_timeout_s=cfg.server.stop_timeout_s,
        batch_size=settings.batch_size,
        concurrency=settings.concurrency,
        script=str(script),
        vram_used_mib_before=_vram_used(),
    )


def run_stop(args: argparse.Namespace) -> int:
    out = output_for(args)
    cfg = load_config(args)
    result = server.stop(cfg.runs_dir, cfg.server.stop_timeout_s)
    if result is None:
        out.say("calibrate manages no server here (no runs/server.json): nothing to stop")
        out.result({"stopped": False, "managed": False})
        return 0
    payload = {
        "stopped": result.gone,
        "managed": True,
        "pid": result.pid,
        "was": result.was,
        "signal": result.signal_sent,
        "exit_code": result.exit_code,
    }
    out.result(payload)
    if result.was == "stranger":
        out.warn(
            f"PID {result.pid} now belongs to another program "
            f"({process.cmdline(result.pid)[:80]}): not signalled; stale pidfile removed"
        )
        return 0
    if result.was == "gone":
        out.say(f"the managed server (PID {result.pid}) had already exited; pidfile removed")
        return 0
    if not result.gone:
        out.fail(f"PID {result.pid} is still alive after SIGKILL")
        return 1
    code = f", exit code {result.exit_code}" if result.exit_code is not None else ""
    out.ok(
        f"stopped PID {result.pid} ({result.signal_sent}, {result.elapsed_s:.1f} s{code}); PID gone"
    )
    return 0


def run_status(args: argparse.Namespace) -> int:
    out = output_for(args)
    cfg = load_config(args)
    record = process.load(cfg.runs_dir)
    if record is None:
        out.say("no managed server (start one: calibrate server start)")
        out.result({"managed": False, "state": "none"})
        return 0
    state = process.liveness(record)
    ready = False
    if state == "running":
        ready, _ = readiness.probe(server.local_root(record.port), record.health_path)
    starting = " (still starting: not ready yet)" if record.phase == "starting" else ""
    if record.left_starting():
        starting = " (left starting by an interrupted start: calibrate server stop ends it)"
    shown = {
        "running": f"running{starting}",
        "gone": "exited",
        "stranger": "exited (PID reused by another program)",
    }
    ended = exit_status.read(Path(record.status_file), record.pid) if record.status_file else None
    if state == "gone" and ended is not None:
        shown["gone"] = f"{ended.describe()} at {ended.ended_at}"
    out.say(
        f"server PID {record.pid}: {shown[state]}{', ready' if ready else ''}; port {record.port}; "
        f"started {record.started_at}"
    )
    out.say(f"command: {' '.join(redaction.redact_argv(record.argv))}")
    setting = ", ".join(
        f"{name} {value}"
        for name, value in (("batch", record.batch_size), ("concurrency", record.concurrency))
        if value is not None
    )
    setting = setting or "the command's own (no batch size or concurrency given)"
    out.say(f"setting: {setting}; log: {process.log_path(cfg.runs_dir)}")
    out.result(
        {
            "managed": True,
            "state": state,
            "ready": ready,
            **record.to_json(),
            "exit": ended.to_json() if ended else None,
        }
    )
    return 0


def run_logs(args: argparse.Namespace) -> int:
    out = output_for(args)
    cfg = load_config(args)
    lines = process.log_tail(cfg.runs_dir, args.lines)
    if args.json:
        out.result({"log": str(process.log_path(cfg.runs_dir)), "lines": lines})
    else:
        sys.stdout.write("".join(f"{line}\n" for line in lines))
    if not lines:
        out.say(f"{process.log_path(cfg.runs_dir)} is empty or missing")
    return 0
