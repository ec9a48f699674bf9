"""llama.cpp is started and pinned with --threads-http ≥ the most requests in flight + 2 (SPEC
§5.8): its few default HTTP threads are held by kept-alive connections, and the rest stall."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from calibrate.engines.builders import LaunchSpec, build
from tests.fakes import append_ledger, install_fake_engines, passing_ladder, recorded_run
from tests.helpers import write_config


def _threads(argv: tuple[str, ...]) -> str | None:
    return argv[argv.index("--threads-http") + 1] if "--threads-http" in argv else None


@pytest.mark.parametrize(
    ("batch", "concurrency", "threads"),
    [(4, 16, "18"), (4, 2, "6"), (1, 1, "3"), (8, None, "10"), (None, None, None)],
)
def test_a_llamacpp_start_gets_threads_for_what_is_in_flight(
    batch: int | None, concurrency: int | None, threads: str | None
) -> None:
    argv = build(LaunchSpec("llamacpp", "/m/x.gguf", 9000, batch, concurrency)).argv
    assert _threads(argv) == threads
    assert argv.count("--threads-http") == (1 if threads else 0)
    if batch:
        assert argv[argv.index("--parallel") + 1] == str(batch), "the cap stays the batch"


def test_other_engines_get_no_llamacpp_flag() -> None:
    for kind in ("vllm", "sglang", "lmdeploy", "tgi", "ollama"):
        assert "--threads-http" not in build(LaunchSpec(kind, "/m", 9000, 4, 16)).argv  # type: ignore[arg-type]


def test_a_custom_llama_server_command_gets_it_unless_the_user_set_it() -> None:
    base = "/opt/llama/bin/llama-server -m {model_path} --port {port} --parallel {batch_size}"

    def argv(command: str) -> tuple[str, ...]:
        return build(LaunchSpec("custom", "/m/x.gguf", 9000, 4, 8, command=command)).argv

    assert _threads(argv(base)) == "10"
    assert _threads(argv(base + " --threads-http 64")) == "64", "the user's value stays"
    assert _threads(argv(base + " --threads-http 3")) == "3", "never changed, even when low"
    assert argv(base + " --threads-http=2").count("--threads-http") == 0
    assert "--threads-http=2" in argv(base + " --threads-http=2")
    other = argv("my-server --model {model_path} --port {port}")
    assert "--threads-http" not in other, "only llama-server knows the flag"


def test_pin_writes_threads_http_for_the_recommended_concurrency(cli, isolated: Path) -> None:
    """Batch 4 verified, the sweep recommends 8 in flight: the launch script caps the engine at
    --parallel 4 and gives it --threads-http 10, and the script really passes it."""
    server = '[server]\nkind = "llamacpp"\nmodel_path = "/models/m.gguf"\nport = 8123\n'
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:8123/v1", server)
    target = str(cli("status", "--json").json["target"])
    passing_ladder(isolated, target, batch_size=4)
    append_ledger(isolated, "sweep", target, {"recommended_concurrency": 8, "batch_size": 4})
    result = cli("pin", "--json")
    assert result.code == 0, result.err
    text = (isolated / "scripts/launch.sh").read_text("utf-8")
    assert "--threads-http 10" in text and "--parallel 4" in text

    bin_dir = install_fake_engines(isolated / "fakebin")
    out = isolated / "engine.argv"
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_ENGINE_OUT": str(out)}
    done = subprocess.run(
        [str(isolated / "scripts/launch.sh")],
        cwd=isolated,
        env={**env, "HOME": str(isolated)},
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    argv, _ = recorded_run(out)
    assert argv[argv.index("--threads-http") + 1] == "10"
    ledger = json.loads((isolated / "runs/ledger.jsonl").read_text().splitlines()[-1])
    assert "--threads-http 10" in ledger["summary"]["command"]


def test_a_managed_llamacpp_short_of_threads_for_the_sweep_is_restarted() -> None:
    """``server start --batch-size 4`` gives llama.cpp 6 HTTP threads; a sweep to 16 in flight
    needs 18, so calibrate restarts it (with the flag) before the sweep, and says why."""
    from calibrate.stages.prepare.server_cap import short_of_threads

    started = build(LaunchSpec("llamacpp", "/m.gguf", 9000, 4, None)).argv
    assert (
        short_of_threads(started, "llamacpp", 4, 16) == ", with --threads-http 18 for 16 in flight"
    )
    enough = build(LaunchSpec("llamacpp", "/m.gguf", 9000, 4, 16)).argv
    assert short_of_threads(enough, "llamacpp", 4, 16) == ""
    assert short_of_threads(enough, "llamacpp", 4, 8) == "", "more threads than needed: kept"
    bare = ("llama-server", "-m", "/m.gguf", "--parallel", "4")
    assert short_of_threads(bare, "llamacpp", 4, 4) == ", with --threads-http 6 for 4 in flight"
    assert short_of_threads(bare, "vllm", 4, 16) == "", "only llama.cpp has the flag"
