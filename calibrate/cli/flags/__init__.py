"""The flags every command shares. Standard library and calibrate's lightest modules only: a
command that opens no stage (``calibrate mock``, the engine of every managed test server)
imports no more; the configuration the flags resolve and the stage they open are
``resolve.py``'s."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from calibrate.cli.parser import CommandLine as CommandLine  # the command line's own, for
from calibrate.cli.parser import StrictParser as StrictParser  # the commands that build parsers
from calibrate.io.output_paths import check_writable

Runner = Callable[[argparse.Namespace], int]


def add_command(
    subparsers: Any, name: str, doc: str, run: Runner, *, target: bool = True
) -> argparse.ArgumentParser:
    """Add one sub-command. ``doc``'s first line is the summary; it should end with an example."""
    summary = doc.strip().splitlines()[0]
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name,
        help=summary,
        description=doc.strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(run=run)
    parser.add_argument("--config", metavar="PATH", help="config file (default: calibrate.toml)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    if target:
        parser.add_argument(
            "--base-url", metavar="URL", help="server URL, e.g. http://host:8000/v1"
        )
        parser.add_argument("--model", metavar="NAME", help="model name the server registered")
    return parser


def add_force(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--force", action="store_true", help="run even though the gate is closed (recorded)"
    )


def add_wide(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wide",
        action="store_true",
        help="tables with every column (default: the essential ones, fitting 100 columns; "
        "tiers.csv, the JSON and --html have them all)",
    )


def add_compare_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jq", metavar="PROGRAM", help="jq program that normalises each record")
    parser.add_argument(
        "--ignore",
        metavar="FIELD",
        action="append",
        default=[],
        help="also drop this field before comparing (repeatable; dotted paths work)",
    )


def add_check_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of a stage that checks the fixed prompt: --jq, --ignore, --force, --junit."""
    add_compare_args(parser)
    add_force(parser)
    add_junit(parser)


def add_junit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--junit", metavar="PATH", help="also write a JUnit XML report here (CI)")


def check_junit_path(args: argparse.Namespace) -> None:
    """--junit must name a file we can write: not a directory, in a writable folder (exit 2)."""
    if junit := getattr(args, "junit", None):
        check_writable(Path(junit), "--junit", "report.xml")
