"""A custom server command that runs a shell: no placeholder value can ever run anything.

Driven through `calibrate server start` (the real mock as the engine, behind `bash -c`) and
`calibrate pin` (the script run with a fake engine), with hostile values in every placeholder.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import (
    free_port,
    install_fake_engines,
    managed_config,
    passing_ladder,
    recorded_run,
)
from tests.helpers import write_config

pytestmark = pytest.mark.usefixtures("repo_on_pythonpath")


def hostile(root: Path) -> str:
    """Every way out of a shell word, each creating a file under ``root`` if it ever runs."""
    p = shlex.quote(str(root))
    return (
        f"/m; touch {p}/semi; $(touch {p}/dollar) `touch {p}/tick` ' ; touch {p}/single ; '"
        f'" ; touch {p}/double ; "\\\n touch {p}/newline & touch {p}/amp'
    )


def created(root: Path) -> list[str]:
    names = ("semi", "dollar", "tick", "single", "double", "newline", "amp", "x", "y")
    return [n for n in names if (root / n).exists()]


MOCK = shlex.join([sys.executable, "-m", "calibrate", "mock", "--ttft", "0.002"])
# The placeholder in every quoting context a shell program has: bare, "…" and '…'.
SHELL_COMMANDS = [
    "bash -c 'echo loading {model_path} at {batch_size}; exec "
    + MOCK.replace("'", "")
    + " --port {port} --slots {concurrency}'",
    "sh -ec \"echo loading '{model_path}'; exec "
    + MOCK.replace("'", "")
    + ' --port {port} --slots {concurrency}"',
    'env X=1 bash -lc \'echo "loading {model_path}" {batch_size}; exec '
    + MOCK.replace("'", "")
    + ' --port "{port}" --slots {concurrency}\'',
]


@pytest.mark.parametrize("command", SHELL_COMMANDS)
def test_server_start_runs_a_shell_command_without_running_hostile_values(
    cli, isolated: Path, command: str
) -> None:
    port = free_port()
    path = hostile(isolated)
    managed_config(isolated, port, command, extra="")
    toml = (isolated / "calibrate.toml").read_text()
    (isolated / "calibrate.toml").write_text(toml + f"model_path = {json.dumps(path)}\n")
    started = cli("server", "start", "--batch-size", "3", "--concurrency", "2", "--json")
    try:
        assert started.code == 0, started.err
        log = (isolated / "runs/server.log").read_text()
        assert "loading /m; touch" in log and "$(touch" in log, "the value arrived literally"
    finally:
        assert cli("server", "stop").code == 0
    assert created(isolated) == [], "a placeholder value ran as a command"


def test_pin_script_of_a_shell_command_keeps_hostile_values_literal(cli, isolated: Path) -> None:
    path = hostile(isolated)
    command = "bash -c 'exec fake-engine --model {model_path} --port {port} --slots {concurrency}'"
    server = (
        f'[server]\nkind = "custom"\nmodel_path = {json.dumps(path)}\nport = 8123\n'
        f"command = {json.dumps(command)}\n"
    )
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:8123/v1", server)
    passing_ladder(isolated, cli("status", "--json").json["target"])
    pinned = cli("pin", "--json")
    assert pinned.code == 0, pinned.err
    script = isolated / "scripts/launch.sh"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    bin_dir = install_fake_engines(isolated / "fakebin")
    out = isolated / "engine.argv"
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_ENGINE_OUT": str(out),
        "HOME": str(isolated),
    }
    done = subprocess.run(
        [str(script)],
        cwd=isolated,
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    argv, _ = recorded_run(out)
    assert argv[argv.index("--model") + 1] == path
    assert argv[argv.index("--slots") + 1] == "1"
    assert created(isolated) == []


def test_hostile_numbers_and_a_reparsing_shell_are_refused_before_anything_runs(
    cli, isolated: Path
) -> None:
    p = shlex.quote(str(isolated))
    command = "bash -c 'exec srv --port {port} --batch {batch_size} --slots {concurrency}'"
    managed_config(isolated, free_port(), command)
    for flag in ("--batch-size", "--concurrency"):
        bad = cli("server", "start", flag, f"1; touch {p}/x")
        assert bad.code == 2 and "Traceback" not in bad.err
    toml = (isolated / "calibrate.toml").read_text()
    port_line = next(line for line in toml.splitlines() if line.startswith("port ="))
    (isolated / "calibrate.toml").write_text(
        toml.replace(port_line, f'port = "1; touch {isolated}/x"')
    )
    bad_port = cli("server", "start", "--batch-size", "1", "--concurrency", "1")
    assert bad_port.code == 2 and "server.port" in bad_port.err
    # a shell program that parses its text twice (eval) cannot be made safe by quoting
    managed_config(
        isolated,
        free_port(),
        "bash -c 'eval srv --model {model_path}'",
        extra=f"model_path = {json.dumps(hostile(isolated))}\n",
    )
    refused = cli("server", "start")
    assert refused.code == 2, refused.err
    assert "parsed twice" in refused.err and "Traceback" not in refused.err
    assert not (isolated / "runs/server.pid").exists()
    assert created(isolated) == []


def _values(root: Path) -> list[str]:
    """Hostile model paths, each creating a file under ``root`` if it ever runs."""
    p = str(root)
    return [
        f"/m$(touch {p}/x)",
        f"/m`touch {p}/x`",
        f"/m'; touch {p}/x; '",
        f'/m"; touch {p}/x; "',
        f"/m\ntouch {p}/x",
        f"/m; touch {p}/y",
        f"/m) ; touch {p}/y ; (",
    ]


# A spot whose quoting context is not the one around it: inside $(…) (bare or in "…"),
# backticks, $'…', a here-document, and a value handed as "$1" to eval.
NESTED_COMMANDS = [
    'bash -c "echo $(readlink -f {model_path}); exec srv --port {port}"',
    "bash -c 'echo \"$(readlink -f {model_path})\"; exec srv --port {port}'",
    "bash -c 'm=`readlink -f {model_path}`; exec srv --model \"$m\" --port {port}'",
    "bash -c \"echo $'{model_path}'; exec srv --port {port}\"",
    "bash -c 'cat <<EOF\n{model_path}\nEOF\nexec srv --port {port}'",
    "bash -c 'eval \"srv --model $1\"' calib {model_path}",
]


@pytest.mark.parametrize("command", NESTED_COMMANDS)
def test_a_value_inside_a_command_substitution_is_refused_in_start_and_pin(
    cli, isolated: Path, command: str
) -> None:
    for value in _values(isolated):
        extra = f"model_path = {json.dumps(value)}\n"
        managed_config(isolated, free_port(), command, extra=extra)
        started = cli("server", "start")
        assert started.code == 2, (value, started.err)
        assert "could run there" in started.err and "Traceback" not in started.err
        assert not (isolated / "runs/server.pid").exists()
        passing_ladder(isolated, cli("status", "--json").json["target"])
        pinned = cli("pin")
        assert pinned.code == 2 and "could run there" in pinned.err, (value, pinned.err)
        assert not (isolated / "scripts/launch.sh").exists()
    assert created(isolated) == [], "a placeholder value ran as a command"


def test_a_plain_value_inside_a_command_substitution_still_starts(cli, isolated: Path) -> None:
    port = free_port()
    command = (
        'bash -c \'echo "loading $(basename {model_path})"; exec '
        + MOCK.replace("'", "")
        + " --port {port} --slots {concurrency}'"
    )
    managed_config(isolated, port, command, extra='model_path = "/models/m-1.5@v2"\n')
    started = cli("server", "start", "--concurrency", "1")
    try:
        assert started.code == 0, started.err
        assert "loading m-1.5@v2" in (isolated / "runs/server.log").read_text()
    finally:
        assert cli("server", "stop").code == 0


def test_a_secret_flag_named_across_lines_stays_inside_its_comment(cli, isolated: Path) -> None:
    """A flag of the custom command that looks like a key names the variable the script reads
    it from, in a header comment: a line break inside that flag's name ended the comment, and
    what followed ran when the script did — before its `set -euo pipefail`."""
    marker = shlex.quote(str(isolated / "x"))
    flag = f"--x-key-\ntouch {marker};#"
    command = shlex.join(["fake-engine", "--slots", "{concurrency}", flag, "s3cret-v4lue"])
    server = f'[server]\nkind = "custom"\nport = 8123\ncommand = {json.dumps(command)}\n'
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:8123/v1", server)
    passing_ladder(isolated, cli("status", "--json").json["target"])
    pinned = cli("pin")
    assert pinned.code == 0, pinned.err
    script = isolated / "scripts/launch.sh"
    text = script.read_text()
    assert "s3cret-v4lue" not in text
    done = subprocess.run(  # its variable unset: the script stops at its own guard
        ["bash", str(script)], cwd=isolated, capture_output=True, text=True, timeout=20
    )
    assert done.returncode != 0 and "it carries" in done.stderr
    assert created(isolated) == [], "a line of the header comment ran"
