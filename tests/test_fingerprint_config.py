"""Identity is the build, not the config (issue 37): vLLM's ``system_fingerprint`` is
``vllm-<version>-<hash of the engine config>`` (980f5236 with no cap, d34c11a0 at
``--max-num-seqs 8``). A baseline taken before ``pin`` set the cap made managed ``verify`` exit 1
with "the server's build changed" after every pin that changed the cap, and rollback with it.

The mock under ``--metrics-style vllm`` answers with a fingerprint of that form whose hash
changes with its slots, so these run on the default suite.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.engines import read_fingerprint
from calibrate.io.baseline import Normaliser, compare, default_program
from calibrate.mock import MockSettings
from tests.fakes import free_port, managed_config, mock_command, passing_ladder, pythonpath_env
from tests.helpers import FAKE_KEY

VLLM = mock_command("--metrics-style", "vllm")


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", pythonpath_env())
    monkeypatch.setenv("CALIBRATE_API_KEY", FAKE_KEY)


def test_a_vllm_fingerprint_is_read_as_a_build_and_a_config() -> None:
    seen = read_fingerprint("vllm-0.32.0-980f5236")
    assert (seen.engine, seen.build, seen.config) == ("vLLM", "vllm-0.32.0", "980f5236")
    dev = read_fingerprint("vllm-0.11.1rc2.dev3+g1a2b3c.cpu-d34c11a0")
    assert dev.build == "vllm-0.11.1rc2.dev3+g1a2b3c.cpu" and dev.config == "d34c11a0"
    assert seen.config_change(read_fingerprint("vllm-0.32.0-d34c11a0")) == (
        "vLLM vllm-0.32.0: engine config 980f5236 → d34c11a0"
    )
    assert seen.config_change(read_fingerprint("vllm-0.33.0-d34c11a0")) is None, "a new build"
    for build_only in ("b4567-abc1234", "2.0.1-native", "fp_mock_0"):  # llama.cpp, TGI, mock
        found = read_fingerprint(build_only)
        assert found.build == build_only and not found.config
        assert found.config_change(read_fingerprint(build_only + "x")) is None


def test_the_mock_fingerprint_changes_with_its_settings_as_vllms_does() -> None:
    at = {n: MockSettings(metrics_style="vllm", slots=n).fingerprint for n in (0, 4, 8)}
    assert len(set(at.values())) == 3 and all(f.startswith("vllm-") for f in at.values())
    assert MockSettings(metrics_style="vllm", slots=4).fingerprint == at[4], "stable"
    other = MockSettings(metrics_style="vllm", slots=4, text_seed=1).fingerprint
    assert read_fingerprint(other).build != read_fingerprint(at[4]).build
    assert MockSettings().fingerprint == "fp_mock_0", "the default style is as before"


def test_a_config_change_alone_passes_the_comparison_with_a_note() -> None:
    normaliser = Normaliser(default_program())
    base = {"ok": True, "text": "x", "system_fingerprint": "vllm-0.32.0-980f5236"}
    same_build = compare(base, {**base, "system_fingerprint": "vllm-0.32.0-d34c11a0"}, normaliser)
    assert same_build.verdict == "identical"
    assert "engine config 980f5236 → d34c11a0" in same_build.notes[0]
    assert "not its build" in same_build.notes[0]
    new_build = compare(base, {**base, "system_fingerprint": "vllm-0.33.0-980f5236"}, normaliser)
    assert new_build.verdict == "differs" and "system_fingerprint changed" in new_build.causes[0]
    both = compare(
        base, {**base, "text": "y", "system_fingerprint": "vllm-0.32.0-d34c11a0"}, normaliser
    )
    assert both.verdict == "differs" and both.differing == ("text",)
    assert not any("system_fingerprint changed" in c for c in both.causes)
    assert any("engine's configuration changed" in c for c in both.causes)


def test_managed_verify_and_rollback_pass_after_the_cap_changed(cli, isolated: Path) -> None:
    """The baseline is taken at 4 slots; verify after a restart at 2, and rollback (which
    restarts at concurrency 1), pass and say the engine's configuration changed."""
    managed_config(isolated, free_port(), VLLM)
    try:
        assert cli("server", "start", "--concurrency", "4").code == 0
        single = cli("single", "--json")
        assert single.code == 0, single.err
        before = single.json["record"]["system_fingerprint"]
        assert before.startswith("vllm-0.0.0+mock0-")
        passing_ladder(isolated, single.json["record"]["target"], batch_size=4)
        assert cli("server", "stop").code == 0
        assert cli("server", "start", "--concurrency", "2").code == 0
        verify = cli("verify", "--json")
        rollback = cli("rollback", "--json")
    finally:
        cli("server", "stop")
    assert verify.code == 0, verify.err
    err = " ".join(verify.err.split())
    assert "config consistent" in err and "the engine's configuration changed" in err
    assert "build changed" not in err
    assert verify.json["comparison"]["notes"], "the note is in the JSON too"
    assert rollback.code == 0, rollback.err
    assert "output matches the baseline; the engine's configuration changed" in rollback.err
    ledger = (isolated / "runs/ledger.jsonl").read_text("utf-8").splitlines()
    assert json.loads(ledger[-1])["passed"] is True


def test_a_new_build_still_fails_verify(cli, isolated: Path) -> None:
    managed_config(isolated, free_port(), VLLM)
    try:
        assert cli("server", "start", "--concurrency", "2").code == 0
        assert cli("single").code == 0
        assert cli("server", "stop").code == 0
        path = isolated / "calibrate.toml"
        text = path.read_text("utf-8").replace(
            "--metrics-style vllm", "--metrics-style vllm --text-seed 1"
        )
        path.write_text(text, encoding="utf-8")
        assert cli("server", "start", "--concurrency", "2").code == 0
        verify = cli("verify", "--force")
    finally:
        cli("server", "stop")
    assert verify.code == 1
    assert "system_fingerprint changed (vllm-0.0.0+mock0-" in " ".join(verify.err.split())
