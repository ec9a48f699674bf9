"""Key-like flags and variables in a server command never reach a file or a message.

`server start` / `status` / a stage's manifest / `status --show-config` / `pin`'s script, all
with a custom command carrying `--api-key X`, `--password=X`, `--hf-token X` and `HF_TOKEN=X`.
The pinned script still works: it takes each secret from an environment variable.
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

SECRETS = ("sk-flag-0001", "pw-equals-0002", "hf-token-0003", "hf-env-0004")


pytestmark = pytest.mark.usefixtures("repo_on_pythonpath")


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def _files_text(root: Path) -> str:
    return "\n".join(p.read_text("utf-8", errors="replace") for p in root.rglob("*") if p.is_file())


def test_server_files_messages_and_manifests_hide_secret_flags(cli, isolated: Path) -> None:
    port = free_port()
    mock = shlex.join([sys.executable, "-m", "calibrate", "mock", "--ttft", "0.002"])
    command = (
        f"env HF_TOKEN={SECRETS[3]} bash -c ': --api-key {SECRETS[0]} "
        f"--password={SECRETS[1]}; exec {mock} --port {{port}} --slots {{concurrency}}' "
        f"calib --hf-token {SECRETS[2]}"
    )
    managed_config(isolated, port, command)
    started = cli("server", "start", "--concurrency", "2", "--json")
    try:
        assert started.code == 0, started.err
        assert "--max-num-batched-tokens" not in started.err  # (not a vLLM command here)
        assert "--api-key ***" in started.err and "HF_TOKEN=***" in started.err
        status = cli("server", "status", "--json")
        single = cli("single", "--json")
        assert single.code == 0, single.err
        shown = cli("status", "--show-config", "--json")
        outputs = "".join(r.out + r.err for r in (started, status, single, shown))
        assert _leaks(outputs) == []
        assert _leaks(_files_text(isolated / "runs")) == []
        manifest = next((isolated / "runs").glob("*-single-*/manifest.json")).read_text()
        assert "--password=***" in manifest
    finally:
        assert cli("server", "stop").code == 0


def test_pin_script_takes_secrets_from_the_environment(cli, isolated: Path) -> None:
    command = (
        f"env HF_TOKEN={SECRETS[3]} fake-engine --model {{model_path}} --api-key "
        f"{SECRETS[0]} --password={SECRETS[1]} --max-num-batched-tokens 8192 "
        "--slots {concurrency}"
    )
    server = (
        f'[server]\nkind = "custom"\nmodel_path = "/m"\nport = 8123\n'
        f"command = {json.dumps(command)}\n"
    )
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:8123/v1", server)
    passing_ladder(isolated, cli("status", "--json").json["target"])
    pinned = cli("pin", "--json")
    assert pinned.code == 0, pinned.err
    script = isolated / "scripts/launch.sh"
    text = script.read_text()
    assert _leaks(text + pinned.out + pinned.err + _files_text(isolated / "runs")) == []
    assert "# set SERVER_API_KEY before running it" in text
    assert '--api-key "$SERVER_API_KEY"' in text

    bin_dir = install_fake_engines(isolated / "fakebin")
    out = isolated / "engine.argv"
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_ENGINE_OUT": str(out)}
    missing = subprocess.run([str(script)], env=env, capture_output=True, text=True, check=False)
    assert missing.returncode != 0 and "set HF_TOKEN: it carries" in missing.stderr
    env.update(SERVER_API_KEY="k1", SERVER_PASSWORD="k2", HF_TOKEN="k3")
    done = subprocess.run([str(script)], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    argv, engine_env = recorded_run(out)
    assert argv[argv.index("--api-key") + 1] == "k1" and "--password=k2" in argv
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "8192"
    assert engine_env["HF_TOKEN"] == "k3"
