"""``calibrate report RUN_A RUN_B`` (deltas per tier) and ``--timeline TIER``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from calibrate.report_compare import Delta
from calibrate.timeline import tier_timeline
from tests.mockserver import start_mock
from tests.report_helpers import Page, ladder_row, sweep_row, write_run
from tests.tier_helpers import FAST, open_gate


def _two_ladders(root: Path) -> None:
    write_run(
        root,
        "a",
        "ladder",
        [ladder_row(1, 4.0), ladder_row(2, 8.0), ladder_row(4, 10.0)],
        summary={"last_passing": {"batch_size": 4, "concurrency": 4}, "stopped_by": "completed"},
    )
    write_run(
        root,
        "b",
        "ladder",
        [
            ladder_row(1, 4.0),
            ladder_row(2, 6.0, peak_vram_mib=50000),
            ladder_row(4, 12.0, verdict="fail"),
        ],
        passed=True,
        summary={"last_passing": {"batch_size": 2, "concurrency": 2}, "stopped_by": "failure"},
    )


def test_report_a_b_gives_deltas_per_tier(cli, isolated: Path) -> None:
    _two_ladders(isolated)
    result = cli("report", "runs/a", "runs/b", "--json")
    assert result.code == 0, result.err
    data = result.json
    assert data["kind"] == "ladder" and data["key"] == "batch_size"
    assert data["a"]["last_passing"] == "batch size 4, concurrency 4"
    assert data["b"]["last_passing"] == "batch size 2, concurrency 2"
    rows = {r["key"]: r for r in data["rows"]}
    assert set(rows) == {1, 2, 4}
    two = rows[2]["deltas"]
    assert two["items_per_s"]["a"] == 8.0 and two["items_per_s"]["b"] == 6.0
    assert two["items_per_s"]["change"] == -0.25 and two["items_per_s"]["better"] is False
    assert (
        two["peak_vram_mib"]["delta"] == 50000 - 42000 and two["peak_vram_mib"]["better"] is False
    )
    assert rows[1]["deltas"]["items_per_s"]["delta"] == 0

    assert rows[4]["a"]["verdict"] == "pass" and rows[4]["b"]["verdict"] == "fail"
    assert "items_per_s" in data["metrics"] and "peak_vram_mib" in data["metrics"]
    # the terminal table shows the same: A → B (change) per metric
    assert "8 → 6 (-25%)" in result.err and "pass" in result.err and "fail" in result.err


def test_a_tier_only_one_run_has_is_shown_as_not_run(cli, isolated: Path) -> None:
    write_run(isolated, "a", "sweep", [sweep_row(1, 4.0), sweep_row(2, 8.0)])
    write_run(isolated, "b", "sweep", [sweep_row(1, 5.0), sweep_row(2, 9.0), sweep_row(4, 16.0)])
    result = cli("report", "a", "b", "--json", "--html")
    assert result.code == 0, result.err
    rows = {r["key"]: r for r in result.json["rows"]}
    assert result.json["key"] == "concurrency" and rows[4]["a"] is None and rows[4]["deltas"] == {}
    assert rows[1]["deltas"]["items_per_s"]["change"] == 0.25
    html = isolated / "runs/b/compare-a.html"  # beside B, named after A
    assert result.json["html"] == "runs/b/compare-a.html"
    page = Page(html.read_text("utf-8"))
    body = page.body_rows("comparison")
    assert [r[0] for r in body] == ["1", "2", "4"]
    assert body[2][1] == "not run" and body[2][2] == "pass"
    header = page.rows["comparison"][0]
    assert body[0][header.index("items_per_s Δ")] == "+25%"


def test_a_ladder_and_a_sweep_are_not_compared(cli, isolated: Path) -> None:
    write_run(isolated, "lad", "ladder", [ladder_row(1, 4.0)])
    write_run(isolated, "swp", "sweep", [sweep_row(1, 4.0)])
    result = cli("report", "runs/lad", "runs/swp", "--html")
    assert result.code == 2
    assert "lad is a ladder and swp a sweep" in result.err and "Traceback" not in result.err
    assert not list(isolated.rglob("*.html"))  # nothing written


def test_timeline_bars_are_the_tiers_requests(cli, isolated: Path) -> None:
    """Records from a stage that wrote each round after it ended (one ts): the starts are
    replayed with the concurrency; a request that waited for a free slot starts later."""
    ts = "2026-01-01T00:00:05.000Z"
    records = [
        {
            "batch_size": 4,
            "concurrency": c,
            "round": None,
            "ts": ts,
            "elapsed_s": 1.0,
            "ttft_s": 0.1,
            "ok": True,
        }
        for c in (1, 2, 2, 2, 2)
    ]
    write_run(isolated, "s", "sweep", [sweep_row(1, 1.0), sweep_row(2, 2.0)], records=records)
    result = cli("report", "runs/s", "--html", "--timeline", "2", "--json", "--no-plot")
    assert result.code == 0, result.err
    assert result.json["timeline"] == {
        "tier": 2.0,
        "requests": 4,
        "times": "estimated",
        "png": None,
    }
    page = Page((isolated / "runs/s/report.html").read_text("utf-8"))
    assert page.count("rect", "bar") == 4 and page.count("line", "ttft") == 4
    assert "estimated" in page.id_text["timeline-source"]
    bars = [a for t, a in page.tags if t == "rect" and "bar" in a.get("class", "")]
    starts = sorted(float(b["x"]) for b in bars)
    assert starts[0] == starts[1] < starts[2] == starts[3]  # two slots: two waited a second
    missing = cli("report", "runs/s", "--timeline", "8")
    assert missing.code == 2 and "tiers the run has (1, 2)" in missing.err


def test_timeline_uses_recorded_starts_or_finish_times() -> None:
    recorded = [
        {"batch_size": 2, "started_s": 10.0, "done_s": 10.5, "elapsed_s": 0.5},
        {"batch_size": 2, "started_s": 10.2, "elapsed_s": 1.0, "ttft_s": 0.3},
        {"batch_size": 4, "started_s": 0.0, "elapsed_s": 1.0},
    ]
    timeline = tier_timeline(recorded, "batch_size", 2, wave=True)
    assert timeline.source == "recorded"
    spans = [(round(b.start_s, 6), round(b.finish_s, 6)) for b in timeline.bars]
    assert spans == [(0.0, 0.5), (0.2, 1.2)]
    assert timeline.bars[1].ttft_s == 0.3
    finished = [
        {"concurrency": 1, "ts": "2026-01-01T00:00:02.000Z", "elapsed_s": 2.0},
        {
            "concurrency": 1,
            "ts": "2026-01-01T00:00:03.500Z",
            "elapsed_s": 1.0,
            "ok": False,
            "error": {"kind": "timeout"},
        },
    ]
    timeline = tier_timeline(finished, "concurrency", 1, wave=False)
    assert timeline.source == "finish times"
    assert [(b.start_s, b.finish_s, b.ok) for b in timeline.bars] == [
        (0.0, 2.0, True),
        (2.5, 3.5, False),
    ]
    assert "timeout" in timeline.bars[1].label


def test_a_ladder_wave_starts_together_and_rounds_follow_each_other() -> None:
    ts = "2026-01-01T00:00:05.000Z"
    records = [
        {"batch_size": 2, "concurrency": 2, "round": r, "ts": ts + str(r), "elapsed_s": e}
        for r, e in ((1, 1.0), (1, 2.0), (2, 1.0), (2, 1.0))
    ]
    for record in records:
        record["ts"] = ts  # every round written at once
    timeline = tier_timeline(records, "batch_size", 2, wave=True)
    assert timeline.source == "estimated"
    assert [(b.start_s, b.finish_s) for b in timeline.bars] == [(0, 1), (0, 2), (2, 3), (2, 3)]


def test_a_change_inside_the_noise_is_neither_better_nor_worse() -> None:
    assert Delta(100.0, 102.0, higher_better=True).better is None  # 2 %: the machine
    assert Delta(100.0, 90.0, higher_better=True).better is False
    assert Delta(100.0, 94.0, higher_better=False).better is True
    assert Delta(0.0, 3.0, higher_better=True).better is True  # no relative change: the sign


SYNTHETIC = {"source": "synthetic", "input_tokens": "400", "output_tokens": 20}


def _pair(root: Path, a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two ladders alike but for what ``a``/``b`` set: manifest fields and the summary's workload."""
    for name, extra in (("a", a), ("b", b)):
        manifest = {k: v for k, v in extra.items() if k in ("config", "target")}
        summary = {"last_passing": {"batch_size": 2, "concurrency": 2}, "stopped_by": "completed"}
        if "workload" in extra:
            summary["workload"] = extra["workload"]
        run = write_run(
            root,
            name,
            "ladder",
            [ladder_row(1, 4.0), ladder_row(2, 8.0)],
            manifest=manifest,
            summary=summary,
        )
        if "weights" in extra:
            line = json.loads((run / "summary.json").read_text("utf-8"))
            (run / "summary.json").write_text(json.dumps({**line, "weights": extra["weights"]}))


