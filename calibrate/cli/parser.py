"""The command line before any command loads: the commands with their one-line summaries, the
parser class and namespace every command's parser uses, and the top-level parser.

``calibrate --help`` lists each command by the summary kept here, so it imports no command's
module (nor its stage, pandas, rich or urllib3); ``calibrate COMMAND …`` loads that command's
module alone. Each summary is the first line of its module's docstring (``tests/test_help.py``
checks that they never drift). This module imports the standard library only.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from calibrate import __version__


@dataclass(frozen=True)
class Command:
    """One command: its name, the module whose ``register(subparsers)`` adds its parser, and the
    line ``calibrate --help`` shows for it."""

    name: str
    module: str
    summary: str


def _command(name: str, folder: str, summary: str) -> Command:
    return Command(name, f"calibrate.cli.{folder}{name}", summary)


# In the order `calibrate --help` lists them; the staged calibration's own commands live together
# in calibration/.
COMMANDS: tuple[Command, ...] = (
    _command(
        "init", "", "Write a commented starter calibrate.toml (never overwrites an existing file)."
    ),
    _command(
        "run",
        "calibration.",
        "Stages A→E in one command: single → repro → ladder → sweep → pin, then what to run next.",
    ),
    _command(
        "single",
        "calibration.",
        "Stage A: send the fixed prompt once at temperature 0 and check the answer is complete.",
    ),
    _command(
        "repro",
        "calibration.",
        "Stage B: run the fixed prompt again and diff it with the baseline; or diff two files.",
    ),
    _command(
        "ladder",
        "calibration.",
        "Stage C: step the batch size (1→2→4→8), two rounds per tier, VRAM sampled throughout.",
    ),
    _command(
        "sweep",
        "calibration.",
        "Stage C′: at the verified batch size, step concurrency (1, 2, 4, 8, 16…) and find the "
        "knee.",
    ),
    _command(
        "tune",
        "calibration.",
        "Stage C″: search the engine's own flags — restart per candidate, measure, rank, keep the "
        "best.",
    ),
    _command(
        "report",
        "",
        "Re-render a run from its files, no server needed: its table, plot, HTML report or a "
        "comparison.",
    ),
    _command(
        "rollback",
        "calibration.",
        "Stage D: return the server to the last passing tier (concurrency 1), with proof.",
    ),
    _command(
        "pin",
        "calibration.",
        "Stage E: write scripts/launch.sh for your engine with the verified batch size and "
        "concurrency.",
    ),
    _command(
        "verify",
        "calibration.",
        "Stage E′: after a restart, check the server still gives the baseline answer.",
    ),
    _command(
        "server",
        "",
        "Manage the inference server process from [server] in calibrate.toml: start, stop, "
        "status, logs.",
    ),
    _command(
        "status",
        "calibration.",
        "Where the target stands: stages passed, last passing tier, what was pinned, what next.",
    ),
    _command(
        "batch",
        "",
        "Stage F: run a tasks file through the server — concurrent, resumable, retrying, "
        "format-checked.",
    ),
    _command(
        "export",
        "",
        "One clean result per input id, in input order, from batch journals (and shard journals).",
    ),
    _command(
        "mock",
        "",
        "Run the built-in mock OpenAI-compatible server (deterministic, fake GPU, fault "
        "injection).",
    ),
)

COMMAND_MODULES: tuple[str, ...] = tuple(c.name for c in COMMANDS)
_BY_NAME = {c.name: c for c in COMMANDS}


class StrictParser(argparse.ArgumentParser):
    """A parser that takes a flag only as it is spelled: never an abbreviation of a longer one
    (``ladder --mode prompt-list`` read as ``--model prompt-list`` changed the target). Every
    sub-command's parser is of this class too: ``add_subparsers`` makes its parsers of the class
    of the parser it was called on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


class CommandLine(argparse.Namespace):
    """One command's parsed flags and, as ``argv``, the words they were parsed from (the ledger
    and the manifest record them, redacted): given to argparse before parsing, never added after."""

    argv: tuple[str, ...]

    def __init__(self, argv: tuple[str, ...] = ()) -> None:
        super().__init__(argv=argv)


def named_command(argv: Sequence[str]) -> str:
    """The command ``argv`` names: its first word that is not an option (the top-level parser
    takes no option with a value, so argparse picks the same word), or ``""``."""
    word = next((w for w in argv if not w.startswith("-")), "")
    return word if word in _BY_NAME else ""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; with ``only``, that command's parser alone (none for ``""``),
    every other command listed in the help by its summary, its module not imported."""
    parser = StrictParser(
        prog="calibrate",
        description=(
            "Staged calibration of a local LLM behind an OpenAI-compatible server:\n"
            "single → repro → ladder → sweep (→ tune) → pin/verify, rollback, batch;\n"
            "calibrate run does single → repro → ladder → sweep → pin in one command."
        ),
        epilog="example: calibrate run --base-url http://127.0.0.1:8000/v1 --model internlm-s2 "
        "--kind vllm",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"calibrate {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        if only is None or command.name == only:
            importlib.import_module(command.module).register(subparsers)
        else:  # listed, never chosen: named_command loads whichever argv names
            subparsers.add_parser(command.name, help=command.summary)
    return parser
