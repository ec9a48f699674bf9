"""``calibrate report RUN --html``: one self-contained file with the tiers, plots and verdict."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.mockserver import start_mock
from tests.report_helpers import Page, ladder_row, sweep_row, write_run
from tests.tier_helpers import FAST, jsonl, open_gate, run_dir

XSS = "<script>alert('pwned')</script>"


def _external_refs(page: Page, html: str) -> list[str]:
    """Every attribute or CSS url() that would fetch something from outside the file."""
    refs = [
        v
        for _, attrs in page.tags
        for k, v in attrs.items()
        if k in ("src", "href", "xlink:href", "srcset", "data", "poster", "action")
    ]
    refs += re.findall(r"url\(([^)]*)\)", html) + re.findall(r"@import\s+[^;]+", html)
    return [r for r in refs if re.match(r"\s*['\"]?\s*(https?:)?//", r) or "@import" in r]


def test_values_are_escaped_not_run(cli, isolated: Path) -> None:
    rows = [ladder_row(1, 4.0), ladder_row(2, 7.0, verdict=XSS)]
    write_run(
        isolated,
        "r1",
        "ladder",
        rows,
        manifest={
            "config": {"target": {"model": XSS, "base_url": "http://x/v1"}},
            "command": ["calibrate", "ladder", "--model", XSS],
        },
        summary={
            "stopped_by": XSS,
            "last_passing": {"batch_size": 1},
            "workload": {"source": XSS},
            "notes": [XSS],
        },
        incidents={"2-1-1.json": {"error": {"kind": "oom", "message": XSS, "status": 500}}},
    )
    result = cli("report", "runs/r1", "--html", "--no-plot")
    assert result.code == 0, result.err
    html = (isolated / "runs/r1/report.html").read_text("utf-8")
    page = Page(html)
    assert page.count("script") == 0  # no element was injected...
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert page.text.count(XSS) >= 5  # ...the text is shown as text instead
    assert page.body_rows("tiers")[1][-1] == XSS
    assert page.body_rows("incident-list")[0][2] == XSS


def test_new_columns_are_shown_and_missing_ones_do_not_crash(cli, isolated: Path) -> None:
    """A rate sweep from a newer calibrate: percentiles, offered/achieved rate, renamed columns."""
    rows = [
        sweep_row(
            0,
            r * 0.98,
            offered_rate=r,
            achieved_rate=r * 0.98,
            saturated=False,
            ttft_p50_s=0.05,
            ttft_p99_s=0.08 * r,
            tpot_p50_s=0.004,
            itl_p99_s=0.01,
            e2e_p99_s=0.3 * r,
            per_device=[{"device": "0", "used_mib": 1}],
        )
        for r in (1, 2, 4)
    ]
    for number, row in enumerate(rows):
        row["concurrency"] = 2 + number  # in flight at most; the rows are keyed by offered rate
        del row["per_item_p50_s"]  # renamed in newer runs
    rows[-1]["saturated"] = True
    write_run(
        isolated,
        "rate",
        "sweep",
        rows,
        summary={
            "stopped_by": "saturated",
            "saturated": "saturated at 4 req/s",
            "knee": {"offered_rate": 2},
        },
    )
    result = cli("report", "runs/rate", "--html", "--no-plot")
    assert result.code == 0, result.err
    page = Page((isolated / "runs/rate/report.html").read_text("utf-8"))
    header = page.rows["tiers"][0]
    for column in (
        "ttft_p99_s",
        "tpot_p50_s",
        "itl_p99_s",
        "e2e_p99_s",
        "offered_rate",
        "achieved_rate",
        "saturated",
    ):
        assert column in header
    body = page.body_rows("tiers")
    assert len(body) == 3 and body[0][header.index("p50 s")] == "—"
    assert body[2][header.index("ttft_p99_s")] == "0.32"
    assert "saturated at 4 req/s" in page.id_text["notes"]
    assert "offered rate 2" in page.id_text["verdict-details"]


def test_the_svg_plots_need_no_matplotlib(
    cli, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    write_run(
        isolated,
        "r1",
        "ladder",
        [ladder_row(1, 4.0), ladder_row(2, 8.0), ladder_row(4, 15.0)],
        records=[
            {
                "batch_size": 2,
                "round": 1,
                "ts": "2026-01-01T00:00:01.000Z",
                "elapsed_s": 0.5,
                "ok": True,
            }
        ],
    )
    result = cli("report", "runs/r1", "--html", "--timeline", "2")
    assert result.code == 0, result.err
    assert "matplotlib is not installed" in result.err and not list(
        (isolated / "runs/r1").glob("*.png")
    )
    page = Page((isolated / "runs/r1/report.html").read_text("utf-8"))
    titles = [a.get("aria-label") for t, a in page.tags if t == "svg"]
    assert titles[:4] == [
        "latency vs throughput",
        "throughput",
        "peak VRAM per tier",
        "memory pressure per tier",
    ]
    throughput = [a for t, a in page.tags if t == "g" and a.get("data-label") == "items_per_s"]
    assert throughput and page.count("circle") >= 3 + 3  # a marker per tier per plotted line


def test_html_path_is_chosen_and_an_unwritable_one_is_exit_2(cli, isolated: Path) -> None:
    write_run(isolated, "r1", "ladder", [ladder_row(1, 4.0)])
    mine = cli("report", "r1", "--html", "mine.html", "--no-plot")  # a run id works as RUN
    assert mine.code == 0 and (isolated / "mine.html").exists()
    (isolated / "blocker").write_text("a file, not a folder", "utf-8")
    bad = cli("report", "r1", "--html", "blocker/report.html", "--no-plot")
    assert bad.code == 2 and "cannot write --html blocker/report.html" in bad.err
    assert "Traceback" not in bad.err


# --- the answer first: verdict and setting, plots, table, configuration last and folded ---

SWEEPS = FAST + "[sweep]\nlevel_s = 0.6\nrepeats = 1\n"


def _order(html: str, *ids: str) -> list[int]:
    """Where each section starts in the file (a missing one fails the test)."""
    return [html.index(f'<section id="{i}">') for i in ids]


def _inside_details(html: str, details_id: str, inner: str) -> bool:
    start = html.index(f'<details id="{details_id}">')
    end = html.index("</details>", start)
    return start < html.index(inner) < end


def _chart(html: str, title: str) -> str:
    start = html.index(f'aria-label="{title}"')
    return html[start : html.index("</svg>", start)]


def _tile(page: Page, name: str) -> str:
    return page.id_text[f"setting-{name}"]


def _check_layout(html: str) -> Page:
    """What every report has: the verdict and setting, then plots, the table, the
    configuration last inside <details>; no Python None anywhere."""
    page = Page(html)
    verdict, plots, tiers, config = _order(html, "verdict", "plots", "tier-table", "configuration")
    assert verdict < plots < tiers < config
    assert html.index('id="setting"') < plots  # the setting is part of the first section
    assert config == max(int(m.start()) for m in re.finditer(r"<section id=", html))
    assert _inside_details(html, "config-details", 'id="manifest"')
    assert _inside_details(html, "config-details", "<h3>Workload</h3>")
    assert _inside_details(html, "tier-columns", '<table id="tiers"')
    assert not _inside_details(html, "tier-columns", '<table id="tier-summary"')
    assert not re.search(r"\bNone\b", html), re.findall(r".{40}\bNone\b.{20}", html)
    assert len(page.rows["tier-summary"][0]) <= 14 < len(page.rows["tiers"][0])
    return page


def test_a_ladder_report_leads_with_the_setting_and_crosses_out_the_failed_tier(
    cli, isolated: Path
) -> None:
    """A real ladder's report: its tiers, verdict, incidents and timeline; then the answer
    first — the setting, the failed tier crossed out — for it and for a context ladder. (The
    first part was a test of its own that ran the same ladder again.)"""
    with start_mock(ttft_s=0.002, per_token_s=0.004, slots=4, oom_at=6) as mock:
        open_gate(isolated, mock.base_url)
        ladder = cli("ladder", "--json")
        context = cli("ladder", "--axis", "context", "--json")
    assert ladder.code == 0 and context.code == 0, ladder.err + context.err
    run = run_dir(isolated, ladder.json["run_id"])
    result = cli("report", str(run), "--html", "--timeline", "8", "--json", "--no-plot")
    assert result.code == 0, result.err
    html_path = run / "report.html"
    assert result.json["html"] == str(html_path) and f"HTML report: {html_path}" in result.err
    html = html_path.read_text("utf-8")
    page = Page(html)
    rows = page.body_rows("tiers")
    verdict = page.rows["tiers"][0].index("verdict")
    assert [r[0] for r in rows] == ["1", "2", "4", "8"]  # batch column, as in the terminal
    assert [r[verdict] for r in rows] == ["pass", "pass", "pass", "fail"]
    assert page.id_text["verdict-word"] == "passed"
    details = page.id_text["verdict-details"]
    # the setting the run recorded (4, or 2 when a loaded machine made 4 read within noise of it)
    setting = ladder.json["last_passing"]["batch_size"]
    assert setting in (2, 4), ladder.err
    assert "stopped by failure" in details
    assert f"last passing batch size {setting}, concurrency {setting}" in details
    incidents = page.body_rows("incident-list")
    assert len(incidents) == 2 and all(r[1] == "oom" and r[3] == "500" for r in incidents)
    assert "CUDA out of memory" in incidents[0][2]
    tier8 = [r for r in jsonl(run / "records.jsonl") if r["batch_size"] == 8]
    assert page.count("rect", "bar") == len(tier8) == 8
    assert page.count("rect", "failed") == 2
    assert page.count("svg") >= 5  # four plots and the timeline, with or without matplotlib
    assert "model internlm-s2" in page.id_text["manifest"]
    assert _external_refs(page, html) == []
    assert page.count("script") == 0 and page.count("link") == 0
    # the answer first (the report again, without the timeline)
    assert cli("report", str(run), "--html", "--no-plot").code == 0
    html = (run / "report.html").read_text("utf-8")
    page = _check_layout(html)
    tiers = {t["batch_size"]: t for t in jsonl(run / "tiers.jsonl")}
    chosen = tiers[setting]  # batch 4, or 2 (above)
    assert tiers[8]["verdict"] == "fail" and tiers[4]["verdict"] == "pass"
    assert page.id_text["verdict-word"] == "passed"
    assert _tile(page, "at").startswith(f"batch size {setting} concurrency {setting}")
    assert f"{chosen['items_per_s']:.4g} items/s" in _tile(page, "throughput")
    assert f"p50 {chosen['latency_p50_s']:.3g} s" in _tile(page, "latency")
    assert f"p99 {chosen['latency_p99_s']:.3g} s" in _tile(page, "latency")
    free = chosen["vram_total_mib"] - chosen["peak_vram_mib"]
    assert _tile(page, "headroom").startswith(f"{free:.0f} MiB free")
    assert "setting-energy" not in page.id_text  # the mock measures no energy: no tile
    # batch 8 failed: a red cross on every plot, never a plain dot; the setting is ringed
    throughput = _chart(html, "throughput")
    assert re.search(r'class="failed-point".*?items_per_s: 8, [\d.]+ \(failed\)', throughput)
    assert not re.search(r"<circle [^>]*><title>items_per_s: 8,", throughput)  # no plain dot
    assert f"items_per_s: {setting}, " in throughput and 'class="chosen-point"' in throughput
    assert _chart(html, "latency vs throughput").count('class="failed-point"') >= 2
    assert "✕ failed tier" in throughput

    run = run_dir(isolated, context.json["run_id"])
    assert cli("report", str(run), "--html", "--no-plot").code == 0
    page = _check_layout((run / "report.html").read_text("utf-8"))
    longest = max(
        t["input_tokens_max"] for t in jsonl(run / "tiers.jsonl") if t["verdict"] == "pass"
    )
    assert _tile(page, "at").startswith(f"{longest:g} input tokens the longest input")


def test_sweep_reports_lead_with_the_level_each_mode_recommends(cli, isolated: Path) -> None:
    with start_mock(ttft_s=0.01, per_token_s=0.001, slots=4) as mock:
        open_gate(isolated, mock.base_url, SWEEPS, "ladder")
        runs = {
            "concurrency": cli("sweep", "--beyond-ladder", "--json"),
            "rates": cli("sweep", "--rates", "5,20", "--arrival", "constant", "--json"),
            "auto": cli("sweep", "--auto", "--auto-steps", "1", "--json"),
        }
    for mode, result in runs.items():
        assert result.code == 0, f"{mode}: {result.err}"
        run = run_dir(isolated, result.json["run_id"])
        shown = cli("report", str(run), "--html", "--no-plot")
        assert shown.code == 0, shown.err
        page = _check_layout((run / "report.html").read_text("utf-8"))
        summary = json.loads((run / "summary.json").read_text("utf-8"))["summary"]
        levels = jsonl(run / "tiers.jsonl")
        at = _tile(page, "at")
        if mode == "concurrency":
            knee = summary["knee"]["concurrency"]
            assert at.startswith(f"concurrency {knee} batch size 4"), at
            row = next(r for r in levels if r["concurrency"] == knee)
            assert f"{row['items_per_s']:.4g} items/s" in _tile(page, "throughput")
        elif summary["recommendation"].startswith("synchronous"):  # auto: no rate kept up
            assert at.startswith("synchronous (one at a time)"), at
            row = next(r for r in levels if r["load"] == "synchronous")
            assert f"{row['items_per_s']:.4g} items/s" in _tile(page, "throughput")
        else:  # the recommendation names its rate: the tile shows the same level
            rate = summary["recommendation"].split(" req/s")[0]
            assert f"{rate} req/s offered" in at, (at, summary["recommendation"])
            row = next(r for r in levels if f"{r.get('offered_rate') or 0:.4g}" == rate)
            assert f"{row['achieved_rate']:.4g} req/s achieved" in _tile(page, "throughput")


def test_the_setting_tiles_say_what_is_known_and_nothing_else(cli, isolated: Path) -> None:
    """Hand-written runs: energy columns give an energy tile; SLOs choose by goodput; a run with
    no passing tier says so instead of showing numbers."""
    energy = {"joules_per_output_token": 0.42, "power_mean_w": 310.0}
    write_run(
        isolated,
        "energy",
        "ladder",
        [ladder_row(1, 4.0, **energy), ladder_row(2, 7.0, **energy)],
        summary={"last_passing": {"batch_size": 2, "concurrency": 2}},
    )
    slo_rows = [sweep_row(c, 2.0 * c, goodput_per_s=g) for c, g in ((1, 1.5), (2, 3.5), (4, 2.0))]
    write_run(isolated, "slo", "sweep", slo_rows, summary={"slo": "ttft_p99 <= 0.5 s"})
    failed = [ladder_row(1, 4.0, verdict="fail")]
    write_run(isolated, "none", "ladder", failed, summary={"last_passing": None}, passed=False)
    for name in ("energy", "slo", "none"):
        assert cli("report", f"runs/{name}", "--html", "--no-plot").code == 0
    page = Page((isolated / "runs/energy/report.html").read_text("utf-8"))
    assert _tile(page, "at").startswith("batch size 2")
    assert _tile(page, "energy") == "0.42 J/token 310 W mean"
    page = Page((isolated / "runs/slo/report.html").read_text("utf-8"))
    assert _tile(page, "at").startswith("concurrency 2") and "goodput" in _tile(page, "at")
    assert _tile(page, "goodput").startswith("3.5 req/s")
    html = (isolated / "runs/none/report.html").read_text("utf-8")
    page = Page(html)
    assert page.id_text["verdict-word"] == "failed"
    assert _tile(page, "at").startswith("no passing tier")
    assert "setting-throughput" not in page.id_text
    assert 'class="failed-point"' in _chart(html, "throughput")


def test_report_a_b_leads_with_both_settings_then_plots_then_the_table(cli, isolated: Path) -> None:
    rows_a = [ladder_row(1, 4.0), ladder_row(2, 8.0), ladder_row(4, 9.0, verdict="fail")]
    rows_b = [ladder_row(1, 5.0), ladder_row(2, 10.0), ladder_row(4, 18.0)]
    last = {"batch_size": 2, "concurrency": 2}
    write_run(isolated, "a", "ladder", rows_a, summary={"last_passing": last})
    write_run(isolated, "b", "ladder", rows_b, summary={"last_passing": {"batch_size": 4}})
    result = cli("report", "runs/a", "runs/b", "--html")
    assert result.code == 0, result.err
    html = (isolated / "runs/b/compare-a.html").read_text("utf-8")
    page = Page(html)
    verdict, plots, tiers, runs = _order(html, "verdict", "plots", "tier-table", "runs")
    assert verdict < plots < tiers < runs
    assert page.id_text["verdict-a"] == "passed" and page.id_text["verdict-b"] == "passed"
    assert page.id_text["setting-a-at"].startswith("batch size 2")
    assert page.id_text["setting-b-at"].startswith("batch size 4")
    assert "18 items/s" in page.id_text["setting-b-throughput"]
    assert _inside_details(html, "run-pairs", 'id="run-pair"')
    assert _inside_details(html, "comparison-columns", '<table id="comparison"')
    summary = page.rows["comparison-summary"]
    header = summary[0]
    assert len(header) < len(page.rows["comparison"][0]) and "items/s" in header
    assert summary[2][header.index("items/s")] == "8 → 10 (+25%)"
    assert summary[3][1:3] == ["fail", "pass"]
    assert 'class="failed-point"' in _chart(html, "throughput")  # A's batch 4
    assert not re.search(r"\bNone\b", html)


def test_a_run_that_did_not_pass_shows_no_setting_in_any_read_back(cli, isolated: Path) -> None:
    """An inconclusive ladder records no setting (last_passing null) and says why; an interrupted
    one keeps its partial tiers, never a setting (SPEC §4.2, §5.14). Before, the HTML of the
    inconclusive one led with 'setting: batch size 8, the last passing tier' (the table's largest
    passing tier), 'last passing: batch size 8' also in report A B, and the inconclusive reason
    was in no read-back; the interrupted one's HTML led with its partial tier as the setting."""
    rows = [ladder_row(b, v) for b, v in ((1, 8.4), (2, 13.9), (4, 15.3), (8, 16.4))]
    why = "inconclusive: the runs cannot tell whether batch 8 adds 10 % over batch 2"
    summary = {"last_passing": None, "stopped_by": "completed", "inconclusive": why}
    write_run(isolated, "noisy", "ladder", rows, summary=summary, passed=False)
    write_run(
        isolated,
        "cut",
        "ladder",
        rows[:2],
        summary={"last_passing": {"batch_size": 2, "concurrency": 2}, "stopped_by": "interrupted"},
        passed=False,
    )
    line = json.loads((isolated / "runs/cut/summary.json").read_text("utf-8"))
    (isolated / "runs/cut/summary.json").write_text(json.dumps({**line, "interrupted": True}))
    for name in ("noisy", "cut"):
        result = cli("report", f"runs/{name}", "--html", "--no-plot", "--json")
        assert result.code == 0, result.err
        page = Page((isolated / f"runs/{name}/report.html").read_text("utf-8"))
        assert page.id_text["verdict-word"].startswith("failed")
        assert _tile(page, "at").startswith("no setting"), _tile(page, "at")
        assert "setting-throughput" not in page.id_text
        said = why if name == "noisy" else "interrupted: recorded as not passed"
        assert said in page.id_text.get("notes", "") or page.id_text["verdict-word"] == (
            "failed (interrupted)"
        )
        assert said in result.err and any(said in n for n in result.json["notes"])
    page = Page((isolated / "runs/noisy/report.html").read_text("utf-8"))
    assert "last passing none" in page.id_text["verdict-details"]
    both = cli("report", "runs/cut", "runs/noisy", "--json", "--no-plot")
    assert both.code == 0, both.err
    assert both.json["b"]["last_passing"] == "none"
    assert both.json["a"]["last_passing"] == "batch size 2, concurrency 2"  # what it recorded