def _config(*, model: str = "internlm-s2", host: str = "127.0.0.1", kind: Any = None) -> Any:
    return {
        "target": {"base_url": f"http://{host}:8000/v1", "model": model},
        "server": {"kind": kind, "model_path": ""},
    }


@pytest.mark.parametrize(
    ("a", "b", "said"),
    [
        ({}, {"workload": SYNTHETIC}, "workload the fixed prompt → synthetic, target 400 input"),
        (
            {"workload": SYNTHETIC},
            {"workload": {**SYNTHETIC, "output_tokens": 100}},
            "20 output tokens → synthetic, target 400 input tokens, 100 output tokens",
        ),
        (
            {"workload": {**SYNTHETIC, "input_tokens": "512:4096"}},
            {"workload": SYNTHETIC},
            "target 512:4096 input tokens",
        ),
        (
            {"workload": {"source": "tasks", "tasks": "a.jsonl"}},
            {"workload": {"source": "tasks", "tasks": "b.jsonl"}},
            "workload tasks a.jsonl → tasks b.jsonl",
        ),
        (
            {"config": _config(kind="vllm")},
            {"config": _config(kind="llamacpp")},
            "engine vllm → llamacpp",
        ),
        (
            {"config": _config()},
            {"config": _config(model="qwen-7b")},
            "model internlm-s2 → qwen-7b",
        ),
        ({"config": _config()}, {"config": _config(host="gpu-box")}, "host 127.0.0.1 → gpu-box"),
        ({"target": "abc123"}, {"target": "def456"}, "target abc123 → def456"),
        (
            {"weights": {"model_path": "/models/m1", "served_root": ""}},
            {"weights": {"model_path": "/models/m2", "served_root": ""}},
            "weights /models/m1 → /models/m2",
        ),
    ],
)
def test_report_a_b_warns_when_the_runs_did_not_measure_the_same_thing(
    cli, isolated: Path, a: dict[str, Any], b: dict[str, Any], said: str
) -> None:
    _pair(isolated, a, b)
    result = cli("report", "runs/a", "runs/b", "--json", "--html")
    assert result.code == 0, result.err
    first = result.err.splitlines()[0]
    assert first.startswith("warning: A and B did not measure the same thing — "), result.err
    assert said in first and first.endswith("the deltas are not the effect of one change")
    assert sum("did not measure the same thing" in line for line in result.err.splitlines()) == 1
    assert result.json["warning"] == first.removeprefix("warning: ")
    assert result.json["differences"] and all(
        set(d) == {"what", "a", "b"} for d in result.json["differences"]
    )
    page = Page((isolated / "runs/b/compare-a.html").read_text("utf-8"))
    assert said in page.id_text["not-like-for-like"]


