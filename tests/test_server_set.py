"""``calibrate server start --set KEY=VALUE`` fills a custom command's placeholders outside tune
(issue 26), and every later managed start (rollback here) and pin's script use the same values."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest

from calibrate.server import process
from tests.fakes import free_port, managed_config, passing_ladder, pythonpath_env
from tests.helpers import FAKE_KEY

MOCK = [sys.executable, "-m", "calibrate", "mock", "--ttft", "0.002", "--per-token", "0.0005"]
# {slots} is a placeholder of the user's own: neither tune nor a setting gives it a value
COMMAND = shlex.join(MOCK) + " --port {port} --slots {slots} --seed {seed}"


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", pythonpath_env())
    monkeypatch.setenv("CALIBRATE_API_KEY", FAKE_KEY)


def _argv(root: Path) -> list[str]:
    return list(json.loads((root / "runs/server.json").read_text("utf-8"))["argv"])


def test_a_placeholder_without_a_value_names_it_and_the_flag(cli, isolated: Path) -> None:
    managed_config(isolated, free_port(), COMMAND)
    result = cli("server", "start")
    assert result.code == 2
    assert "the [server] command uses {slots} but no value is known for it" in result.err
    assert "calibrate server start --set slots=VALUE" in result.err
    assert "Traceback" not in result.err
    half = cli("server", "start", "--set", "slots=2")
    assert half.code == 2 and "uses {seed} but no value is known" in half.err
    assert "--set seed=VALUE" in half.err
    assert process.load(isolated / "runs") is None


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("slots", "--set 'slots' is not KEY=VALUE"),
        ("=4", "is not KEY=VALUE"),
        ("nope=1", "--set nope: the [server] command has no {nope} placeholder"),
        ("batch_size=2", "Use calibrate server start --batch-size N"),
        ("port=9", "--set port: the [server] command has no {port} placeholder"),
        ("slots=4 8", "--set slots: value '4 8' is not allowed"),
    ],
)
def test_a_wrong_set_is_exit_2_naming_it(cli, isolated: Path, item: str, message: str) -> None:
    managed_config(isolated, free_port(), COMMAND)
    result = cli("server", "start", "--set", item, "--set", "seed=1")
    assert result.code == 2, result.err
    assert message in result.err
    assert process.load(isolated / "runs") is None


def test_set_values_fill_the_command_and_later_managed_starts_reuse_them(
    cli, isolated: Path
) -> None:
    port = free_port()
    managed_config(isolated, port, COMMAND)
    started = cli("server", "start", "--set", "slots=3", "--set", "seed=5", "--json")
    try:
        assert started.code == 0, started.err
        assert "--slots 3 --seed 5" in shlex.join(_argv(isolated))
        assert "--set values kept for later managed starts: slots=3, seed=5" in started.err
        single = cli("single", "--json")
        assert single.code == 0, single.err
        passing_ladder(isolated, single.json["record"]["target"], batch_size=4)
        # rollback restarts the managed command: the same {slots} and {seed}
        rollback = cli("rollback", "--json")
        assert rollback.code == 0, rollback.err
        assert "--slots 3 --seed 5" in shlex.join(_argv(isolated))
        assert cli("server", "stop").code == 0
        # the script pin writes starts the same command
        pinned = cli("pin")
        assert pinned.code == 0, pinned.err
        assert "--slots 3 --seed 5" in (isolated / "scripts/launch.sh").read_text("utf-8")
        # a plain start later: still the kept values; --set KEY=VALUE replaces one
        again = cli("server", "start", "--set", "slots=1")
        assert again.code == 0, again.err
        assert "--slots 1 --seed 5" in shlex.join(_argv(isolated))
    finally:
        cli("server", "stop")


def test_an_engine_flag_is_set_on_a_known_kind_and_its_cap_is_refused(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.fakes import install_fake_engines, recorded_run

    port = free_port()
    (isolated / "calibrate.toml").write_text(
        f'[target]\nbase_url = "http://127.0.0.1:{port}/v1"\nmodel = "internlm-s2"\n'
        f'[server]\nkind = "vllm"\nmodel_path = "/models/m"\nport = {port}\n'
        "ready_timeout_s = 5\nstop_timeout_s = 2\n",
        encoding="utf-8",
    )
    cap = cli("server", "start", "--set", "max_num_seqs=8")
    assert cap.code == 2 and "Use calibrate server start --batch-size N" in cap.err
    unknown = cli("server", "start", "--set", "slots=8")
    assert unknown.code == 2 and "--set slots: not a vllm flag calibrate sets" in unknown.err
    assert "max_model_len" in unknown.err
    bin_dir = install_fake_engines(isolated / "fakebin")
    out = isolated / "engine.argv"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ENGINE_OUT", str(out))
    cli("server", "start", "--set", "max_model_len=8192")  # the fake engine exits at once
    argv, _ = recorded_run(out)
    assert argv[argv.index("--max-model-len") + 1] == "8192"
