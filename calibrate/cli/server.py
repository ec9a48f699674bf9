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
from typing import Any

from calibrate.cli.flags import add_command
from calibrate.cli.flags.resolve import load_config
from calibrate.cli.output import output_for
from calibrate.engines.builders import SERVER_KINDS
from calibrate.errors import UsageError
from calibrate.server import manage, process
from calibrate.server.lifecycle import stop
from calibrate.stages.server_start import StartRequest, start_server

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
    start.add_argument(
        "--script",
        metavar="PATH",
        help="start from the script pin wrote (or a bash script of yours that starts the server)",
    )
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


def run_start(args: argparse.Namespace) -> int:
    out = output_for(args)
    cfg = load_config(args)
    req = StartRequest(args.script, args.kind, args.batch_size, args.concurrency, tuple(args.set))
    started = start_server(cfg, req, out.say)
    out.ok(manage.ready_line(started, cfg.runs_dir))
    out.result(manage.ready_json(started))
    return 0


def run_stop(args: argparse.Namespace) -> int:
    out = output_for(args)
    cfg = load_config(args)
    level, line, code, payload = manage.stop_outcome(stop(cfg.runs_dir, cfg.server.stop_timeout_s))
    out.tell([(level, line)])
    out.result(payload)
    return code


def run_status(args: argparse.Namespace) -> int:
    out = output_for(args)
    lines, payload = manage.status_report(load_config(args).runs_dir)
    for line in lines:
        out.say(line)
    out.result(payload)
    return 0


def run_logs(args: argparse.Namespace) -> int:
    if args.lines < 1:  # a tail of no lines is no answer about the log: never "empty"
        raise UsageError(
            f"-n must be at least 1, got {args.lines}", "example: calibrate server logs -n 100"
        )
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
