"""``[server] args``: the user's own engine flags, for every kind calibrate knows (issue 26, 9).

Table-driven over vLLM, SGLang, LMDeploy, llama.cpp and TGI: the args come verbatim and in
order after the engine's own flags, in every start and in pin's launch.sh (quoted: a value with
spaces, quotes or ``$(…)`` stays one literal argument); a flag calibrate sets itself is refused
(exit 2, naming it, before anything starts); a key-like flag is masked wherever it is shown or
stored; a flag tune (or ``--set``) gives replaces the one in args. Through the real CLI, a fake
``vllm`` on PATH records its argv and serves as the mock, so a managed vLLM start really runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from calibrate.engines.args import OWN_FLAGS
from calibrate.engines.builders import LaunchSpec, build
from tests.fakes import free_port, install_fake_engines, passing_ladder, recorded_run
from tests.helpers import write_config

KINDS = ("vllm", "sglang", "lmdeploy", "llamacpp", "tgi")
# a vLLM and an LMDeploy deployment's flags, and values a shell would misread
DEPLOY = {
    "vllm": [
        "--tensor-parallel-size",
        "2",
        "--gpu-memory-utilization",
        "0.9",
        "--max-model-len",
        "8192",
        "--quantization",
        "awq",
    ],
    "lmdeploy": ["--tp", "2", "--session-len", "8192", "--cache-max-entry-count", "0.8"],
}
HOSTILE = ["--chat-template", "a b 'c' \"d\" $(touch pwned) `id` ; rm -rf x", "--trust-remote-code"]
SECRET = "sk-args-secret-0123456789abcdef"
# kind → the flag calibrate sets from the batch size (the cap), and its port flag
CAP_FLAG = {
    "vllm": "--max-num-seqs",
    "sglang": "--max-running-requests",
    "lmdeploy": "--max-batch-size",
    "llamacpp": "--parallel",
    "tgi": "--max-concurrent-requests",
}
PORT_FLAG = {"lmdeploy": "--server-port"}


def _args_toml(args: list[str]) -> str:
    return f"args = {json.dumps(args, ensure_ascii=False)}\n"


def _configure(root: Path, kind: str, args: list[str], port: int = 8123, extra: str = "") -> None:
    server = (
        f'[server]\nkind = "{kind}"\nmodel_path = "/models/m"\nport = {port}\n'
        f"ready_timeout_s = 20\nstop_timeout_s = 5\n{_args_toml(args)}{extra}"
    )
    write_config(root / "calibrate.toml", f"http://127.0.0.1:{port}/v1", server)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("args", [DEPLOY["vllm"], DEPLOY["lmdeploy"], HOSTILE])
def test_args_follow_the_engines_own_flags_in_order(kind: str, args: list[str]) -> None:
    own = build(LaunchSpec(kind, "/models/m", 9000, 4, 8, "internlm-s2")).argv  # type: ignore[arg-type]
    given = build(LaunchSpec(kind, "/models/m", 9000, 4, 8, "internlm-s2", args=tuple(args)))  # type: ignore[arg-type]
    assert given.argv == (*own, *args), "the engine's flags unchanged, then args verbatim"
    assert CAP_FLAG[kind] in own and given.argv.count(CAP_FLAG[kind]) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_pin_writes_the_args_quoted_and_the_script_passes_them_literally(
    cli: Any, isolated: Path, kind: str
) -> None:
    args = [*DEPLOY["vllm"], *HOSTILE]
    _configure(isolated, kind, args)
    passing_ladder(isolated, str(cli("status", "--json").json["target"]), batch_size=4)
    result = cli("pin", "--json")
    assert result.code == 0, result.err
    script = isolated / "scripts/launch.sh"
    text = script.read_text("utf-8")
    assert "--tensor-parallel-size 2 --gpu-memory-utilization 0.9" in text
    assert "'a b '\"'\"'c'\"'\"' \"d\" $(touch pwned) `id` ; rm -rf x'" in text, "shell-quoted"
    bin_dir = install_fake_engines(isolated / "fakebin")
    out = isolated / "engine.argv"
    done = subprocess.run(
        [str(script)],
        cwd=isolated,
        env={
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "FAKE_ENGINE_OUT": str(out),
            "HOME": str(isolated),
        },
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    argv, _ = recorded_run(out)
    assert argv[-len(args) :] == args, "the script passes every arg as one literal word"
    assert argv[argv.index(CAP_FLAG[kind]) + 1] == "4", "the cap is still the verified batch"
    assert not (isolated / "pwned").exists(), "nothing in a value ran"


def _refusal_cases() -> list[tuple[str, list[str], str]]:
    cases: list[tuple[str, list[str], str]] = []
    for kind in KINDS:
        cap = CAP_FLAG[kind]
        port = PORT_FLAG.get(kind, "--port")
        cases += [
            (kind, ["--tp", "2", cap, "8"], cap),
            (kind, [f"{cap}=8"], cap),
            (kind, [cap.replace("-", "_").replace("__", "--", 1), "8"], cap),
            (kind, [port, "9001"], port),
        ]
    cases += [
        ("vllm", ["--model", "/other"], "--model"),
        ("vllm", ["--served-model-name", "x"], "--served-model-name"),
        ("sglang", ["--model-path", "/other"], "--model-path"),
        ("tgi", ["--model-id", "/other"], "--model-id"),
        ("lmdeploy", ["--model-name", "x"], "--model-name"),
        ("llamacpp", ["-np", "8"], "-np"),
        ("llamacpp", ["--threads-http", "64"], "--threads-http"),
        ("llamacpp", ["-m", "/other.gguf"], "-m"),
    ]
    return cases


@pytest.mark.parametrize(("kind", "args", "flag"), _refusal_cases())
def test_a_flag_calibrate_sets_is_refused_before_anything_starts(
    cli: Any, isolated: Path, monkeypatch: pytest.MonkeyPatch, kind: str, args: list[str], flag: str
) -> None:
    bin_dir = install_fake_engines(isolated / "fakebin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ENGINE_OUT", str(isolated / "engine.argv"))
    _configure(isolated, kind, args, port=free_port())
    result = cli("server", "start", "--batch-size", "4")
    assert result.code == 2, result.err
    assert f"[server] in calibrate.toml: args sets {flag}, which" in result.err
    assert "remove it" in result.err
    assert "Traceback" not in result.err
    assert not (isolated / "engine.argv").exists(), "no engine was started"
    assert not (isolated / "runs/server.json").exists()


def test_the_cap_refusal_says_where_the_value_comes_from(cli: Any, isolated: Path) -> None:
    _configure(isolated, "vllm", ["--max-num-seqs", "8"])
    err = cli("status").err
    assert (
        "[server] args sets --max-num-seqs, which calibrate sets from the batch size: remove it; "
        "the ladder finds it" in err.replace(" in calibrate.toml:", "")
    )
    _configure(isolated, "vllm", ["--port", "9001"])
    assert "set the port there" in cli("status").err
    _configure(isolated, "llamacpp", ["-c", "8192"])  # your context: used (test_pin_context)
    assert cli("status").code == 0


def test_a_kind_given_on_the_command_line_is_checked_too(cli: Any, isolated: Path) -> None:
    """No [server] kind in the file: ``server start --kind lmdeploy`` refuses its cap flag."""
    server = f'[server]\nmodel_path = "/m"\nport = {free_port()}\n'
    server += _args_toml(["--max-batch-size", "8"])
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:8123/v1", server)
    result = cli("server", "start", "--kind", "lmdeploy", "--batch-size", "4")
    assert result.code == 2, result.err
    assert "args sets --max-batch-size" in result.err
    assert not (isolated / "runs/server.json").exists()


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("ollama", "ollama serve takes no engine flags"),
        ("custom", "put the flags in [server] command"),
    ],
)
def test_ollama_and_custom_refuse_args_saying_what_to_do(
    cli: Any, isolated: Path, kind: str, said: str
) -> None:
    extra = 'command = "my-server --port {port}"\n' if kind == "custom" else ""
    _configure(isolated, kind, ["--tp", "2"], extra=extra)
    result = cli("status")
    assert result.code == 2 and said in result.err, result.err


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('args = "--tp 2"', "must be a list of strings"),
        ('args = ["--tp", 2]', "must be a string"),
        (f"args = {json.dumps(['--x'] * 65)}", "at most 64"),
        ('args = ["--chat-template", "a\\nb"]', "a NUL or a line break"),
        ('args = ["--x", "a\\u0000b"]', "a NUL or a line break"),
        ('args = ["--x\\r"]', "a NUL or a line break"),
    ],
)
def test_malformed_args_are_exit_2(cli: Any, isolated: Path, line: str, said: str) -> None:
    server = f'[server]\nkind = "vllm"\nmodel_path = "/m"\n{line}\n'
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:8123/v1", server)
    result = cli("status", "--show-config")
    assert result.code == 2, result.err
    assert "server.args" in result.err or "[server]" in result.err
    assert said in result.err and "Traceback" not in result.err


def test_empty_and_64_args_are_accepted_and_shown(cli: Any, isolated: Path) -> None:
    _configure(isolated, "vllm", [])
    assert cli("status", "--show-config", "--json").json["config"]["server"]["args"] == []
    _configure(isolated, "vllm", [f"--x{i}" for i in range(64)])
    shown = cli("status", "--show-config", "--json")
    assert shown.code == 0, shown.err
    assert len(shown.json["config"]["server"]["args"]) == 64


# A fake vLLM: records its argv, then serves as the mock on the port (and cap) it was given.
FAKE_VLLM = """#!/bin/sh
{ printf '%s\\0' "$@"; printf '\\n'; } >>"$FAKE_ENGINE_OUT"
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


