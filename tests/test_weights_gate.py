"""pin, verify and batch are gated against the weights the calibrated setting was measured with
(SPEC §3.1): pin after pin with another model_path, a restarted server serving other weights,
a batch at the calibrated concurrency on other weights — exit 3 naming both, never a script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibrate.state.ledger import LedgerEntry
from tests.fakes import append_ledger, passing_ladder
from tests.helpers import write_config
from tests.mockserver import start_mock

SERVER = '[server]\nkind = "vllm"\nport = 8123\nmodel_path = "{path}"\n'
FAST_MOCK = {"ttft_s": 0.001, "per_token_s": 0.0002}


def _config(cli, root: Path, path: str, base_url: str = "http://127.0.0.1:8123/v1") -> str:
    write_config(root / "calibrate.toml", base_url, SERVER.format(path=path))
    return str(cli("status", "--json").json["target"])


def _ledger(root: Path) -> list[dict]:
    return [json.loads(x) for x in (root / "runs/ledger.jsonl").read_text().splitlines()]


def test_pin_after_pin_for_other_weights_is_exit_3_and_writes_nothing(cli, isolated: Path) -> None:
    """The ladder ran before [server] was filled in; the first pin binds the setting to m1."""
    target = _config(cli, isolated, "/models/m1")
    passing_ladder(isolated, target, batch_size=4)
    assert cli("pin").code == 0
    script = isolated / "scripts/launch.sh"
    first = script.read_text("utf-8")
    assert "/models/m1" in first

    _config(cli, isolated, "/models/m2")
    for args in (["pin"], ["pin", "--out", "other.sh"], ["pin", "--kind", "llamacpp"]):
        closed = cli(*args)
        assert closed.code == 3, closed.err
        (line,) = [x for x in closed.err.splitlines() if "pin is gated" in x]
        assert "the model path changed: /models/m1 → /models/m2" in line
        assert "batch 4, concurrency 1" in line and "pin run" in line
        assert "calibrate ladder" in closed.err and "--force" in closed.err
        assert "Traceback" not in closed.err
    assert script.read_text("utf-8") == first, "the m1 script is left as it was"
    assert not (isolated / "other.sh").exists()

    forced = cli("pin", "--force", "--json")
    assert forced.code == 0, forced.err
    assert "FORCED" in forced.err and "/models/m2" in script.read_text("utf-8")
    pin = _ledger(isolated)[-1]
    assert pin["stage"] == "pin" and pin["forced"] is True
    assert pin["weights"]["model_path"] == "/models/m2"
    again = cli("pin")  # the setting is now m2's: pinning it again is not gated
    assert again.code == 0, again.err


def test_pin_for_the_same_weights_again_is_open(cli, isolated: Path) -> None:
    target = _config(cli, isolated, "/models/m1")
    passing_ladder(isolated, target, batch_size=2)
    assert cli("pin").code == 0
    assert cli("pin", "--kind", "sglang").code == 0


def test_a_served_root_the_setting_was_not_measured_on_closes_pin(cli, isolated: Path) -> None:
    """single saw /models/a served; a later single sees /models/b: the pinned setting is a's."""
    target = _config(cli, isolated, "")
    ledger = isolated / "runs/ledger.jsonl"
    ledger.parent.mkdir(parents=True)

    def line(stage: str, summary: dict, root: str) -> None:
        weights = {"model_path": "", "served_root": root}
        entry = LedgerEntry(
            stage, f"2026-{stage}-{root[-1]}", target, True, summary, weights=weights
        )
        with ledger.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry.to_json()) + "\n")

    line("single", {}, "/models/a")
    passing_ladder(isolated, target, batch_size=4)  # recorded no weights: a's by the walk
    line("pin", {"batch_size": 4, "concurrency": 1, "kind": "vllm", "script": "x"}, "/models/a")
    line("single", {}, "/models/b")
    closed = cli("pin", "--kind", "vllm")
    assert closed.code == 3
    assert "the server now serves other weights: /models/a → /models/b" in closed.err


