"""Start-up: ``calibrate --help`` and ``--version`` load the command line's own core and the
standard library, nothing else (no command, no stage, no pandas, rich, urllib3 or pynvml);
``calibrate COMMAND …`` loads that command. The help lists each command by a summary kept in
``cli/parser.py``: it is each command module's own first docstring line, never a stale copy.
(How long a start takes is a figure of ``make bench``, never asserted here.)"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from calibrate.cli.parser import COMMANDS, Command, build_parser, named_command

# What the command line itself is made of; a module added here must import no library beyond
# the standard one, or `calibrate --help` slows down for everyone.
CORE = {
    "calibrate",
    "calibrate.__main__",
    "calibrate.cli",
    "calibrate.cli.parser",
    "calibrate.cli.streams",
    "calibrate.errors",
    "calibrate.interrupts",
    "calibrate.redact",
}
HEAVY = ("pandas", "rich", "urllib3", "pynvml", "jq", "matplotlib", "numpy", "aiohttp")

# The console script's own code (pip writes it so), then the modules it loaded, on the last line.
_PROBE = """
import json, sys
before = set(sys.modules)
sys.argv = ["calibrate", *{argv!r}]
from calibrate.__main__ import run
code = run()
loaded = sorted(set(sys.modules) - before)
print("\\n" + json.dumps({{"code": code, "loaded": loaded}}))
"""


def _loaded(argv: list[str], cwd: Path | None = None) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(argv=argv)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return int(result["code"]), list(result["loaded"])


@pytest.mark.parametrize(
    ("argv", "code"),
    [(["--help"], 0), (["--version"], 0), (["-h"], 0), ([], 2), (["no-such-command"], 2)],
)
def test_help_and_version_load_nothing_but_the_command_line_and_the_standard_library(
    argv: list[str], code: int
) -> None:
    got, loaded = _loaded(argv)
    assert got == code
    heavy = [m for m in loaded if m.split(".")[0] in HEAVY]
    assert heavy == [], f"calibrate {' '.join(argv)} imported {heavy}"
    stages = [m for m in loaded if m.startswith(("calibrate.stages", "calibrate.cli.calibration"))]
    assert stages == [], f"calibrate {' '.join(argv)} imported a command's stage: {stages}"
    ours = sorted(m for m in loaded if m.split(".")[0] == "calibrate")
    assert set(ours) <= CORE, f"beyond the command line's core: {sorted(set(ours) - CORE)}"
    libraries = [
        m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names and m not in CORE
    ]
    assert libraries == [], f"calibrate {' '.join(argv)} imported libraries: {libraries}"


def test_a_command_loads_its_own_module_and_no_other_commands() -> None:
    code, loaded = _loaded(["init", "--help"])
    assert code == 0
    assert {c.module for c in COMMANDS} & set(loaded) == {"calibrate.cli.init"}


def test_the_mock_loads_no_stage_no_configuration_and_no_client_library() -> None:
    """``calibrate mock`` is the engine of every managed server the suite and ``make demo``
    start: it serves, so it loads the mock and the command line, not the configuration, a
    stage, the HTTP client or urllib3 (about 0.2 s of CPU on each start, doubled)."""
    code, loaded = _loaded(["mock", "--help"])
    assert code == 0
    heavy = [m for m in loaded if m.split(".")[0] in HEAVY]
    assert heavy == [], f"calibrate mock imported {heavy}"
    beyond = ("calibrate.config", "calibrate.stages", "calibrate.http", "calibrate.load")
    ours = [m for m in loaded if m.startswith(beyond)]
    assert ours == [], f"calibrate mock imported {ours}"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_each_summary_is_its_command_modules_own_first_line(command: Command) -> None:
    """The line ``--help`` shows is the first line of the docstring ``COMMAND --help`` shows."""
    module = importlib.import_module(command.module)
    assert (module.__doc__ or "").strip().splitlines()[0] == command.summary


def _listed(parser: argparse.ArgumentParser) -> list[tuple[str, str | None]]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [(a.dest, a.help) for a in action._choices_actions]


def test_the_help_from_summaries_is_the_help_of_every_commands_own_parser() -> None:
    """Listed from the summaries or from the commands' own parsers (what a command registers,
    whatever doc it passes), ``calibrate --help`` is the same text, command by command."""
    loaded_all, none_loaded = build_parser(), build_parser("")
    assert _listed(loaded_all) == [(c.name, c.summary) for c in COMMANDS]
    assert _listed(none_loaded) == _listed(loaded_all)
    assert none_loaded.format_help() == loaded_all.format_help()
    assert build_parser("ladder").format_help() == loaded_all.format_help()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_the_command_argv_names_is_the_one_whose_parser_is_loaded(command: Command) -> None:
    name = command.name
    parser = build_parser(name)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert sub.choices[name].get_default("run") is not None, f"{name} registers no runner"
    others = [n for n, p in sub.choices.items() if n != name and p.get_default("run")]
    assert others == [], f"building {name}'s parser loaded {others}"


@pytest.mark.parametrize(
    "argv",
    [
        ["ladder"],
        ["ladder", "--tasks", "sweep"],
        ["--debug", "pin", "run"],
        ["-v", "--json", "batch", "--input", "ladder"],
        ["-x", "status"],
        ["server", "start", "--kind", "vllm"],
    ],
)
def test_named_command_is_the_command_argparse_chooses(argv: list[str]) -> None:
    """The top-level parser takes no option with a value: argparse runs the first word that is
    not an option, the word ``named_command`` loads."""
    args, _ = build_parser().parse_known_args(argv)
    assert args.command == named_command(argv)


@pytest.mark.parametrize("argv", [[], ["--help"], ["--version"], ["no-such-command", "ladder"]])
def test_where_argv_names_no_command_none_is_loaded(argv: list[str]) -> None:
    assert named_command(argv) == ""


@pytest.mark.parametrize("argv", [["status"], ["server", "status"], ["pin", "--help"]])
def test_a_command_that_reads_what_stages_wrote_loads_none_of_those_stages(
    argv: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``status`` shows what every stage recorded (a batch's drift among it) from the ledger:
    it loaded the whole batch stage (its sending, its worker processes) for the drift record's
    reader, a tenth of a second on every call. What is remembered lives in ``state/``."""
    _, loaded = _loaded(argv, tmp_path_factory.mktemp("empty"))
    measuring = ("batch", "ladder", "sweep", "tune", "rollback", "measure", "determinism")
    stages = sorted(
        {m for m in loaded if m.startswith(tuple(f"calibrate.stages.{s}" for s in measuring))}
    )
    assert stages == [], f"calibrate {' '.join(argv)} loaded {stages}"
    assert not [m for m in loaded if m.startswith("calibrate.load")], "the load engine"