@pytest.mark.parametrize(
    "b",
    [
        {"config": _config(kind="vllm"), "workload": SYNTHETIC},
        # [server] filled in after the first run (the README tour): no other engine, no weights
        {"config": _config(), "workload": SYNTHETIC},
        {"weights": {"model_path": "", "served_root": ""}, "workload": SYNTHETIC},
    ],
)
def test_report_a_b_of_like_runs_says_nothing_about_differences(
    cli, isolated: Path, b: dict[str, Any]
) -> None:
    same = {
        "config": _config(kind="vllm"),
        "workload": SYNTHETIC,
        "weights": {"model_path": "/models/m1", "served_root": "/models/x"},
    }
    _pair(isolated, same, b)
    result = cli("report", "runs/a", "runs/b", "--json", "--html")
    assert result.code == 0 and "warning" not in result.err
    assert result.json["differences"] == [] and result.json["warning"] is None
    page = Page((isolated / "runs/b/compare-a.html").read_text("utf-8"))
    assert "not-like-for-like" not in page.id_text


def test_a_fixed_prompt_ladder_and_a_400_token_ladder_are_flagged(cli, isolated: Path) -> None:
    """The case a user hit: two real ladders against the mock, the second --input-tokens 400."""
    with start_mock(ttft_s=0.001, per_token_s=0.0002) as mock:
        open_gate(isolated, mock.base_url, FAST + "batch_sizes = [1, 2]\n")
        fixed = cli("ladder", "--json")
        sized = cli("ladder", "--json", "--input-tokens", "400", "--output-tokens", "20")
    assert fixed.code == 0 and sized.code == 0, sized.err
    result = cli("report", fixed.json["run_id"], sized.json["run_id"], "--json")
    assert result.code == 0, result.err
    assert result.json["differences"][0]["what"] == "workload"
    first = result.err.splitlines()[0]
    assert "workload the fixed prompt → synthetic, target 400 input tokens" in first
    assert "20 output tokens" in first
    again = cli("report", sized.json["run_id"], sized.json["run_id"], "--json")
    assert again.json["differences"] == []
