"""``[server] env``: the engine's environment, on every managed start and in the pinned script.

vLLM's CPU build needs ``VLLM_CPU_KVCACHE_SPACE``; real deployments set ``CUDA_VISIBLE_DEVICES``
and ``VLLM_*``/``SGLANG_*``/``LMDEPLOY_*``/``OLLAMA_*``. A managed start used to inherit only
calibrate's own environment and ``pin`` never wrote it. Here a fake ``vllm`` on PATH records the
environment it was started with and serves as the mock, so the starts are real.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from calibrate.engines.builders import LaunchSpec, build
from tests.fakes import free_port, install_fake_engines, passing_ladder, recorded_run
from tests.helpers import write_config

SECRET = "hf-env-secret-0123456789abcdef"
HOSTILE = "a b 'c' $(touch pwned) `id`"
ENV_TOML = (
    "[server.env]\n"
    "VLLM_CPU_KVCACHE_SPACE = 4\n"
    'CUDA_VISIBLE_DEVICES = "0,1"\n'
    f'HF_TOKEN = "{SECRET}"\n'
    f'ODD = "{HOSTILE}"\n'
)

FAKE_VLLM = """#!/bin/sh
# a vLLM stand-in: records the variables it was started with, then serves the mock
env >>"$FAKE_ENGINE_OUT"; echo '---' >>"$FAKE_ENGINE_OUT"
port=8000; slots=0
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port=$2; shift ;;
    --max-num-seqs) slots=$2; shift ;;
  esac
  shift
