"""A custom [server] command whose {batch_size} or {concurrency} has no value yet: the hint says
what to pass, never "calibrate a setting first" — the ladder needs this very server running."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import write_config


@pytest.mark.parametrize(
    ("placeholder", "flag"), [("batch_size", "--batch-size"), ("concurrency", "--concurrency")]
)
def test_a_custom_command_without_a_value_says_what_to_pass_not_to_run_the_ladder(
    cli, isolated: Path, placeholder: str, flag: str
) -> None:
    command = f"calibrate mock --port {{port}} --slots {{{placeholder}}}"
    server = f'[server]\nkind = "custom"\nport = 8123\ncommand = "{command}"\n'
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:8123/v1", server)
    result = cli("server", "start")
    assert result.code == 2, result.err
    assert f"Pass it: calibrate server start {flag} N (before a " in result.err, result.err
    assert "ladder, then" not in result.err and "setting first" not in result.err, result.err
