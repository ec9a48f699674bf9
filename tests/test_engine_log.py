"""The engine's own output reaches runs/server.log without the secrets it was given.

Engines print their arguments (vLLM logs ``api_key='…'``): with a secret in the command, the
supervisor copies the engine's output into the log with every secret value masked — on stdout
and stderr, in a line cut by ``\\r``, in a last line without a newline — and still records how
the engine ended. Driven through `calibrate server start` with the mock as the engine.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import free_port, managed_config

SECRETS = ("sk-engine-key-0001", "hf-env-token-0002", "pw-equals-0003")
MOCK = shlex.join([sys.executable, "-m", "calibrate", "mock", "--ttft", "0.002"])


pytestmark = pytest.mark.usefixtures("repo_on_pythonpath")


def _command(then: str) -> str:
    program = (
        'echo "args: $*"; echo "token: $HF_TOKEN" >&2; printf "loading $1 $2\\r"; '
        f'printf "api_key={SECRETS[0]}"; echo; {then}'
    )
    return (
        f"env HF_TOKEN={SECRETS[1]} bash -c {shlex.quote(program)} calib "
        f"--api-key {SECRETS[0]} --password={SECRETS[2]}"
    )


def test_the_engine_log_holds_no_secret_and_the_engine_still_runs(cli: Any, isolated: Path) -> None:
    port = free_port()
    managed_config(isolated, port, _command(f"exec {MOCK} --port {{port}} --slots {{concurrency}}"))
    started = cli("server", "start", "--concurrency", "1")
    try:
        assert started.code == 0, started.err
        assert cli("single").code == 0
    finally:
        stopped = cli("server", "stop", "--json")
    assert stopped.code == 0 and stopped.json["signal"] == "SIGTERM", stopped.err
    log = (isolated / "runs/server.log").read_text("utf-8")
    assert "args: --api-key *** --password=***" in log and "token: ***" in log
    assert f"mock listening on http://127.0.0.1:{port}/v1" in log, "the output still arrives"
    assert [s for s in SECRETS if s in log] == []
    ended = json.loads((isolated / "runs/server.exit.json").read_text())
    assert ended["pid"] == stopped.json["pid"] and ended["exit_code"] == stopped.json["exit_code"]


def test_an_engine_that_dies_reports_its_code_and_a_clean_tail(cli: Any, isolated: Path) -> None:
    managed_config(isolated, free_port(), _command("exit 3"))
    result = cli("server", "start")
    assert result.code == 4 and "exited with code 3" in result.err, result.err
    assert "args: --api-key *** --password=***" in result.err
    log = (isolated / "runs/server.log").read_text("utf-8")
    for text in (result.err, log):
        assert [s for s in SECRETS if s in text] == []


def test_an_engine_without_secrets_writes_its_log_directly(cli: Any, isolated: Path) -> None:
    managed_config(isolated, free_port(), "bash -c 'echo plain output; exit 5'")
    result = cli("server", "start")
    assert result.code == 4 and "exited with code 5" in result.err
    assert "plain output" in (isolated / "runs/server.log").read_text("utf-8")
