"""Every command has help text that ends with an example."""

from __future__ import annotations

import subprocess
import sys

import pytest

from calibrate.cli import COMMAND_MODULES


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
