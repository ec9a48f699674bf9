"""The ledger is read once per command (one view), and each decision on it is made once: a
context-axis ladder is never "the ladder", and the rollback gate opens exactly when the
rollback has a tier to return to — the very tier it then returns to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from calibrate import config
from calibrate.state import ledger as ledger_module
from calibrate.state.gates import check_gate, next_step
from calibrate.state.ledger import Ledger, LedgerEntry, LedgerView, target_fingerprint
from calibrate.state.pipeline import standing
from calibrate.state.setting import latest_passing_ladder, resolve, rollback_tier
from calibrate.state.weights_gate import measured_weights
from tests.fakes import passing_ladder
from tests.helpers import write_config
from tests.mockserver import start_mock
from tests.tier_helpers import FAST

SERVER = '[server]\nkind = "vllm"\nmodel_path = "/models/m"\nport = 8123\n'
TIER = {"last_passing": {"batch_size": 4, "concurrency": 4}, "stopped_by": "vram"}
CONTEXT = {**TIER, "axis": "context", "context_verified": 2000}


def _target(cli: Any, root: Path, base_url: str = "http://127.0.0.1:8123/v1") -> str:
    write_config(root / "calibrate.toml", base_url, SERVER)
    return str(cli("status", "--json").json["target"])


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    reads: list[Path] = []
    real = ledger_module._read

    def counted(path: Path) -> LedgerView:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(ledger_module, "_read", counted)
    return reads


@pytest.mark.parametrize(
    ("args", "code"),
    [(("status",), 0), (("status", "--json"), 0), (("pin",), 0), (("rollback",), 3)],
)
def test_a_command_reads_the_ledger_once_and_warns_once(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], code: int
) -> None:
    target = _target(cli, isolated)
    if args[0] == "pin":
        passing_ladder(isolated, target)  # the gate, the setting, the hint and the cost read it
    (isolated / "runs").mkdir(exist_ok=True)
    with (isolated / "runs/ledger.jsonl").open("a", encoding="utf-8") as ledger:
        ledger.write("{torn\n")
    reads = _count_reads(monkeypatch)
    result = cli(*args)
    assert result.code == code, result.err
    assert len(reads) == 1, f"`calibrate {' '.join(args)}` read the ledger {len(reads)} times"
    assert result.err.count("skipping line") == 1, result.err


def test_every_stage_that_sends_reads_the_ledger_once_and_warns_once(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The staged calibration against the mock, then batch at the calibrated setting and at
    -c: each command reads the ledger once (batch read it three times: its endpoints, its
    weights gate and its stage context each had a reader of their own) and warns of a torn
    line once."""
    (isolated / "in.jsonl").write_text(
        "".join(json.dumps({"id": i, "text": "hi"}) + "\n" for i in range(4)), "utf-8"
    )
    fast = FAST + "batch_sizes = [1, 2]\n[sweep]\nconcurrency = [1, 2]\nlevel_s = 0\nrepeats = 1\n"
    reads = _count_reads(monkeypatch)
    with start_mock(ttft_s=0.001, per_token_s=0.0002) as mock:
        write_config(isolated / "calibrate.toml", mock.base_url, fast)
        (isolated / "runs").mkdir()
        (isolated / "runs/ledger.jsonl").write_text("{torn\n", "utf-8")
        for args in (
            ("single",),
            ("repro",),
            ("ladder",),
            ("sweep",),
            ("batch", "--input", "in.jsonl", "--out", "at-setting.jsonl"),
            ("batch", "--input", "in.jsonl", "--out", "at-c.jsonl", "-c", "2"),
        ):
            reads.clear()
            result = cli(*args)
            assert result.code == 0, (args, result.err)
            assert len(reads) == 1, (
                f"`calibrate {' '.join(args)}` read the ledger {len(reads)} times"
            )
            assert result.err.count("skipping line") == 1, (args, result.err)


