"""`calibrate pin`: a launch script per engine kind, quoted so a hostile model path runs nothing."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from calibrate.state.ledger import LedgerEntry
from tests.fakes import (
    KNEE_NOT_SURE,
    append_ledger,
    install_fake_engines,
    passing_ladder,
    recorded_run,
    unsure_setting,
)
from tests.helpers import write_config

HOSTILE = '/models/my model\'s "dir"; $(touch pwned) `touch pwned2` & $HOME'

# kind → (the engine's own flag, the value it must carry: batch 4 verified, the sweep recommends
# 8 in flight; the engine's cap is the verified batch and never more (SPEC §5.0), so it carries 4
# and the extra requests queue in the server)
ENGINE_FLAG: dict[str, tuple[str, str]] = {
    "vllm": ("--max-num-seqs", "4"),
    "llamacpp": ("--parallel", "4"),
    "sglang": ("--max-running-requests", "4"),
    "lmdeploy": ("--max-batch-size", "4"),
    "tgi": ("--max-concurrent-requests", "4"),
    "custom": ("--slots", "8"),
}
CUSTOM = "fake-engine --model {model_path} --port {port} --batch {batch_size} --slots {concurrency}"


def _configure(cli, root: Path, kind: str, model_path: str = HOSTILE) -> str:
    server = (
        f'[server]\nkind = "{kind}"\nmodel_path = {json.dumps(model_path)}\nport = 8123\n'
        f"command = {json.dumps(CUSTOM)}\n"
    )
    write_config(root / "calibrate.toml", "http://127.0.0.1:8123/v1", server)
    return str(cli("status", "--json").json["target"])


def _run_script(script: Path, root: Path) -> tuple[list[str], dict[str, str]]:
    bin_dir = install_fake_engines(root / "fakebin")
    out = root / "engine.argv"
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "FAKE_ENGINE_OUT": str(out),
        "HOME": str(root),
        "PORT": "9999",
    }
    done = subprocess.run(
        [str(script)], cwd=root, env=env, capture_output=True, text=True, timeout=20, check=False
    )
    assert done.returncode == 0, done.stderr
    return recorded_run(out)


@pytest.mark.parametrize("kind", sorted(ENGINE_FLAG))
def test_pin_writes_a_safe_script_for_every_kind(cli, isolated: Path, kind: str) -> None:
    target = _configure(cli, isolated, kind)
    passing_ladder(isolated, target, batch_size=4)
    append_ledger(isolated, "sweep", target, {"recommended_concurrency": 8, "batch_size": 4})
    result = cli("pin", "--json")
    assert result.code == 0, result.err
    script = isolated / "scripts/launch.sh"
    text = script.read_text("utf-8")
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert text.startswith("#!/usr/bin/env bash\n") and "\nset -euo pipefail\n" in text
    assert "20261129T160000Z-ladder-abcdef" in text, "the header names the verifying run"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    flag, value = ENGINE_FLAG[kind]
    assert f"{flag} {value}" in text
    assert "export BATCH_SIZE=4\n" in text and "export MAX_CONCURRENCY=8\n" in text

    argv, env = _run_script(script, isolated)
    assert not (isolated / "pwned").exists() and not (isolated / "pwned2").exists()
    assert HOSTILE in argv or f"--model={HOSTILE}" in argv, "the path is one literal argument"
    assert argv[argv.index(flag) + 1] == value
    assert env["MODEL_PATH"] == HOSTILE and env["PORT"] == "8123", "the caller's PORT is ignored"
    assert env["BATCH_SIZE"] == "4" and env["MAX_CONCURRENCY"] == "8"
    pin = json.loads((isolated / "runs/ledger.jsonl").read_text().splitlines()[-1])
    assert pin["stage"] == "pin" and pin["summary"]["script"] == "scripts/launch.sh"
    assert {k: pin["summary"][k] for k in ("batch_size", "concurrency", "kind")} == {
        "batch_size": 4,
        "concurrency": 8,
        "kind": kind,
    }


def test_pin_ollama_sets_its_environment(cli, isolated: Path) -> None:
    target = _configure(cli, isolated, "ollama")
    passing_ladder(isolated, target, batch_size=2)
    assert cli("pin", "--out", "ollama.sh").code == 0
    script = isolated / "ollama.sh"
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    argv, env = _run_script(script, isolated)
    assert argv == ["ollama", "serve"]
    assert env["MAX_CONCURRENCY"] == "1", "no sweep passed: concurrency 1"
    assert env["OLLAMA_NUM_PARALLEL"] == "2", "the verified batch of 2 must be admitted"
    assert env["OLLAMA_HOST"] == "127.0.0.1:8123" and env["MODEL_PATH"] == HOSTILE
    assert not (isolated / "pwned").exists()


def test_pin_kind_flag_overrides_config_and_rollback_setting_wins_if_newer(
    cli, isolated: Path
) -> None:
    target = _configure(cli, isolated, "vllm", "/models/internlm-s2")
    passing_ladder(isolated, target, batch_size=8)
    append_ledger(
        isolated, "active", target, {"batch_size": 4, "concurrency": 1, "source": "rollback"}
    )
    result = cli("pin", "--kind", "lmdeploy", "--json")
    assert result.code == 0, result.err
    assert result.json["kind"] == "lmdeploy" and result.json["batch_size"] == 4
    assert "--max-batch-size 4" in (isolated / "scripts/launch.sh").read_text()


def test_pin_gate_and_config_errors(cli, isolated: Path) -> None:
    target = _configure(cli, isolated, "vllm")
    gated = cli("pin")
    assert gated.code == 3 and "calibrate ladder" in gated.err
    append_ledger(isolated, "ladder", target, {"last_passing": None}, passed=False)
    assert cli("pin").code == 3
    write_config(isolated / "calibrate.toml", "http://127.0.0.1:8123/v1")
    plain = str(cli("status", "--json").json["target"])
    passing_ladder(isolated, plain)
    no_kind = cli("pin")
    assert no_kind.code == 2 and "--kind" in no_kind.err and "Traceback" not in no_kind.err
    no_model = cli("pin", "--kind", "vllm")
    assert no_model.code == 2 and "model_path" in no_model.err
    assert not (isolated / "scripts/launch.sh").exists()


def test_pin_without_a_model_path_takes_the_weights_the_server_reported_or_says_to_set_one(
    cli, isolated: Path
) -> None:
    """[server] model_path empty: the launch script loads what /v1/models said it serves (vLLM's
    root, recorded by single), and says so; with no such report it is exit 2, as before."""
    write_config(
        isolated / "calibrate.toml", "http://127.0.0.1:8123/v1", '[server]\nkind = "vllm"\n'
    )
    target = str(cli("status", "--json").json["target"])
    passing_ladder(isolated, target, batch_size=4)
    refused = cli("pin")
    assert refused.code == 2 and "[server] model_path is empty" in refused.err, refused.err
    from calibrate.state.identity import Weights
    from calibrate.state.ledger import Ledger, LedgerEntry

    served = Weights("", "/models/served-root").to_json()
    Ledger(isolated / "runs").append(LedgerEntry("single", "s1", target, True, {}, weights=served))
    pinned = cli("pin")
    assert pinned.code == 0, pinned.err
    assert "model path /models/served-root from the server's /v1/models" in pinned.err
    script = (isolated / "scripts" / "launch.sh").read_text("utf-8")
    assert "export MODEL_PATH=/models/served-root" in script and "/models/served-root" in script


def test_the_script_header_says_how_sure_its_setting_is(cli, isolated: Path) -> None:
    """A knee the sweep called "not sure" and a batch taken under noise: the header said only
    "# concurrency from sweep run …" — the script presented a doubtful setting as settled. A
    reason the ledger holds is one line, whatever it holds (never a line break out of the
    comment)."""
    target = _configure(cli, isolated, "vllm", "/models/m")
    taken = "batch 4, taken under noise (--conservative):\nthe runs could not tell 8 from 4"
    unsure_setting(isolated, target, taken)
    assert cli("pin").code == 0
    text = (isolated / "scripts/launch.sh").read_text("utf-8")
    assert f"# how sure: {KNEE_NOT_SURE}\n" in text, text
    assert "# how sure: ladder: batch 4, taken under noise (--conservative): the runs" in text
    assert subprocess.run(["bash", "-n", str(isolated / "scripts/launch.sh")]).returncode == 0
    assert all(
        line.startswith(("#", "set ", "export", "exec", ":")) or not line
        for line in text.splitlines()
    ), "every reason stays inside its comment"


def test_a_pin_run_again_keeps_where_its_setting_came_from_and_how_sure(
    cli, isolated: Path
) -> None:
    """pin run a second time (a new port, --out elsewhere, or just regenerated): its header said
    "batch size verified by pin run <the first pin>", dropped the ladder's and the sweep's "how
    sure" lines and the warning that the sweep measured its concurrency above the cap — a pin
    verifies nothing, and the same setting read surer the second time. Each pin now names the
    runs that measured the setting and what they said of it, however often it is pinned."""
    target = _configure(cli, isolated, "vllm", "/models/m")
    taken = "batch 4, taken under noise (--conservative)"
    unsure_setting(isolated, target, taken)
    level = {"concurrency": 2, "measured": {"server_running_max": 6}}
    ledger = isolated / "runs/ledger.jsonl"
    lines = [json.loads(x) for x in ledger.read_text("utf-8").splitlines()]
    lines[-1]["summary"]["levels"] = [level]  # the sweep saw the server run 6 at once at c=2
    ledger.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    first = cli("pin")
    assert first.code == 0, first.err
    header = (isolated / "scripts/launch.sh").read_text("utf-8").splitlines()
    header = [x for x in header if x.startswith(("# batch size", "# concurrency", "# how sure"))]
    assert any("above this script's cap of 4" in x for x in header), header
    again = cli("pin", "--json")
    assert again.code == 0, again.err
    text = (isolated / "scripts/launch.sh").read_text("utf-8")
    for line in header:  # the verified_at timestamp aside, the same provenance and doubts
        assert line.split(" at 20")[0] in text, (line, text)
    assert "verified by pin run" not in text and "from pin run" not in text
    assert "above this script's cap of 4" in " ".join(again.err.split())
    assert again.json["verified_by"] == "ladder run 20261129T160000Z-ladder-abcdef"
    assert again.json["concurrency_from"] == "sweep run 20261129T170000Z-sweep-abcdef"


def test_how_sure_is_read_from_the_sweep_the_concurrency_came_from(cli, isolated: Path) -> None:
    """The concurrency came from a sweep whose knee was "not sure"; a later sweep ended
    inconclusive (it sets nothing: the concurrency is still the first one's). pin's header and
    status read the *latest* sweep, a failed one, and dropped the doubt: the script presented
    the unsure knee as settled. They now read the run the concurrency came from."""
    target = _configure(cli, isolated, "vllm", "/models/m")
    unsure_setting(isolated, target, "batch 4, taken under noise (--conservative)")
    later = {"recommended_concurrency": None, "batch_size": 4, "inconclusive": "noise"}
    append_ledger(isolated, "sweep", target, later, passed=False, run_id="20261129T180000Z-sw-b")
    status = cli("status", "--json")
    assert KNEE_NOT_SURE in status.json["why"], status.json["why"]
    assert cli("pin").code == 0
    text = (isolated / "scripts/launch.sh").read_text("utf-8")
    assert "# concurrency from sweep run 20261129T170000Z-sweep-abcdef\n" in text, text
    assert f"# how sure: {KNEE_NOT_SURE}\n" in text, text
    assert KNEE_NOT_SURE in cli("status", "--json").json["why"], "and after the pin"


def test_pin_reads_a_damaged_sweep_line_without_crashing_and_warns_from_the_levels_it_can(
    cli, isolated: Path
) -> None:
    """A sweep's ledger line whose levels are not all objects (a hand-edited or damaged ledger)
    crashed pin's check of where the concurrency was measured; the levels it can read still
    speak: concurrency 8 measured while the server ran 9 at once is above the cap of 4."""
    target = _configure(cli, isolated, "vllm")
    passing_ladder(isolated, target, batch_size=4)
    levels = ["damaged", 7, {"concurrency": 8, "measured": {"server_running_max": 9}}]
    summary = {"recommended_concurrency": 8, "batch_size": 4, "levels": levels}
    append_ledger(isolated, "sweep", target, summary)
    result = cli("pin")
    assert result.code == 0, result.err
    said = " ".join(result.err.split())
    assert "Traceback" not in said
    assert "concurrency 8 was measured while the server ran up to 9 at once" in said, said


def test_the_batch_size_is_dated_by_the_run_that_verified_it(cli, isolated: Path) -> None:
    """The header said "batch size verified by ladder run L at <the sweep's time>": the
    setting's time is its latest run's, and the sweep ran after the ladder. Each run named is
    dated by its own ledger line."""
    target = _configure(cli, isolated, "vllm", "/models/m")
    ladder = {"last_passing": {"batch_size": 4, "concurrency": 4}, "stopped_by": "failure"}
    sweep = {"recommended_concurrency": 4, "batch_size": 4}
    (isolated / "runs").mkdir(exist_ok=True)
    for stage, summary, ts in (
        ("ladder", ladder, "2026-11-29T16:00:00Z"),
        ("sweep", sweep, "2026-11-30T09:30:00Z"),
    ):
        entry = LedgerEntry(stage, f"{ts[:10].replace('-', '')}T0-{stage}-ab", target, True)
        line = {**entry.to_json(), "summary": summary, "ts": ts}
        with (isolated / "runs/ledger.jsonl").open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(line) + "\n")
    assert cli("pin").code == 0
    text = (isolated / "scripts/launch.sh").read_text("utf-8")
    assert "# batch size verified by ladder run 20261129T0-ladder-ab at 2026-11-29T16:00:00Z" in (
        text
    ), text
    assert "# concurrency from sweep run 20261130T0-sweep-ab" in text, text


def test_a_rate_taken_under_noise_says_so_in_status_and_the_script(cli, isolated: Path) -> None:
    """A rate sweep that took the conservative answer under noise ("10.2 req/s, the conservative
    answer, taken under noise") was read back by status and pin as "sweep: 10.2 req/s: achieved
    10.20 req/s, not saturated" — the doubt the sweep said was dropped."""
    target = _configure(cli, isolated, "vllm", "/models/m")
    passing_ladder(isolated, target)
    cause = "other processes used 1.0 of this machine's 2 cores"
    sweep = {
        "recommended_concurrency": 4,
        "batch_size": 4,
        "recommendation": "10.2 req/s: achieved 10.20 req/s, not saturated",
        "under_noise": {"taken_under_noise": True, "cause": cause, "conservative": "10.2 req/s"},
    }
    append_ledger(isolated, "sweep", target, sweep, run_id="20261129T170000Z-sweep-abcdef")
    said = "sweep: 10.2 req/s: achieved 10.20 req/s, not saturated — taken under noise "
    said += f"(--conservative): {cause}"
    assert said in cli("status", "--json").json["why"]
    assert cli("pin").code == 0
    assert f"# how sure: {said}\n" in (isolated / "scripts/launch.sh").read_text("utf-8")