def test_verify_is_gated_on_a_changed_model_path_and_on_a_server_with_other_weights(
    cli, isolated: Path
) -> None:
    with start_mock(**FAST_MOCK) as mock:
        target = _config(cli, isolated, "/models/m1", mock.base_url)
        assert cli("single").code == 0
        passing_ladder(isolated, target, batch_size=4)
        assert cli("pin").code == 0
        pin = _ledger(isolated)[-1]
        assert pin["weights"] == {"model_path": "/models/m1", "served_root": "/models/internlm-s2"}
        assert cli("verify").code == 0

        _config(cli, isolated, "/models/m2", mock.base_url)
        closed = cli("verify")
        assert closed.code == 3, closed.err
        assert "verify is gated: the model path changed: /models/m1 → /models/m2" in closed.err
        forced = cli("verify", "--force", "--json")
        assert forced.code == 0 and forced.json["consistent"] is True
        assert _ledger(isolated)[-1]["forced"] is True

    _config(cli, isolated, "/models/m1")
    # the server restarted with other weights under an alias: its /v1/models root says so
    with start_mock(**FAST_MOCK, models=("qwen-7b",), any_model=True) as other:
        _config(cli, isolated, "/models/m1", other.base_url)
        moved = cli("verify")
        assert moved.code == 3, moved.err
        assert "the server now serves other weights: /models/internlm-s2 → /models/qwen-7b" in (
            moved.err
        )


@pytest.mark.parametrize("extra", [[], ["--base-url", "{url}"]])
def test_batch_at_the_calibrated_concurrency_is_gated_on_other_weights(
    cli, isolated: Path, extra: list[str]
) -> None:
    tasks = isolated / "tasks.jsonl"
    tasks.write_text('{"id": 1, "text": "a"}\n{"id": 2, "text": "b"}\n', "utf-8")
    with start_mock(**FAST_MOCK) as mock:
        target = _config(cli, isolated, "/models/m1", mock.base_url)
        passing_ladder(isolated, target, batch_size=4)
        append_ledger(isolated, "sweep", target, {"recommended_concurrency": 2, "batch_size": 4})
        assert cli("pin").code == 0
        _config(cli, isolated, "/models/m2", mock.base_url)
        given = [a.format(url=mock.base_url) for a in extra]
        args = ["batch", "--input", str(tasks), "--out", "out.jsonl", *given]
        closed = cli(*args)
        assert closed.code == 3, closed.err
        assert "batch is gated: the model path changed: /models/m1 → /models/m2" in closed.err
        assert "-c N" in closed.err and not (isolated / "out.jsonl").exists()
        own = cli(*args, "-c", "2")  # a concurrency of your own: nothing calibrated is used
        assert own.code == 0, own.err
        _config(cli, isolated, "/models/m1", mock.base_url)
        on_m1 = cli("batch", "--input", str(tasks), "--out", "out2.jsonl", *given, "--json")
        assert on_m1.code == 0, on_m1.err
        assert (on_m1.json["concurrency"], on_m1.json["concurrency_source"]) == (2, "pin")


def test_status_never_names_a_next_step_the_weights_gate_refuses(cli, isolated: Path) -> None:
    """A setting measured and pinned on m1, the config now on m2: batch, verify and pin are
    exit 3, yet status said "next: calibrate batch …" and showed the setting as current (the
    gates and status's hint must never disagree, state/pipeline.py)."""
    target = _config(cli, isolated, "/models/m1")
    passing_ladder(isolated, target, batch_size=4)
    assert cli("pin").code == 0
    assert cli("status", "--json").json["stale"] is None
    _config(cli, isolated, "/models/m2")
    status = cli("status", "--json")
    assert status.code == 0, status.err
    assert (
        status.json["next"]
        == "calibrate single --save-baseline, then calibrate repro and calibrate ladder"
    )
    assert "the model path changed: /models/m1 → /models/m2" in status.json["stale"]
    assert "calibrated setting is stale" in status.err and "next: calibrate single" in status.err
    assert "batch" not in status.json["next"] and cli("verify").code == 3
