"""``server start --script FILE``: a launch script runs; what is plainly not one is refused.

Seen: ``calibrate server start --script calibrate.toml`` (the config, given by mistake) went to
bash, which ran ``[target]`` as a command; calibrate waited for a server and said exit 4 with
"command not found" lines in the log. An empty file "exited with code 0 before it was ready".
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fakes import free_port, managed_config, mock_command

pytestmark = pytest.mark.usefixtures("repo_on_pythonpath")

NOT_SCRIPTS = {
    "calibrate.toml": (b'[target]\nbase_url = "http://127.0.0.1:1/v1"\n', "a TOML file"),
    "settings.conf": (b'[server]\nkind = "vllm"\nport = 8000\n', "a TOML file"),
    "config.json": (b'{"server": {"kind": "vllm"}}\n', "a JSON file"),
    "launch.json.sh": (b'{"server": {"kind": "vllm"}}\n', "a JSON file"),
    "empty.sh": (b"", "empty"),
    "comments.sh": (b"#!/usr/bin/env bash\n# nothing here\n\n", "empty"),
    "binary.sh": (b"\x7fELF\x02\x01\x01\x00\x00\xd0\xff\x00", "not a text file"),
    "nul.sh": (b"echo a\x00b\n", "not a text file"),
    "launch.py": (b"#!/usr/bin/env python3\nprint('serve')\n", "a python3 script"),
    "broken.sh": (b"#!/usr/bin/env bash\nif then\n", "not a script bash can read"),
}


@pytest.mark.parametrize("name", sorted(NOT_SCRIPTS))
def test_a_file_that_is_no_launch_script_is_exit_2_before_anything_starts(
    cli, isolated: Path, name: str
) -> None:
    managed_config(isolated, free_port(), mock_command())
    content, said = NOT_SCRIPTS[name]
    (isolated / name).write_bytes(content)
    result = cli("server", "start", "--script", name)
    assert result.code == 2, result.err
    first = " ".join(result.err.split())
    assert f"--script {name}: {said}" in first, result.err
    assert "give the script calibrate pin wrote (scripts/launch.sh)" in first
    assert (
        not (isolated / "runs/server.json").exists() and not (isolated / "runs/server.log").exists()
    )


def test_a_directory_or_a_missing_file_is_exit_2_naming_it(cli, isolated: Path) -> None:
    managed_config(isolated, free_port(), mock_command())
    (isolated / "scripts").mkdir()
    for given, said in (("scripts", "a directory"), ("scripts/launch.sh", "no such file")):
        result = cli("server", "start", "--script", given)
        assert result.code == 2 and f"--script {given}: {said};" in result.err, result.err
    assert not (isolated / "runs/server.json").exists()


def test_a_users_own_bash_script_still_starts(cli, isolated: Path) -> None:
    """Not written by pin, no header: a bash script that execs the server runs as before."""
    port = free_port()
    managed_config(isolated, port, mock_command())
    script = isolated / "mine.sh"
    command = mock_command().replace("{port}", str(port)).replace("{concurrency}", "2")
    script.write_text(f"#!/bin/sh\nset -eu\nexec {command}\n", encoding="utf-8")
    os.chmod(script, 0o755)
    started = cli("server", "start", "--script", str(script), "--json")
    try:
        assert started.code == 0, started.err
        assert started.json["argv"] == ["bash", str(script)]
    finally:
        assert cli("server", "stop").code == 0