def _fake_vllm(root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = root / "vllmbin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(FAKE_VLLM, encoding="utf-8")
    (bin_dir / "vllm").chmod(0o755)
    out = root / "vllm.argv"
    repo = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ENGINE_OUT", str(out))
    monkeypatch.setenv("CALIBRATE_PYTHON", sys.executable)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    return out


def _starts(out: Path) -> list[list[str]]:
    """Every start's argv, in order (an entry holds no line break: args refuses one)."""
    lines = out.read_bytes().split(b"\n")[:-1]
    return [[a.decode() for a in line.split(b"\0")[:-1]] for line in lines]


def _argv(out: Path) -> list[str]:
    return _starts(out)[-1]


def test_a_managed_vllm_start_runs_the_args_and_masks_a_key_everywhere(
    cli: Any, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _fake_vllm(isolated, monkeypatch)
    args = [*DEPLOY["vllm"], "--api-key", SECRET, "--chat-template", "a b $(touch pwned)"]
    _configure(isolated, "vllm", args, port=free_port())
    started = cli("server", "start", "--batch-size", "4", "--json")
    try:
        assert started.code == 0, started.err
        argv = _argv(out)
        assert argv[: argv.index("--max-num-seqs") + 2][-2:] == ["--max-num-seqs", "4"]
        assert argv[-len(args) :] == args, "the engine got every arg, in order, after its own"
        shown = [
            started,
            cli("server", "status", "--json"),
            cli("status", "--show-config", "--json"),
        ]
        config_args = shown[-1].json["config"]["server"]["args"]
        assert config_args[:8] == DEPLOY["vllm"] and config_args[8:10] == ["--api-key", "***"]
        passing_ladder(isolated, str(cli("status", "--json").json["target"]), batch_size=4)
        shown.append(cli("pin", "--json"))
        assert shown[-1].code == 0, shown[-1].err
    finally:
        assert cli("server", "stop").code == 0
    script = (isolated / "scripts/launch.sh").read_text("utf-8")
    assert '--api-key "$VLLM_API_KEY"' in script
    assert "--tensor-parallel-size 2 --gpu-memory-utilization 0.9" in script
    for result in shown:
        assert SECRET not in result.out + result.err
    for path in [isolated / "scripts/launch.sh", *(isolated / "runs").rglob("*")]:
        if path.is_file():
            assert SECRET not in path.read_text("utf-8", errors="replace"), path
    assert not (isolated / "pwned").exists()


def test_a_tuned_flag_replaces_the_one_in_args_and_says_so(
    cli: Any, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``server start --set gpu_memory_utilization=0.8`` (as a tune candidate would) wins over
    args' 0.9: the engine gets the flag once, with 0.8, and the start says which one it used."""
    spec = LaunchSpec(
        "vllm",
        "/m",
        9000,
        4,
        4,
        tuned=(("gpu_memory_utilization", "0.8"), ("max_model_len", "4096")),
        args=("--gpu-memory-utilization", "0.9", "--tp", "2", "--max_model_len=8192"),
    )
    command = build(spec)
    assert command.argv.count("--gpu-memory-utilization") == 1
    assert command.argv[command.argv.index("--gpu-memory-utilization") + 1] == "0.8"
    assert "--max_model_len=8192" not in command.argv and command.argv[-2:] == ("--tp", "2")
    assert len(command.notes) == 2

    out = _fake_vllm(isolated, monkeypatch)
    _configure(isolated, "vllm", DEPLOY["vllm"], port=free_port())
    started = cli("server", "start", "--batch-size", "2", "--set", "gpu_memory_utilization=0.8")
    try:
        assert started.code == 0, started.err
        argv = _argv(out)
        assert argv.count("--gpu-memory-utilization") == 1
        assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.8"
        assert argv[-6:] == ["--tensor-parallel-size", "2", *DEPLOY["vllm"][4:]]
        assert (
            "note: --gpu-memory-utilization 0.8 (tuned) replaces --gpu-memory-utilization 0.9 "
            "from [server] args" in started.err
        )
    finally:
        assert cli("server", "stop").code == 0


def test_the_sweeps_restart_at_cap_b_keeps_the_args(
    cli: Any, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """server start at batch 1, a ladder verified 4: the sweep restarts the managed vLLM at
    --max-num-seqs 4, and that start carries the same args, in order, after its own flags."""
    out = _fake_vllm(isolated, monkeypatch)
    fast = "[ladder]\nmin_round_s = 0\nwarmup_waves = 0\n"
    fast += "[sweep]\nconcurrency = [1, 2]\nlevel_s = 0.1\nrepeats = 2\n"
    # the restart is the point, not the knee: noise between 0.1 s levels takes the conservative
    # answer (a sweep beside four CPU burners could not tell 2 from 1: exit 1)
    fast += "[confidence]\nconservative = true\n"
    _configure(isolated, "vllm", DEPLOY["vllm"], port=free_port())
    path = isolated / "calibrate.toml"
    path.write_text(path.read_text("utf-8") + fast, encoding="utf-8")
    try:
        assert cli("server", "start", "--batch-size", "1", "--concurrency", "1").code == 0
        passing_ladder(isolated, str(cli("status", "--json").json["target"]), batch_size=4)
        result = cli("sweep", "--json")
    finally:
        cli("server", "stop")
    assert result.code == 0, result.err
    assert "restarting the managed server at cap 4" in result.err
    starts = _starts(out)
    assert [argv[argv.index("--max-num-seqs") + 1] for argv in starts] == ["1", "4"]
    assert all(argv[-len(DEPLOY["vllm"]) :] == DEPLOY["vllm"] for argv in starts)


def test_own_flag_tables_cover_the_cap_and_port_of_every_kind() -> None:
    for kind in KINDS:
        assert CAP_FLAG[kind] in OWN_FLAGS[kind]
        assert PORT_FLAG.get(kind, "--port") in OWN_FLAGS[kind]
