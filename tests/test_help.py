"""Every command has help text that ends with an example."""

from __future__ import annotations

import subprocess
import sys

import pytest

from calibrate.cli import COMMAND_MODULES
from tests.helpers import REPO


def test_top_level_help(cli) -> None:
    result = cli("--help")
    assert result.code == 0
    for name in COMMAND_MODULES:
        assert name in result.out


@pytest.mark.parametrize("command", COMMAND_MODULES)
def test_every_command_has_help_with_example(cli, command: str) -> None:
    result = cli(command, "--help")
    assert result.code == 0
    assert "example:" in result.out, f"`calibrate {command} --help` shows no example"


def test_each_command_line_of_the_top_level_help_is_a_whole_sentence(cli) -> None:
    """`calibrate --help` shows each command's first docstring line: it must not stop mid-way."""
    import argparse

    from calibrate.cli import build_parser

    actions = build_parser()._actions
    subparsers = next(a for a in actions if isinstance(a, argparse._SubParsersAction))
    lines = {a.dest: a.help or "" for a in subparsers._choices_actions}
    assert set(lines) == set(COMMAND_MODULES)
    for name, line in lines.items():
        assert line.endswith((".", ")")), f"`calibrate --help` line for {name} stops: {line!r}"
        assert not line.rstrip(".").endswith((",", ";", ":", " and", " or")), name


def test_the_readme_names_the_commands_without_target_flags(cli) -> None:
    """The README says which commands take no --base-url/--model ("… take neither"); it is right."""
    import re

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    sentence = next(p for p in readme.split("\n\n") if "take neither" in p)
    named = set(re.findall(r"`(\w+)`", sentence.split("take neither")[0]))
    without = {c for c in COMMAND_MODULES if "--base-url" not in cli(c, "--help").out}
    assert without, "every command takes --base-url: the check is broken"
    assert named == without, f"README: {sorted(named)}; the parser: {sorted(without)}"


def test_no_command_is_usage_error(cli) -> None:
    assert cli().code == 2


def test_bad_flag_is_usage_error(cli) -> None:
    assert cli("single", "--no-such-flag").code == 2


def test_help_loads_none_of_the_heavy_or_optional_libraries() -> None:
    """--help works anywhere: pynvml, jq, pandas and matplotlib are imported only when used."""
    probe = (
        "import sys\n"
        "from calibrate.cli import build_parser\n"
        "build_parser().format_help()\n"
        "print(','.join(m for m in ('pynvml', 'jq', 'pandas', 'matplotlib') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def test_a_command_starts_without_importing_the_other_commands() -> None:
    """``calibrate batch …`` builds only batch's parser: the other commands' modules (a third
    of a second of start-up on every call) are not imported; ``--help`` lists all of them from
    their summaries and imports none (tests/test_startup.py)."""

    def imported(argv: list[str]) -> str:
        probe = (
            "import sys, contextlib, io\n"
            "from calibrate.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    main({argv!r})\n"
            "print(','.join(sorted(m.rsplit('.', 1)[1] for m in sys.modules\n"
            "    if m.startswith(('calibrate.cli.calibration.', 'calibrate.cli.mock')))))\n"
        )
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        return done.stdout.strip()

    assert imported(["batch", "--help"]) == ""
    assert imported(["--help"]) == ""
    assert imported(["ladder", "--help"]) == "ladder"
    assert imported(["--debug", "sweep", "-c", "2"]) == "sweep"  # the command argv names