done
exec "$CALIBRATE_PYTHON" -m calibrate mock --ttft 0.002 --per-token 0.0005 --port "$port" --slots "$slots"
"""


def _configure(
    root: Path, port: int, env: str = ENV_TOML, kind: str = "vllm", extra: str = ""
) -> None:
    server = (
        f'[server]\nkind = "{kind}"\nmodel_path = "/models/m"\nport = {port}\n'
        f"ready_timeout_s = 20\nstop_timeout_s = 5\n{extra}{env}"
    )
    write_config(root / "calibrate.toml", f"http://127.0.0.1:{port}/v1", server)


def _fake_vllm(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = root / "vllmbin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(FAKE_VLLM, encoding="utf-8")
    (bin_dir / "vllm").chmod(0o755)
    out = root / "vllm.env"
    repo = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ENGINE_OUT", str(out))
    monkeypatch.setenv("CALIBRATE_PYTHON", sys.executable)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    return out


def _starts(out: Path) -> list[dict[str, str]]:
    """The environment of each start, in order."""
    starts = []
    for block in out.read_text("utf-8").split("---\n")[:-1]:
        env = {}
        for line in block.splitlines():
            name, eq, value = line.partition("=")
            if eq and name.isidentifier():
                env[name] = value
        starts.append(env)
    return starts


def test_the_env_table_joins_every_kinds_command() -> None:
    env = (("CUDA_VISIBLE_DEVICES", "1"), ("VLLM_CPU_KVCACHE_SPACE", "4"))
    for kind in ("vllm", "sglang", "lmdeploy", "llamacpp", "tgi", "ollama"):
        command = build(LaunchSpec(kind, "/m", 9000, 4, 4, env=env))  # type: ignore[arg-type]
        assert command.env[-2:] == env, kind
    custom = build(LaunchSpec("custom", "", 9000, 4, 4, command="srv --port {port}", env=env))
    assert custom.env == env
    ollama = build(LaunchSpec("ollama", "", 9000, 4, 4, env=env))
    assert [n for n, _ in ollama.env] == ["OLLAMA_HOST", "OLLAMA_NUM_PARALLEL", *dict(env)]


def test_every_managed_start_gets_it_and_nothing_stores_the_secret(
    cli: Any, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """server start, then the sweep's restart at cap B: both engines got the table; the secret's
    value is in no output, no run file and not in the pinned script, which says to set it."""
    out = _fake_vllm(isolated, monkeypatch)
    # the conservative answer under noise: beside two CPU burners the sweep could not tell
    # concurrency 2 from 1 and exited 1, and the restart is what this test is about
    fast = "[confidence]\nconservative = true\n"
    fast += "[sweep]\nconcurrency = [1, 2]\nlevel_s = 0.1\nrepeats = 2\n"
    _configure(isolated, free_port())
    path = isolated / "calibrate.toml"
    path.write_text(fast + path.read_text("utf-8"), encoding="utf-8")
    shown = []
    try:
        shown.append(cli("server", "start", "--batch-size", "1", "--concurrency", "1"))
        assert shown[-1].code == 0, shown[-1].err
        passing_ladder(isolated, str(cli("status", "--json").json["target"]), batch_size=2)
        shown.append(cli("sweep", "--json"))
        assert shown[-1].code == 0, shown[-1].err
        shown.append(cli("status", "--show-config", "--json"))
        shown.append(cli("server", "status", "--json"))
        shown.append(cli("pin", "--json"))
        assert shown[-1].code == 0, shown[-1].err
    finally:
        cli("server", "stop")
    starts = _starts(out)
    assert len(starts) == 2, "server start, then the sweep's restart at cap 2"
    for env in starts:
        assert env["VLLM_CPU_KVCACHE_SPACE"] == "4" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
        assert env["HF_TOKEN"] == SECRET and env["ODD"] == HOSTILE
    config_env = shown[2].json["config"]["server"]["env"]
    assert config_env["HF_TOKEN"] == "***" and config_env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert "HF_TOKEN='***'" in shown[0].err, "the start line shows the variable, masked"
    for result in shown:
        assert SECRET not in result.out + result.err
    for file in [isolated / "scripts/launch.sh", *(isolated / "runs").rglob("*")]:
        if file.is_file():
            assert SECRET not in file.read_text("utf-8", errors="replace"), file
    script = (isolated / "scripts/launch.sh").read_text("utf-8")
    assert "export VLLM_CPU_KVCACHE_SPACE=4" in script and "export HF_TOKEN\n" in script
    assert ': "${HF_TOKEN:?set HF_TOKEN' in script
    assert not (isolated / "pwned").exists()


def test_the_pinned_script_sets_the_env_and_runs_no_value(cli: Any, isolated: Path) -> None:
    _configure(isolated, 8123)
    passing_ladder(isolated, str(cli("status", "--json").json["target"]), batch_size=4)
    assert cli("pin").code == 0
    bin_dir = install_fake_engines(isolated / "fakebin")
    out = isolated / "engine.argv"
    done = subprocess.run(
        [str(isolated / "scripts/launch.sh")],
        cwd=isolated,
        env={
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "FAKE_ENGINE_OUT": str(out),
            "HOME": str(isolated),
            "HF_TOKEN": "from-the-caller",
        },
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    argv, env = recorded_run(out)
    assert argv[argv.index("--max-num-seqs") + 1] == "4"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4" and env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["ODD"] == HOSTILE and env["HF_TOKEN"] == "from-the-caller"
    assert not (isolated / "pwned").exists()


@pytest.mark.parametrize(
    ("kind", "env", "said"),
    [
        ("vllm", '"BAD NAME" = "1"', "is not a variable name"),
        ("vllm", '"1X" = "1"', "is not a variable name"),
        ("vllm", 'X = "a\\nb"', "NUL or a line break"),
        ("vllm", "X = [1, 2]", "must be a string"),
        ("vllm", "X = true", "must be a string"),
        ("ollama", 'OLLAMA_NUM_PARALLEL = "8"', "calibrate sets for ollama"),
        ("ollama", 'OLLAMA_HOST = "0.0.0.0:1"', "calibrate sets for ollama"),
        ("vllm", 'BATCH_SIZE = "8"', "a variable of the launch script"),
    ],
)
def test_a_bad_env_is_exit_2_before_anything_starts(
    cli: Any, isolated: Path, kind: str, env: str, said: str
) -> None:
    _configure(isolated, 8123, env=f"[server.env]\n{env}\n", kind=kind)
    result = cli("server", "start", "--batch-size", "2")
    assert result.code == 2, result.err
    assert said in result.err and "env" in result.err
    assert not (isolated / "runs/server.json").exists()


def test_env_written_as_an_inline_table_is_the_same(cli: Any, isolated: Path) -> None:
    _configure(isolated, 8123, env='env = { CUDA_VISIBLE_DEVICES = "2" }\n')
    shown = cli("status", "--show-config", "--json")
    assert shown.code == 0, shown.err
    assert shown.json["config"]["server"]["env"] == {"CUDA_VISIBLE_DEVICES": "2"}
