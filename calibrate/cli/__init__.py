"""Command line: argv → config → one stage call → write + render. The error tree is caught here.

Each command lives in its own module exposing ``register(subparsers)``; the parser it adds sets
``run=<function(args) -> int>``. ``main(argv)`` returns the exit code (SPEC §2). It imports the
module of the command argv names and no other (``parser.py``): ``calibrate --help`` and
``--version`` load no command, no stage and no library beyond the standard one.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

from calibrate import interrupts, redact
from calibrate.cli import streams
from calibrate.cli.parser import COMMAND_MODULES, CommandLine, build_parser, named_command
from calibrate.errors import OUT_OF_ROOM, CalibrateError, ExitCode, os_error_text

__all__ = ["COMMAND_MODULES", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code; never raises for a user mistake.

    The signal handlers and the guarded streams come first, before anything slow (importing
    the commands): a Ctrl-C in the first half-second is "interrupted", not a traceback.
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    redact.forget_all()
    try:
        with streams.safe_streams(), _sigterm_interrupts(), interrupts.never_lost():
            try:
                return streams.delivered(_run(args_list))
            except KeyboardInterrupt as exc:  # before or after a command ran
                print(_interrupted_text(exc), file=sys.stderr)
                return ExitCode.INTERRUPTED
    except KeyboardInterrupt:  # a second Ctrl-C while the first is reported
        return ExitCode.INTERRUPTED


def _interrupted_text(exc: KeyboardInterrupt) -> str:
    """``interrupted``, plus what happened to an engine being started (see server.start)."""
    return f"interrupted: {redact.printable(str(exc))}" if str(exc) else "interrupted"


def _run(args_list: list[str]) -> int:
    command = named_command(args_list)
    with interrupts.deferred():  # the command's modules load: no import can lose a Ctrl-C
        parser = build_parser(command)
        if command:  # and what reads its flags as UTF-8 (the config's text rules: not for --help)
            importlib.import_module("calibrate.cli.argv_text")
    try:
        args = parser.parse_args(args_list, namespace=CommandLine(tuple(args_list)))
    except SystemExit as exc:  # argparse exits 2 on bad flags, 0 on --help
        return int(exc.code) if isinstance(exc.code, int) else ExitCode.USAGE
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return ExitCode.USAGE
    debug = bool(getattr(args, "debug", False))
    _log_to_stderr(debug)
    try:
        from calibrate.cli.argv_text import read_as_utf8  # loaded with the command

        read_as_utf8(parser, args, lambda line: print(line, file=sys.stderr))
        return int(args.run(args))
    except CalibrateError as exc:
        if debug:
            traceback.print_exc()
        print(redact.printable(exc.render()), file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt as exc:
        print(_interrupted_text(exc), file=sys.stderr)
        return ExitCode.INTERRUPTED
    except OSError as exc:  # the last resort: a stage turns its own write errors into messages
        if debug:
            traceback.print_exc()
        print(
            f"error: {os_error_text(exc)}; fix the path (permissions, free space) and run again",
            file=sys.stderr,
        )  # one exit code per cause: a full disk is 1 (as after a stage), a wrong path 2
        return ExitCode.FAILED if exc.errno in OUT_OF_ROOM else ExitCode.USAGE
    except MemoryError:
        if debug:
            traceback.print_exc()
        print(
            "error: out of memory; what completed is on disk. Lower the sizes or counts "
            "(batch sizes, concurrency, items) and run again.",
            file=sys.stderr,
        )
        return ExitCode.FAILED


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is now (main() may run many times in one process)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class _OneStyle(logging.Formatter):
    """``warning: …`` / ``error: …``: a library warning reads like every other warning."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{record.levelname.lower()}: {redact.printable(record.getMessage())}"
        if record.exc_info and logging.getLogger("calibrate").isEnabledFor(logging.DEBUG):
            line += "\n" + self.formatException(record.exc_info)  # tracebacks with --debug only
        return line


def _log_to_stderr(debug: bool) -> None:
    """Library warnings (a skipped ledger line, a server that ignored SIGTERM) go to stderr."""
    logger = logging.getLogger("calibrate")
    logger.setLevel(logging.DEBUG if debug else logging.WARNING)
    if not any(isinstance(h, _CurrentStderr) for h in logger.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(_OneStyle())
        logger.addHandler(handler)
    logger.propagate = False


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, handled like Ctrl-C: the stage records what it kept and says how to
    resume (exit 130)."""


HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """While a command runs, SIGTERM and SIGHUP raise ``Terminated``; a second one kills at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        for sig in HANDLED_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        raise Terminated

    previous = {sig: signal.signal(sig, handler) for sig in HANDLED_SIGNALS}
    try:
        yield
    finally:
        for sig, before in previous.items():
            if before is not None:
                signal.signal(sig, before)
