"""``calibrate report RUN_A RUN_B`` (deltas per tier) and ``--timeline TIER``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from calibrate.confidence import compare, spread
from calibrate.report.delta import Delta, delta_text
from calibrate.report.timeline import tier_timeline
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
    # one round a side: the change is shown, no direction claimed (no interval, SPEC §13)
    assert two["items_per_s"]["change"] == -0.25 and two["items_per_s"]["better"] is None
    assert two["peak_vram_mib"]["delta"] == 50000 - 42000 and two["peak_vram_mib"]["better"] is None
    assert "8 → 6 (-25%, not tested)" in result.err
    assert rows[1]["deltas"]["items_per_s"]["delta"] == 0

    assert rows[4]["a"]["verdict"] == "pass" and rows[4]["b"]["verdict"] == "fail"
    assert "items_per_s" in data["metrics"] and "peak_vram_mib" in data["metrics"]
    # the terminal table shows the same: A → B (change) per metric
    assert "pass" in result.err and "pass" in result.err and "fail" in result.err


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
    html = (isolated / "runs/s/report.html").read_bytes()
    missing = cli("report", "runs/s", "--html", "--timeline", "8")
    assert missing.code == 2 and "tiers the run has (1, 2)" in missing.err
    # rejected before anything is shown or written: no table above the error, no new page
    assert missing.err.startswith("error: no records with concurrency 8"), missing.err
    assert (isolated / "runs/s/report.html").read_bytes() == html
    blocked = cli("report", "runs/s", "--html", "runs/s/tiers.csv/page.html")  # a file as folder
    assert blocked.code == 2 and blocked.err.startswith("error: cannot write --html"), blocked.err


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


def test_a_change_inside_the_noise_or_untested_is_neither_better_nor_worse() -> None:
    """Without rounds on both sides there is no interval: B's 10 % less was coloured "worse"
    (green/red, ``better``) although nothing was tested (SPEC §13: claimed only when the
    intervals separate); the change is still shown."""
    assert Delta(100.0, 102.0, higher_better=True).better is None  # 2 %: the machine
    assert Delta(100.0, 90.0, higher_better=True).better is None  # not tested
    assert Delta(100.0, 90.0, higher_better=True).change == pytest.approx(-0.1)
    assert Delta(100.0, 94.0, higher_better=False).better is None
    assert Delta(0.0, 3.0, higher_better=True).better is None


SYNTHETIC = {"source": "synthetic", "input_tokens": "400", "output_tokens": 20}


def _pair(root: Path, a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two ladders alike but for what ``a``/``b`` set: manifest fields and the summary's workload."""
    for name, extra in (("a", a), ("b", b)):
        manifest = {k: v for k, v in extra.items() if k in ("config", "target", "server_kind")}
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
        (  # one config, but B's server was started as llama.cpp: its manifest says what ran
            {"config": _config(kind="vllm"), "server_kind": "vllm"},
            {"config": _config(kind="vllm"), "server_kind": "llamacpp"},
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


def test_ladders_of_two_modes_and_sweeps_at_two_batch_sizes_are_flagged(
    cli, isolated: Path
) -> None:
    """Real runs against the mock: a wave ladder (B requests in flight) and a prompt-list one
    (one request of B prompts), then sweeps at --batch-size 1 and 2. Before, report A B put
    them side by side with no warning ('ttft p99 0.139 → 0.0131 (-91%, significant)' at batch 8,
    wave against prompt-list), as if one change had made the difference."""
    sweep = "[sweep]\nconcurrency = [1, 2]\nlevel_s = 0\nrepeats = 2\nmax_repeats = 2\n"
    with start_mock(ttft_s=0.001, per_token_s=0.0002) as mock:
        open_gate(isolated, mock.base_url, FAST + "batch_sizes = [1, 2]\n" + sweep)
        wave = cli("ladder", "--json")
        open_gate(isolated, mock.base_url, FAST + 'batch_sizes = [1, 2]\nmode = "prompt-list"\n')
        listed = cli("ladder", "--json")
        open_gate(isolated, mock.base_url, FAST + "batch_sizes = [1, 2]\n" + sweep)
        assert cli("ladder", "--json").code == 0
        small = cli("sweep", "--json", "--batch-size", "1")
        large = cli("sweep", "--json", "--batch-size", "2")
    assert wave.code == 0 and listed.code == 0, listed.err
    assert small.code in (0, 1) and large.code in (0, 1), large.err
    ladders = cli("report", wave.json["run_id"], listed.json["run_id"], "--json", "--no-plot")
    assert ladders.code == 0, ladders.err
    assert ladders.json["differences"] == [{"what": "ladder mode", "a": "wave", "b": "prompt-list"}]
    assert "ladder mode wave → prompt-list" in ladders.err.splitlines()[0]
    sweeps = cli("report", small.json["run_id"], large.json["run_id"], "--json", "--no-plot")
    assert sweeps.code == 0, sweeps.err
    assert sweeps.json["differences"] == [{"what": "batch size", "a": "1", "b": "2"}]
    assert "batch size 1 → 2" in sweeps.err.splitlines()[0]
    again = cli("report", large.json["run_id"], large.json["run_id"], "--json", "--no-plot")
    assert again.json["differences"] == []


def _rounds(run: Path, key: str, values: dict[float, list[float]], **extra: Any) -> None:
    """rounds.jsonl of ``run``: one line per round of each tier, items/s as given."""
    lines = [
        {key: k, "round": n, "items_per_s": v, "latency_p50_s": 1.0 + 0.001 * n, **extra}
        for k, vs in values.items()
        for n, v in enumerate(vs, 1)
    ]
    (run / "rounds.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), "utf-8")


def _tier(batch: int, items_per_s: float) -> dict[str, Any]:
    """A tier with few columns: the terminal table stays narrow enough to read in a test."""
    return {
        "batch_size": batch,
        "concurrency": batch,
        "rounds": 3,
        "items": 3 * batch,
        "items_per_s": items_per_s,
        "errors": 0,
        "verdict": "pass",
    }


def _ladders_with_rounds(
    root: Path, a: dict[float, list[float]], b: dict[float, list[float]]
) -> None:
    for name, rounds in (("a", a), ("b", b)):
        rows = [_tier(int(k), sum(v) / len(v)) for k, v in rounds.items()]
        _rounds(write_run(root, name, "ladder", rows), "batch_size", rounds)


def test_a_delta_is_claimed_only_when_the_rounds_say_it_is_significant(cli, isolated: Path) -> None:
    _ladders_with_rounds(
        isolated,
        {1: [10.0, 11.0, 12.0], 2: [20.0, 21.0, 19.0], 4: [30.0, 40.0, 20.0]},
        {1: [13.0, 14.0, 15.0], 2: [22.0, 23.0, 21.0], 4: [36.0, 28.0, 44.0]},
    )
    result = cli("report", "runs/a", "runs/b", "--json", "--html")
    assert result.code == 0, result.err
    rows = {r["key"]: r["deltas"]["items_per_s"] for r in result.json["rows"]}
    one = rows[1]  # +27 %: t(0.975, 4) · √(2/3) = 2.27 < 3
    assert one["significant"] is True and one["better"] is True and result.json["level"] == 0.95
    assert one["ci_low"] == pytest.approx(3 - 2.776445 * math.sqrt(2 / 3), abs=1e-5)
    assert one["ci_high"] == pytest.approx(3 + 2.776445 * math.sqrt(2 / 3), abs=1e-5)
    assert one["change_low"] == pytest.approx(one["ci_low"] / 11)
    assert one["cv"] == pytest.approx(1 / 11) and one["rounds_b"]["n"] == 3
    two = rows[2]  # +10 %, inside the noise of three rounds each
    assert two["significant"] is False and two["better"] is None  # not coloured either
    assert rows[4]["significant"] is False and rows[4]["cv"] == pytest.approx(10 / 30)
    assert "11 → 14 (+27%, significant)" in result.err and "significant at 95 %" in result.err
    assert "20 → 22 (+10%, not significant)" in result.err
    # a CV over 10 % is called out, per run, with the tier it is at
    assert result.json["noisy"] == [
        "noisy: items_per_s CV 33 % at batch 4 in A — add rounds ([ladder] rounds)",
        "noisy: items_per_s CV 22 % at batch 4 in B — add rounds ([ladder] rounds)",
    ]
    assert "warning: noisy: items_per_s CV 33 % at batch 4 in A — add rounds" in result.err
    page = Page((isolated / "runs/b/compare-a.html").read_text("utf-8"))
    header = page.rows["comparison"][0]
    cells = [r[header.index("items_per_s Δ")] for r in page.body_rows("comparison")]
    assert cells[:2] == ["+27%, significant at 95 %", "+10%, not significant"]


def test_a_change_under_five_percent_is_never_claimed_however_tight_the_rounds() -> None:
    """Rounds of one run vary less than two runs do: 2 % apart with a tight interval is the
    machine's load between the runs."""
    a, b = spread([100.0, 100.1, 99.9]), spread([102.0, 102.1, 101.9])
    assert a is not None and b is not None
    close = Delta(100.0, 102.0, True, a, b, compare(a, b))
    assert close.test is not None and close.test.significant is True  # the interval: no zero
    assert close.significant is False and close.better is None
    assert close.to_json()["ci_excludes_zero"] is True and close.to_json()["significant"] is False
    assert delta_text(close) == "+2%"  # nothing claimed, nothing to deny
    c = spread([110.0, 110.1, 109.9])
    assert c is not None
    far = Delta(100.0, 110.0, True, a, c, compare(a, c))
    assert far.significant is True and far.better is True
    assert delta_text(far) == "+10%, significant at 95 %"
    down = Delta(100.0, 0.0, False, a, spread([0.0, 0.0]), compare(a, spread([0.0, 0.0]) or a))
    assert down.significant is True and down.better is True  # a latency to zero: -100 %


def test_the_confidence_level_comes_from_the_config(cli, isolated: Path) -> None:
    _ladders_with_rounds(isolated, {1: [10.0, 11.0, 12.0]}, {1: [13.0, 14.0, 15.0]})
    (isolated / "calibrate.toml").write_text("[confidence]\nlevel = 0.99\n", "utf-8")
    result = cli("report", "runs/a", "runs/b", "--json")
    one = result.json["rows"][0]["deltas"]["items_per_s"]
    # t(0.995, 4) = 4.604: 4.604 · 0.816 = 3.76 > 3, not significant at 99 %
    assert one["significant"] is False and one["level"] == 0.99
    assert "(+27%, not significant)" in result.err


@pytest.mark.parametrize(
    ("b_rounds", "said"),
    [
        ([14.0], "one round"),  # one side without a spread
        (None, "no rounds.jsonl"),  # an older run without per-round lines
    ],
)
def test_without_rounds_on_both_sides_a_delta_is_not_tested(
    cli, isolated: Path, b_rounds: list[float] | None, said: str
) -> None:
    _ladders_with_rounds(isolated, {1: [10.0, 11.0, 12.0]}, {1: b_rounds or [14.0]})
    if b_rounds is None:
        (isolated / "runs/b/rounds.jsonl").unlink()
    result = cli("report", "runs/a", "runs/b", "--json")
    assert result.code == 0, result.err
    one = result.json["rows"][0]["deltas"]["items_per_s"]
    assert one["significant"] is None and one["ci_low"] is None, said
    assert one["better"] is None  # no interval: no direction claimed (SPEC §13)
    assert "11 → 14 (+27%, not tested)" in result.err and "significant" not in result.err


def test_damaged_or_repeated_round_lines_are_read_tolerantly(cli, isolated: Path) -> None:
    _ladders_with_rounds(isolated, {1: [10.0, 11.0, 12.0]}, {1: [13.0, 14.0, 15.0]})
    path = isolated / "runs/b/rounds.jsonl"
    text = path.read_text("utf-8")
    rerun = json.dumps({"batch_size": 1, "round": 3, "items_per_s": 16.0})  # a resumed round
    path.write_text(
        text + "{torn\n" + rerun + "\n" + '{"batch_size": "x", "items_per_s": 1e308}\n'
        '{"batch_size": 1, "round": 4, "items_per_s": NaN}\n',
        "utf-8",
    )
    result = cli("report", "runs/a", "runs/b", "--json")
    assert result.code == 0, result.err
    b = result.json["rows"][0]["deltas"]["items_per_s"]["rounds_b"]
    assert b["n"] == 3 and b["mean"] == pytest.approx((13 + 14 + 16) / 3)


def test_a_rate_sweep_is_tested_over_its_repeats(cli, isolated: Path) -> None:
    for name, values in (("a", [5.0, 5.1, 4.9]), ("b", [8.0, 8.2, 7.9])):
        rows = [{**_tier(4, sum(values) / 3), "offered_rate": "inf", "gain": None}]
        run = write_run(isolated, name, "sweep", rows)
        _rounds(run, "offered_rate", {math.inf: values}, concurrency=4)
        lines = (run / "rounds.jsonl").read_text("utf-8").replace("Infinity", '"inf"')
        (run / "rounds.jsonl").write_text(lines, "utf-8")
    result = cli("report", "runs/a", "runs/b", "--json")
    assert result.code == 0, result.err
    row = result.json["rows"][0]
    assert row["key"] == "inf" and row["deltas"]["items_per_s"]["significant"] is True
    assert "significant at 95 %" in result.err


# Two real ladders of one workload differing by nothing significant (and a slower server's by
# something): tests/stages/ladder/test_compare_runs.py, on the simulated server — over HTTP the
# load of a shared machine moved by 6 % between A and B.


REPEATS = 2


def _sweep(cli: Any, root: Path, base_url: str) -> str:
    """A real sweep: concurrency 1 and 2, two repeats of ≥ 0.1 s (and 4×C requests) each, and
    never more, answers of 8 tokens."""
    open_gate(
        root,
        base_url,
        FAST + "[sweep]\nconcurrency = [1, 2]\nlevel_s = 0.1\n"
        f"repeats = {REPEATS}\nmax_repeats = {REPEATS}\n",
        "ladder",
    )
    result = cli("sweep", "--json", "--input-tokens", "20", "--output-tokens", "8")
    assert result.code == 0, result.err
    return str(result.json["run_id"])


def test_two_real_sweeps_are_compared_over_their_repeats(cli, isolated: Path) -> None:
    """End to end over HTTP: `report` of one sweep gives each level's interval over its runs,
    `report A B` tests each level's difference over both runs' repeats. Whether a slower
    server's drop is significant is tests/stages/sweep/test_compare_repeats.py's claim, on the
    simulated server: over HTTP one stalled round on a busy machine could hide it."""
    with start_mock(ttft_s=0.01, per_token_s=0.002) as mock:
        a, b = _sweep(cli, isolated, mock.base_url), _sweep(cli, isolated, mock.base_url)
    one = cli("report", a, "--json", "--no-plot")
    assert one.code == 0, one.err
    levels = {t["key"]: t["metrics"] for t in one.json["confidence"]["tiers"]}
    assert set(levels) == {1, 2} and all(m["items_per_s"]["n"] == REPEATS for m in levels.values())
    result = cli("report", a, b, "--json")
    assert result.code == 0, result.err
    assert result.json["key"] == "concurrency"
    assert [row["key"] for row in result.json["rows"]] == [1, 2]
    for row in result.json["rows"]:
        delta = row["deltas"]["items_per_s"]
        assert delta["rounds_a"]["n"] == delta["rounds_b"]["n"] == REPEATS
        assert isinstance(delta["significant"], bool), delta  # tested, whichever way it fell


def test_a_percentile_over_too_few_requests_a_round_is_never_called_significant(
    cli, isolated: Path
) -> None:
    """Two real ladders, the second against a server 30× slower to its first token. Before,
    `report A B` said 'p99 s 0.0546 → 0.0694 (+27%, significant)' where each round's p99 was
    over one request (batch 1) or two: their slowest, not a p99. Now it says how many requests
    each round had, and calls no percentile over fewer than it needs either way."""
    config = FAST + "batch_sizes = [1, 2]\n"
    with start_mock(ttft_s=0.002, per_token_s=0.0003) as fast:
        open_gate(isolated, fast.base_url, config)
        a = cli("ladder", "--json")
        port = fast.port
    with start_mock(ttft_s=0.06, per_token_s=0.0003, port=port):
        b = cli("ladder", "--json")
    assert a.code == 0 and b.code == 0, b.err
    result = cli("report", a.json["run_id"], b.json["run_id"], "--json", "--html")
    assert result.code == 0, result.err
    assert result.json["requests_per_round"] == {"a": "1–2", "b": "1–2"}
    for row in result.json["rows"]:
        for metric in ("latency_p99_s", "ttft_p99_s", "ttft_p50_s"):
            delta = row["deltas"][metric]
            needed = 2 if metric.endswith("p50_s") else 100
            assert delta["samples"] == {
                "a": row["key"],
                "b": row["key"],
                "needed": needed,
                "enough": row["key"] >= needed,
            }, (row["key"], metric)
        p99 = row["deltas"]["ttft_p99_s"]
        # never called either way (which way it moved is the machine's: beside a loaded suite
        # the fast server's slowest first token has read 40 % above the slow one's 60 ms)
        assert p99["change"] is not None and p99["significant"] is None and p99["better"] is None
        assert isinstance(row["deltas"]["items_per_s"]["significant"], bool)  # still tested
    assert isinstance(row["deltas"]["ttft_p50_s"]["significant"], bool)  # batch 2: a p50's two
    lines = result.err.splitlines()
    assert "requests a round: A 1–2, B 1–2" in lines
    assert "too few requests a round for a p99 (needs 100)" in lines
    assert ", too few)" in result.err and "p99 s" in result.err
    page = (isolated / "runs" / b.json["run_id"] / f"compare-{a.json['run_id']}.html").read_text(
        "utf-8"
    )
    assert "too few requests (1 a round in A, 1 in B; a p99 needs 100)" in page
    assert "Requests a round: A 1–2, B 1–2" in page


def test_a_percentile_over_enough_requests_a_round_is_tested(cli, isolated: Path) -> None:
    """Rounds of 100 requests: their p99 is one, and its difference is tested as any metric."""
    for name, p99 in (("a", [1.0, 1.1, 0.9]), ("b", [2.0, 2.1, 1.9])):
        run = write_run(isolated, name, "ladder", [{**_tier(1, 10.0), "latency_p99_s": p99[0]}])
        _rounds(run, "batch_size", {1: [10.0, 10.0, 10.0]})
        path = run / "rounds.jsonl"
        lines = [json.loads(line) for line in path.read_text("utf-8").splitlines()]
        for line, value in zip(lines, p99, strict=True):
            line.update(items=100, latency_p99_s=value)
        path.write_text("".join(json.dumps(x) + "\n" for x in lines), "utf-8")
    result = cli("report", "runs/a", "runs/b", "--json")
    delta = result.json["rows"][0]["deltas"]["latency_p99_s"]
    assert delta["samples"] == {"a": 100, "b": 100, "needed": 100, "enough": True}
    assert delta["significant"] is True and delta["better"] is False