def test_the_view_follows_what_the_command_appends(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    assert ledger.view() == LedgerView()
    ledger.append(LedgerEntry("ladder", "L1", "t", True, TIER))
    again = Ledger(tmp_path).view()
    assert ledger.view() == again and len(again.entries) == 1, "as a fresh read parses it"


def _cfg(root: Path) -> config.Config:
    write_config(root / "calibrate.toml", "http://127.0.0.1:8123/v1", SERVER)
    return config.load(config.Overrides(config_path=str(root / "calibrate.toml")), {})


def _ledger(root: Path, target: str, *lines: tuple[str, str, bool, dict[str, Any]]) -> Ledger:
    ledger = Ledger(root / "runs")
    for stage, run_id, passed, summary in lines:
        interrupted = summary.get("_interrupted") is True
        clean = {k: v for k, v in summary.items() if k != "_interrupted"}
        ledger.append(LedgerEntry(stage, run_id, target, passed, clean, interrupted=interrupted))
    return ledger


def test_a_context_ladder_is_never_the_ladder_for_any_reader(isolated: Path) -> None:
    cfg = _cfg(isolated)
    target = target_fingerprint(cfg)
    ledger = _ledger(isolated, target, ("ladder", "C1", True, CONTEXT))
    assert ledger.latest("ladder", target) is None
    assert ledger.view().newest_of_any_target("ladder") is None
    now = standing(ledger, target)
    assert "ladder" not in now.latest and now.context is not None
    assert resolve(ledger, target) is None and latest_passing_ladder(ledger, target) is None
    assert rollback_tier(ledger, target) is None
    for stage in ("sweep", "pin", "rollback"):
        assert not check_gate(stage, cfg, ledger, target).open, stage
    assert next_step(cfg, ledger, target) == "calibrate single"
    # a batch ladder after it is the ladder; the context ladder adds its verified length only
    ledger.append(LedgerEntry("ladder", "L1", target, True, TIER))
    ledger.append(LedgerEntry("ladder", "C2", target, True, CONTEXT))
    latest = ledger.latest("ladder", target)
    assert latest is not None and latest.run_id == "L1"
    found = resolve(ledger, target)
    assert found is not None and found.run_id == "L1" and found.verified_input_tokens == 2000
    assert measured_weights(ledger, target, found).weights.model_path == ""


INTERRUPTED = {**TIER, "_interrupted": True}
FAILED_B8 = {"last_passing": {"batch_size": 8, "concurrency": 8}, "stopped_by": "failure"}
PIN = {"batch_size": 2, "concurrency": 1, "kind": "vllm", "script": "launch.sh"}


@pytest.mark.parametrize(
    ("lines", "tier"),
    [
        ((), None),
        ((("ladder", "L1", True, TIER),), (4, "ladder run L1")),
        ((("ladder", "L1", True, TIER), ("ladder", "L2", False, FAILED_B8)), (4, "ladder run L1")),
        (
            (("ladder", "L1", True, TIER), ("ladder", "L2", False, INTERRUPTED)),
            (4, "ladder run L1"),
        ),
        ((("ladder", "L2", False, FAILED_B8),), None),
        ((("ladder", "L2", False, FAILED_B8), ("pin", "P1", True, PIN)), (2, "pin run P1")),
        ((("ladder", "C1", True, CONTEXT),), None),
        ((("pin", "P1", False, PIN),), None),
    ],
)
def test_the_rollback_gate_opens_exactly_when_rollback_has_a_tier(
    isolated: Path, lines: tuple[tuple[str, str, bool, dict[str, Any]], ...], tier: Any
) -> None:
    cfg = _cfg(isolated)
    target = target_fingerprint(cfg)
    ledger = _ledger(isolated, target, *lines)
    found = rollback_tier(ledger, target)
    assert (None if found is None else (found.batch_size, found.source)) == tier
    assert check_gate("rollback", cfg, ledger, target).open == (found is not None)


def test_a_failed_ladder_alone_closes_the_rollback_gate(cli, mock, isolated: Path) -> None:
    """Its passing tiers are not a result: the gate says so before a run folder is made."""
    target = _target(cli, isolated, mock.base_url)
    entry = LedgerEntry("ladder", "L2", target, False, FAILED_B8)
    Ledger(isolated / "runs").append(entry)
    result = cli("rollback", "--json")
    assert result.code == 3, result.err
    assert "rollback is gated: no ladder with a passing tier and no pin" in result.err
    assert not list((isolated / "runs").glob("*-rollback-*")), "nothing was started"
    lines = (isolated / "runs/ledger.jsonl").read_text("utf-8").splitlines()
    assert [json.loads(line)["stage"] for line in lines] == ["ladder"]
