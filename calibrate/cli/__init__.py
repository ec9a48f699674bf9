"""Command line: argv → config → one stage call → write + render. The error tree is caught here.

Each command lives in its own module exposing ``register(subparsers)``; the parser it adds sets
``run=<function(args) -> int>``. ``main(argv)`` returns the exit code (SPEC §2).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback
from collections.abc import Sequence

from calibrate import __version__
from calibrate.errors import CalibrateError, ExitCode

# One module per command, in the order `calibrate --help` lists them.
COMMAND_MODULES: tuple[str, ...] = (
    "init",
    "single",
    "repro",
    "ladder",
    "sweep",
    "report",
    "rollback",
    "pin",
    "verify",
    "server",
    "status",
    "batch",
    "mock",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="calibrate",
        description=(
            "Staged calibration of a local LLM behind an OpenAI-compatible server: "
            "single → repro → ladder → sweep → pin/verify, rollback, batch."
        ),
        epilog="example: calibrate single --base-url http://127.0.0.1:8000/v1 --model internlm-s2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"calibrate {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"calibrate.cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code; never raises for a user mistake."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # argparse exits 2 on bad flags, 0 on --help
        return int(exc.code) if isinstance(exc.code, int) else ExitCode.USAGE
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return ExitCode.USAGE
    args.argv = args_list
    debug = bool(getattr(args, "debug", False))
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return int(args.run(args))
    except CalibrateError as exc:
        if debug:
            traceback.print_exc()
        print(exc.render(), file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
